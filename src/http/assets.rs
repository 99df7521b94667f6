//! posthog-js's own files at `/static/`: the snippet's `array.js` and the extensions
//! the library loads later (surveys, web vitals, exception autocapture, dead clicks,
//! the recorder), copied by the operator from the posthog-js package's `dist/`.
//!
//! A request names a file under the static directory and nothing else: each path
//! segment is checked (no `..`, no hidden names, a small alphabet), the resolved file
//! must still lie inside the directory once symlinks are followed, and it must be a
//! regular file of bounded size. Answers carry an ETag and Last-Modified, so a
//! browser's revalidation costs a 304, and cache headers like PostHog's CDN.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use hyper::header::{
    HeaderValue, CACHE_CONTROL, ETAG, IF_MODIFIED_SINCE, IF_NONE_MATCH, LAST_MODIFIED,
};
use hyper::{HeaderMap, Response, StatusCode};

use super::error::ApiError;
use super::response::{self, Body};

/// posthog-js's files are at most a few hundred KB (the recorder is the largest);
/// anything far past that is not one of them and is not read into memory.
const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;
/// Paths deeper than `<version>/<dir>/<file>` are not posthog-js's.
const MAX_SEGMENTS: usize = 4;
/// Longer paths are not posthog-js's either.
const MAX_PATH_BYTES: usize = 256;
/// `/static/<file>`: the file behind the name changes when the operator upgrades, and
/// posthog-js adds `?v=<version>` to bust caches, so an hour of caching is safe.
const CACHE_UNVERSIONED: &str = "public, max-age=3600";
/// `/static/<version>/<file>` served from that version's own directory never changes.
const CACHE_VERSIONED: &str = "public, max-age=31536000, immutable";
/// Sent with every file, so a browser never runs a file under a guessed type.
const NOSNIFF: &str = "nosniff";

/// Content types by extension. posthog-js's `dist/` holds JavaScript, source maps,
/// type declarations and `integrity.json`; the rest are for a toolbar or site assets.
const CONTENT_TYPES: &[(&str, &str)] = &[
    ("js", "application/javascript; charset=utf-8"),
    ("mjs", "application/javascript; charset=utf-8"),
    ("cjs", "application/javascript; charset=utf-8"),
    ("map", "application/json; charset=utf-8"),
    ("json", "application/json; charset=utf-8"),
    ("css", "text/css; charset=utf-8"),
    ("wasm", "application/wasm"),
    ("ts", "text/plain; charset=utf-8"),
    ("txt", "text/plain; charset=utf-8"),
    ("svg", "image/svg+xml"),
    ("png", "image/png"),
    ("woff2", "font/woff2"),
];
/// Anything else is served as bytes, which browsers will not run.
const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

/// Said once per process: the first request for a file when there is no directory.
static HINTED: AtomicBool = AtomicBool::new(false);

pub fn content_type(path: &Path) -> &'static str {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    CONTENT_TYPES
        .iter()
        .find(|(known, _)| known.eq_ignore_ascii_case(ext))
        .map_or(DEFAULT_CONTENT_TYPE, |(_, t)| t)
}

/// The checked segments of a path under `/static/`, or None if any is not a plain
/// file or directory name.
pub fn segments(rest: &str) -> Option<Vec<&str>> {
    if rest.is_empty() || rest.len() > MAX_PATH_BYTES {
        return None;
    }
    let parts: Vec<&str> = rest.split('/').collect();
    let plain = |s: &&str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-+@".contains(&b))
    };
    (parts.len() <= MAX_SEGMENTS && parts.iter().all(plain)).then_some(parts)
}

