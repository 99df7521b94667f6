//! Upstream's public answers posthog-js starts from (remote config, `config.js`,
//! surveys, early access features), kept in memory and on disk under
//! `<db>/upstream/cache/` so a page served by the edge works whole while upstream is
//! down, and after an edge restart too.
//!
//! A copy younger than [`FRESH`] is served as it is; an older one is still served at
//! once while one background request fetches a new one (so a slow upstream never
//! slows a page), and it is replaced only by a 200. With no copy at all, upstream is
//! asked within [`FIRST_FETCH_DEADLINE`]; if that fails, the handler answers from the
//! edge's own files, and upstream is not asked again for that path within [`FRESH`].
//! Upstream's refusals (4xx but 429) are passed on, and kept in memory only, until
//! the next try: an unknown token should read as one.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use sha1::{Digest, Sha1};

use super::client::{Answer, Client};
use super::durable;
use super::stats::Stats;
use crate::support::clock::now_ms;

/// How long a copy is served without asking upstream again: the `max-age` PostHog and
/// the edge give these answers, so a change upstream reaches browsers within two of it.
pub const FRESH: Duration = Duration::from_secs(60);
/// How long a page's first request for a path waits on upstream before the edge's own
/// answer: it holds up posthog-js's start.
pub const FIRST_FETCH_DEADLINE: Duration = Duration::from_secs(3);
/// How long a background refresh may take: nobody waits on it.
pub const REFRESH_DEADLINE: Duration = Duration::from_secs(20);
/// The largest answer kept: a project's surveys with their questions and HTML.
pub const MAX_ANSWER_BYTES: usize = 8 * 1024 * 1024;
/// Files of the copies on disk end so.
const SUFFIX: &str = ".cached";

/// A 200 from upstream, as served again.
#[derive(Debug)]
pub struct Copy {
    pub content_type: String,
    pub body: Bytes,
    /// When upstream answered it, unix milliseconds.
    pub fetched_ms: i64,
    /// What a handler derives from the body, worked out once per copy (the `/decide`
    /// members of a remote config).
    pub derived: OnceLock<Option<String>>,
}

/// What the cache has for a path.
#[derive(Debug)]
pub enum Found {
    Copy(Arc<Copy>),
    /// Upstream refused the request (an unknown token, a bad query): its answer.
    Refused(Answer),
    /// Nothing from upstream, now or before: the edge answers by itself.
    Nothing,
}

#[derive(Default)]
struct Slot {
    copy: Option<Arc<Copy>>,
    /// The last request to upstream, unix milliseconds.
    tried_ms: i64,
    /// Upstream's last answer when it was a refusal, passed on until the next try.
    refused: Option<Answer>,
    refreshing: bool,
    /// The disk was looked at for this path since the start.
    looked_on_disk: bool,
}

pub struct Cache {
    client: Client,
    dir: PathBuf,
    stats: Stats,
    /// One slot per upstream path; held only to read or swap a slot, never across a
    /// request, so a std mutex.
    slots: Mutex<HashMap<String, Slot>>,
}

impl Cache {
    /// A cache whose copies live in `dir` (`<db>/upstream/cache`).
    pub fn new(client: Client, dir: PathBuf, stats: Stats) -> Cache {
        durable::remove_leftovers(&dir);
        Cache {
            client,
            dir,
            stats,
            slots: Mutex::default(),
        }
    }

    /// The answer for `path` (an upstream path and query), counted under `endpoint`.
    pub async fn get(self: &Arc<Self>, path: &str, endpoint: &'static str) -> Found {
        if let Some(found) = self.from_memory(path, endpoint) {
            return found;
        }
        if self.first_look(path) {
            let (dir, name) = (self.dir.clone(), file_name(path));
            let read = tokio::task::spawn_blocking(move || read_copy(&dir, &name));
            if let Ok(Some(copy)) = read.await {
                self.slot(path, |s| {
                    s.copy.get_or_insert(Arc::new(copy));
                });
                if let Some(found) = self.from_memory(path, endpoint) {
                    return found;
                }
            }
        }
        let recently = self.slot(path, |s| {
            let recent = now_ms() - s.tried_ms < FRESH.as_millis() as i64 && s.copy.is_none();
            recent.then(|| s.refused.clone())
        });
        match recently {
            Some(Some(refused)) => return Found::Refused(refused),
            Some(None) => return Found::Nothing,
            None => {}
        }
        self.fetch(path, endpoint, FIRST_FETCH_DEADLINE).await
    }

    /// The copy of `path` at hand, without waiting: a copy in memory is returned (and
    /// refreshed in the background when old); without one, the disk or upstream is
    /// asked in the background for the next caller. For answers that must not wait on
    /// upstream (`/decide`), called on the server's runtime.
    pub fn peek(self: &Arc<Self>, path: &str, endpoint: &'static str) -> Option<Arc<Copy>> {
        if tokio::runtime::Handle::try_current().is_err() {
            return self.slot(path, |s| s.copy.clone());
        }
        if let Some(Found::Copy(copy)) = self.from_memory(path, endpoint) {
            return Some(copy);
        }
        let start = self.slot(path, |s| !std::mem::replace(&mut s.refreshing, true));
        if start {
            let (cache, path) = (self.clone(), path.to_string());
            tokio::spawn(async move {
                cache.get(&path, endpoint).await;
                cache.slot(&path, |s| s.refreshing = false);
            });
        }
        None
    }

