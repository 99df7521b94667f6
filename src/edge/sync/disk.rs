//! Upstream's last good definitions of a synced project, kept on disk so an edge
//! restarted while upstream is down still answers flags:
//! `<db>/upstream/<project>/definitions.json` and, beside it, `etag` (the ETag exactly
//! as upstream sent it, weak form included). Each file is written whole (a temporary
//! file, fsync'd, renamed, the directory fsync'd). The ETag file is removed before the
//! body is replaced and written after: a crash in between leaves a body without an ETag,
//! which only costs one full poll, never a 304 that would confirm the wrong body.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The largest ETag kept: PostHog's are a few dozen characters.
const MAX_ETAG_BYTES: usize = 1024;

/// One project's stored answer.
pub struct Stored {
    pub body: Vec<u8>,
    pub etag: Option<String>,
    /// When it was written: when upstream last sent it.
    pub written: Option<SystemTime>,
}

/// `<db>/upstream/<project>`.
pub fn dir(db_dir: &Path, project: u64) -> PathBuf {
    db_dir.join("upstream").join(project.to_string())
}

/// The stored answer, if there is one; an unreadable file is logged and treated as
/// none (the first poll replaces it).
pub fn load(dir: &Path) -> Option<Stored> {
    let path = dir.join("definitions.json");
    let body = match fs::read(&path) {
        Ok(body) => body,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "stored flag definitions not read");
            return None;
        }
    };
    let written = fs::metadata(&path).and_then(|m| m.modified()).ok();
    let etag = fs::read_to_string(dir.join("etag"))
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty() && t.len() <= MAX_ETAG_BYTES);
    Some(Stored {
        body,
        etag,
        written,
    })
}

/// Keep `body` and `etag` as the project's last good answer.
pub fn store(dir: &Path, body: &[u8], etag: Option<&str>) -> std::io::Result<()> {
    fs::create_dir_all(dir)?;
    remove(&dir.join("etag"))?;
    sync_dir(dir)?;
    write_atomically(dir, "definitions.json", body)?;
    if let Some(etag) = etag.filter(|t| t.len() <= MAX_ETAG_BYTES) {
        write_atomically(dir, "etag", etag.as_bytes())?;
    }
    Ok(())
}

/// Replace only the ETag (a 304 that brought a new one for the same body).
pub fn store_etag(dir: &Path, etag: &str) -> std::io::Result<()> {
    if etag.len() > MAX_ETAG_BYTES || !dir.join("definitions.json").exists() {
        return Ok(());
    }
    write_atomically(dir, "etag", etag.as_bytes())
}

/// Forget the stored answer (upstream said the quota is used up: a restart must not
/// serve the old flags).
pub fn clear(dir: &Path) -> std::io::Result<()> {
    remove(&dir.join("etag"))?;
    remove(&dir.join("definitions.json"))?;
    if dir.exists() {
        sync_dir(dir)?;
    }
    Ok(())
}

fn remove(path: &Path) -> std::io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let temp = dir.join(format!(".{name}.tmp"));
    let mut file = fs::File::create(&temp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&temp, dir.join(name))?;
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_loaded_replaced_and_cleared() {
        let tmp = tempfile::tempdir().unwrap();
        let d = dir(tmp.path(), 7);
        assert!(load(&d).is_none());
        store(&d, br#"{"flags":[]}"#, Some(r#"W/"abc""#)).unwrap();
        let s = load(&d).unwrap();
        assert_eq!(s.body, br#"{"flags":[]}"#);
        assert_eq!(s.etag.as_deref(), Some(r#"W/"abc""#));
        assert!(s.written.is_some());
        // A new body without an ETag must not keep the old body's.
        store(&d, b"{}", None).unwrap();
        let s = load(&d).unwrap();
        assert_eq!((s.body.as_slice(), s.etag), (&b"{}"[..], None));
        store_etag(&d, "\"x\"").unwrap();
        assert_eq!(load(&d).unwrap().etag.as_deref(), Some("\"x\""));
        clear(&d).unwrap();
        assert!(load(&d).is_none());
        // No temporary file is left behind.
        let left: Vec<_> = fs::read_dir(&d).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