/// Whether a first segment is a posthog-js version (`1.449.2`, `1.450.0-beta.1`), as
/// in `/static/<version>/<name>.js` that posthog-js asks for first.
fn is_version(segment: &str) -> bool {
    let core = segment.split(['-', '+']).next().unwrap_or("");
    let numbers: Vec<&str> = core.split('.').collect();
    numbers.len() == 3
        && numbers
            .iter()
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The files that may answer a request, in order, with their cache policy.
fn candidates(root: &Path, parts: &[&str]) -> Vec<(PathBuf, &'static str)> {
    let exact: PathBuf = parts.iter().collect();
    let mut out = Vec::with_capacity(2);
    if parts.len() > 1 && is_version(parts[0]) {
        out.push((root.join(&exact), CACHE_VERSIONED));
        // Without that version's directory, the top-level files answer, as PostHog's
        // own `/static/<name>.js` does for every version.
        let rest: PathBuf = parts[1..].iter().collect();
        out.push((root.join(rest), CACHE_UNVERSIONED));
    } else {
        out.push((root.join(exact), CACHE_UNVERSIONED));
    }
    out
}

/// Find the file on the blocking pool's terms: canonical, inside the root, regular,
/// small enough.
fn locate(root: &Path, parts: &[&str]) -> Option<(PathBuf, std::fs::Metadata, &'static str)> {
    let root = root.canonicalize().ok()?;
    for (path, cache) in candidates(&root, parts) {
        let Ok(real) = path.canonicalize() else {
            continue;
        };
        if !real.starts_with(&root) {
            continue;
        }
        match std::fs::metadata(&real) {
            Ok(meta) if meta.is_file() && meta.len() <= MAX_FILE_BYTES => {
                return Some((real, meta, cache))
            }
            _ => continue,
        }
    }
    None
}

/// A validator that changes whenever the file does: its size and modification time.
fn etag(meta: &std::fs::Metadata) -> String {
    let nanos = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    format!("\"{:x}-{:x}\"", meta.len(), nanos)
}

/// Whether `If-None-Match` names this ETag (weak comparison, as RFC 9110 asks for
/// GET), or is `*`.
pub fn none_match(headers: &HeaderMap, etag: &str) -> Option<bool> {
    let value = headers.get(IF_NONE_MATCH)?.to_str().ok()?;
    let bare = etag.trim_start_matches("W/");
    Some(
        value
            .split(',')
            .map(str::trim)
            .any(|candidate| candidate == "*" || candidate.trim_start_matches("W/") == bare),
    )
}

/// What the blocking pool found for a request.
enum Found {
    /// The file, its validators and cache policy, and its bytes unless the client's
    /// copy is current (then `None`: a 304 needs no read).
    File {
        path: PathBuf,
        tag: String,
        modified: Option<String>,
        cache: &'static str,
        bytes: Option<std::io::Result<Vec<u8>>>,
    },
    /// No such file; whether the directory itself exists.
    Missing { root_exists: bool },
}

fn find(root: &Path, parts: &[&str], headers: &HeaderMap) -> Found {
    let Some((path, meta, cache)) = locate(root, parts) else {
        return Found::Missing {
            root_exists: root.is_dir(),
        };
    };
    let tag = etag(&meta);
    let modified = meta.modified().ok().and_then(last_modified);
    let fresh = match none_match(headers, &tag) {
        Some(matched) => matched,
        None => match (&modified, headers.get(IF_MODIFIED_SINCE)) {
            (Some(m), Some(since)) => since.as_bytes() == m.as_bytes(),
            _ => false,
        },
    };
    let bytes = (!fresh).then(|| std::fs::read(&path));
    Found::File {
        path,
        tag,
        modified,
        cache,
        bytes,
    }
}

pub async fn serve(
    dir: &Path,
    named: bool,
    rest: &str,
    headers: &HeaderMap,
) -> Result<Response<Body>, ApiError> {
    let parts: Vec<String> = segments(rest)
        .ok_or(ApiError::Missing("static file"))?
        .into_iter()
        .map(str::to_owned)
        .collect();
    let (root, conditions) = (dir.to_path_buf(), headers.clone());
    let found = tokio::task::spawn_blocking(move || {
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        find(&root, &parts, &conditions)
    })
    .await
    .map_err(|_| ApiError::Internal)?;
    let (path, tag, modified, cache, bytes) = match found {
        Found::File {
            path,
            tag,
            modified,
            cache,
            bytes,
        } => (path, tag, modified, cache, bytes),
        Found::Missing { root_exists } => {
            if !root_exists && !named && !HINTED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "a client asked for /static/{rest}, but there is no {}: copy posthog-js's \
                     dist/ there to serve the snippet and its extensions (see the README's \
                     tour, or docs/clients.md)",
                    dir.display()
                );
            }
            return Err(ApiError::Missing("static file"));
        }
    };
    let mut r = match bytes {
        None => response::empty(StatusCode::NOT_MODIFIED),
        Some(Ok(bytes)) => response::with_type(StatusCode::OK, content_type(&path), bytes),
        Some(Err(e)) => {
            tracing::warn!(file = %path.display(), error = %e, "static file not readable");
            return Err(ApiError::Missing("static file"));
        }
    };
    let h = r.headers_mut();
    h.insert(CACHE_CONTROL, HeaderValue::from_static(cache));
    h.insert("x-content-type-options", HeaderValue::from_static(NOSNIFF));
    if let Ok(v) = HeaderValue::from_str(&tag) {
        h.insert(ETAG, v);
    }
    if let Some(v) = modified.and_then(|m| HeaderValue::from_str(&m).ok()) {
        h.insert(LAST_MODIFIED, v);
    }
    Ok(r)
}