    /// The copy in memory, starting a refresh when it is old.
    fn from_memory(self: &Arc<Self>, path: &str, endpoint: &'static str) -> Option<Found> {
        let now = now_ms();
        let (copy, refresh) = self.slot(path, |s| {
            let copy = s.copy.clone()?;
            let checked = copy.fetched_ms.max(s.tried_ms);
            let refresh = now - checked >= FRESH.as_millis() as i64 && !s.refreshing;
            s.refreshing |= refresh;
            Some((copy, refresh))
        })?;
        if refresh {
            let (cache, path) = (self.clone(), path.to_string());
            tokio::spawn(async move {
                cache.fetch(&path, endpoint, REFRESH_DEADLINE).await;
                cache.slot(&path, |s| s.refreshing = false);
            });
        }
        Some(Found::Copy(copy))
    }

    fn first_look(&self, path: &str) -> bool {
        self.slot(path, |s| !std::mem::replace(&mut s.looked_on_disk, true))
    }

    fn slot<T>(&self, path: &str, f: impl FnOnce(&mut Slot) -> T) -> T {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        f(slots.entry(path.to_string()).or_default())
    }

    /// Ask upstream; keep a 200 in memory and on disk.
    async fn fetch(&self, path: &str, endpoint: &'static str, deadline: Duration) -> Found {
        let request = match Request::get(path).body(Full::new(Bytes::new())) {
            Ok(r) => r,
            Err(_) => return Found::Nothing,
        };
        let result = self.client.send(request, deadline, MAX_ANSWER_BYTES).await;
        let now = now_ms();
        self.slot(path, |s| s.tried_ms = now);
        let answer = match result {
            Ok(answer) => answer,
            Err(e) => {
                self.stats.answered(endpoint, e.label());
                tracing::warn!(path, error = %e, "upstream not reached: serving the kept copy or the edge's own");
                return Found::Nothing;
            }
        };
        self.stats.answered(endpoint, answer.status.as_str());
        let status = answer.status.as_u16();
        if status == 200 {
            let copy = Arc::new(Copy {
                content_type: answer
                    .header("content-type")
                    .unwrap_or("application/json")
                    .to_string(),
                body: answer.body,
                fetched_ms: now,
                derived: OnceLock::new(),
            });
            self.slot(path, |s| {
                s.copy = Some(copy.clone());
                s.refused = None;
            });
            self.save(path, &copy).await;
            return Found::Copy(copy);
        }
        if (400..500).contains(&status) && status != 429 {
            self.slot(path, |s| s.refused = Some(answer.clone()));
            return Found::Refused(answer);
        }
        tracing::warn!(
            path,
            status,
            "upstream failed: serving the kept copy or the edge's own"
        );
        Found::Nothing
    }

    async fn save(&self, path: &str, copy: &Copy) {
        let header = serde_json::json!({
            "path": path,
            "content_type": copy.content_type,
            "fetched_at": copy.fetched_ms,
        });
        let mut head = header.to_string().into_bytes();
        head.push(b'\n');
        let (dir, name, body) = (self.dir.clone(), file_name(path), copy.body.clone());
        let written =
            tokio::task::spawn_blocking(move || durable::write_whole(&dir, &name, &[&head, &body]))
                .await;
        if !matches!(written, Ok(Ok(()))) {
            tracing::warn!(
                path,
                "upstream answer not kept on disk: it is served from memory only"
            );
        }
    }
}

/// The file of a path's copy: a hash, as a path holds `/`, `?` and a token.
fn file_name(path: &str) -> String {
    format!(
        "{}{SUFFIX}",
        crate::support::hex(&Sha1::digest(path.as_bytes()))
    )
}

/// A copy kept on disk: a JSON line of what it is, then the body.
fn read_copy(dir: &std::path::Path, name: &str) -> Option<Copy> {
    let bytes = std::fs::read(dir.join(name)).ok()?;
    let at = bytes.iter().position(|&b| b == b'\n')?;
    let header: serde_json::Value = serde_json::from_slice(&bytes[..at]).ok()?;
    Some(Copy {
        content_type: header.get("content_type")?.as_str()?.to_string(),
        fetched_ms: header.get("fetched_at")?.as_i64()?,
        body: Bytes::copy_from_slice(&bytes[at + 1..]),
        derived: OnceLock::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_round_trip_through_their_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = "/array/phc_x/config";
        let name = file_name(path);
        assert_eq!(name.len(), 40 + SUFFIX.len());
        assert_ne!(name, file_name("/array/phc_y/config"));
        let head =
            br#"{"path":"/array/phc_x/config","content_type":"application/json","fetched_at":5}"#;
        durable::write_whole(dir.path(), &name, &[head, b"\n", b"{\"a\":\n1}"]).unwrap();
        let copy = read_copy(dir.path(), &name).unwrap();
        assert_eq!(copy.content_type, "application/json");
        assert_eq!(copy.fetched_ms, 5);
        assert_eq!(&copy.body[..], b"{\"a\":\n1}");
        std::fs::write(dir.path().join("torn"), b"{\"path\":").unwrap();
        assert!(read_copy(dir.path(), "torn").is_none());
    }
}