/// The first instant whose HTTP date would need a fifth digit of year.
const YEAR_10000: Duration = Duration::from_secs(253_402_300_800);

/// A file time as `Last-Modified`, if it has an HTTP date: the `httpdate` crate
/// panics outside 1970-9999, and such a file is still cached by its ETag.
fn last_modified(t: SystemTime) -> Option<String> {
    let since_epoch = t.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    (since_epoch < YEAR_10000).then(|| httpdate(t))
}

/// An HTTP date (IMF-fixdate), as `Last-Modified` wants it.
fn httpdate(t: SystemTime) -> String {
    httpdate::fmt_http_date(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names() {
        assert_eq!(segments("array.js"), Some(vec!["array.js"]));
        assert_eq!(
            segments("1.449.2/surveys.js"),
            Some(vec!["1.449.2", "surveys.js"])
        );
        for bad in [
            "",
            "../secret",
            "a/../b.js",
            ".env",
            "a//b.js",
            "a/",
            "%2e%2e/x",
            "a\\b",
            "a b.js",
            "a/b/c/d/e.js",
        ] {
            assert_eq!(segments(bad), None, "{bad:?}");
        }
        assert_eq!(segments(&"a".repeat(MAX_PATH_BYTES + 1)), None);
    }

    #[test]
    fn versions() {
        assert!(is_version("1.449.2"));
        assert!(is_version("1.450.0-beta.1"));
        assert!(!is_version("1.449"));
        assert!(!is_version("array.js"));
        assert!(!is_version("v1.2.3"));
    }

    #[test]
    fn types() {
        assert_eq!(
            content_type(Path::new("array.js")),
            "application/javascript; charset=utf-8"
        );
        assert_eq!(
            content_type(Path::new("array.js.map")),
            "application/json; charset=utf-8"
        );
        assert_eq!(content_type(Path::new("x.wasm")), "application/wasm");
        assert_eq!(content_type(Path::new("x.bin")), DEFAULT_CONTENT_TYPE);
        assert_eq!(content_type(Path::new("LICENSE")), DEFAULT_CONTENT_TYPE);
    }

    #[test]
    fn if_none_match() {
        let mut h = HeaderMap::new();
        assert_eq!(none_match(&h, "\"a\""), None);
        h.insert(IF_NONE_MATCH, HeaderValue::from_static("\"b\", W/\"a\""));
        assert_eq!(none_match(&h, "\"a\""), Some(true));
        assert_eq!(none_match(&h, "\"c\""), Some(false));
        h.insert(IF_NONE_MATCH, HeaderValue::from_static("*"));
        assert_eq!(none_match(&h, "\"c\""), Some(true));
    }

    #[test]
    fn http_dates() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(784_111_777);
        assert_eq!(httpdate(t), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(
            last_modified(t).as_deref(),
            Some("Sun, 06 Nov 1994 08:49:37 GMT")
        );
        let epoch = SystemTime::UNIX_EPOCH;
        let before = epoch - Duration::from_secs(1);
        assert_eq!(last_modified(before), None);
        let last = epoch + YEAR_10000 - Duration::from_secs(1);
        assert_eq!(
            last_modified(last).as_deref(),
            Some("Fri, 31 Dec 9999 23:59:59 GMT")
        );
        assert_eq!(last_modified(epoch + YEAR_10000), None);
    }

    #[test]
    fn symlinks_out_of_the_root_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("static");
        std::fs::create_dir_all(root.join("1.2.3")).unwrap();
        std::fs::write(tmp.path().join("secret.js"), "x").unwrap();
        std::fs::write(root.join("array.js"), "a").unwrap();
        std::fs::write(root.join("1.2.3/array.js"), "b").unwrap();
        std::os::unix::fs::symlink(tmp.path().join("secret.js"), root.join("leak.js")).unwrap();
        std::os::unix::fs::symlink(tmp.path(), root.join("up")).unwrap();
        assert!(locate(&root, &["leak.js"]).is_none());
        assert!(locate(&root, &["up", "secret.js"]).is_none());
        assert!(locate(&root, &["1.2.3"]).is_none(), "a directory");
        let (path, _, cache) = locate(&root, &["1.2.3", "array.js"]).unwrap();
        assert!(path.ends_with("1.2.3/array.js"));
        assert_eq!(cache, CACHE_VERSIONED);
        let (path, _, cache) = locate(&root, &["9.9.9", "array.js"]).unwrap();
        assert!(path.ends_with("static/array.js"));
        assert_eq!(cache, CACHE_UNVERSIONED);
    }
}
