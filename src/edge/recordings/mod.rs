//! Session recordings in edge mode: posthog-js's `/s/` requests (`$snapshot` batches,
//! up to [`MAX_BODY_BYTES`]), kept as they came in a spool of their own under
//! `<db>/upstream/recordings/` and forwarded one to one to upstream `/s/` by the
//! [`worker`]. They are not product events: the edge neither stores nor counts them
//! as events, so they take no place in the log, the event store or the outbox.
//!
//! Each request is one file, written whole and fsync'd before the client is answered
//! ([`super::durable`]): a JSON line saying how it came (project, client address,
//! query, content type and encoding), then the body as sent, so upstream decodes it
//! exactly as it would have from the browser. Names start with the arrival time, so
//! sorting them is the order to send them in. A file upstream refuses for good (400,
//! 413) is moved to `<db>/upstream/recordings-refused/` with upstream's reason.

pub mod worker;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use super::durable;

/// PostHog's capture takes recordings up to this size (`RECORDING_BODY_SIZE`).
pub const MAX_BODY_BYTES: usize = 25 * 1024 * 1024;
/// Files of the spool end so.
const SUFFIX: &str = ".rec";

/// How a recording request came, as its file's first line keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Arrival {
    pub project: u64,
    /// The client's address from the trusted-proxy chain, sent on as `X-Forwarded-For`.
    pub ip: Option<String>,
    /// The request's query (`compression=gzip-js&ver=...`), sent on as it is.
    pub query: Option<String>,
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
    /// Unix milliseconds.
    pub received_at: i64,
}

/// The spool folder, and the signal that wakes the worker when a file arrives.
#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    refused: PathBuf,
    /// Tells apart files of the same millisecond.
    counter: AtomicU64,
    pub(crate) arrived: Notify,
}

impl Spool {
    /// The spool of `<db>/upstream`.
    pub fn new(upstream_dir: &Path) -> Spool {
        let dir = upstream_dir.join("recordings");
        durable::remove_leftovers(&dir);
        Spool {
            dir,
            refused: upstream_dir.join("recordings-refused"),
            counter: AtomicU64::new(0),
            arrived: Notify::new(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Keep one request, durably (blocking: call it off the reactor), and wake the
    /// worker.
    pub fn put(&self, arrival: &Arrival, body: &[u8]) -> std::io::Result<()> {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let name = format!("{:016}-{n:010}{SUFFIX}", arrival.received_at.max(0));
        let mut head = serde_json::to_vec(arrival)?;
        head.push(b'\n');
        durable::write_whole(&self.dir, &name, &[&head, body])?;
        self.arrived.notify_one();
        Ok(())
    }

    /// The names of the files waiting, oldest first.
    pub fn waiting(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.ends_with(SUFFIX))
            .collect();
        names.sort_unstable();
        names
    }

    /// One waiting request; `None` if it is gone. A file whose first line does not
    /// read is an error (it is set aside, not sent).
    pub fn read(&self, name: &str) -> std::io::Result<Option<(Arrival, Bytes)>> {
        let bytes = match std::fs::read(self.dir.join(name)) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "no header line");
        let at = bytes.iter().position(|&b| b == b'\n').ok_or_else(bad)?;
        let arrival: Arrival = serde_json::from_slice(&bytes[..at])?;
        let body = Bytes::from(bytes).slice(at + 1..);
        Ok(Some((arrival, body)))
    }

    /// Upstream has it: forget it.
    pub fn delivered(&self, name: &str) -> std::io::Result<()> {
        durable::remove(&self.dir, name)
    }

    /// Upstream refused it for good: move it out of the way with the reason beside it.
    pub fn set_aside(&self, name: &str, reason: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.refused)?;
        durable::write_whole(
            &self.refused,
            &format!("{name}.reason"),
            &[reason.as_bytes()],
        )?;
        std::fs::rename(self.dir.join(name), self.refused.join(name))?;
        crate::support::sync_dir(&self.refused)?;
        crate::support::sync_dir(&self.dir)
    }

    /// Bytes waiting in the spool.
    pub fn bytes(&self) -> u64 {
        std::fs::read_dir(&self.dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival(at: i64) -> Arrival {
        Arrival {
            project: 1,
            ip: Some("198.51.100.4".into()),
            query: Some("compression=gzip-js&ver=1.200.0".into()),
            content_type: Some("text/plain".into()),
            content_encoding: None,
            received_at: at,
        }
    }

    #[test]
    fn kept_in_arrival_order_until_delivered_or_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::new(dir.path());
        assert!(spool.waiting().is_empty());
        spool.put(&arrival(2_000), b"second\n\0bytes").unwrap();
        spool.put(&arrival(1_000), b"first").unwrap();
        spool.put(&arrival(2_000), b"third").unwrap();
        let names = spool.waiting();
        assert_eq!(names.len(), 3);
        let bodies: Vec<Bytes> = names
            .iter()
            .map(|n| spool.read(n).unwrap().unwrap().1)
            .collect();
        assert_eq!(bodies, ["first".as_bytes(), b"second\n\0bytes", b"third"]);
        assert_eq!(spool.read(&names[0]).unwrap().unwrap().0, arrival(1_000));
        assert!(spool.bytes() > 0);
        spool.delivered(&names[0]).unwrap();
        spool.set_aside(&names[1], "400 bad").unwrap();
        assert_eq!(spool.waiting(), vec![names[2].clone()]);
        assert!(spool.read(&names[0]).unwrap().is_none());
        let reason = dir
            .path()
            .join("recordings-refused")
            .join(format!("{}.reason", names[1]));
        assert_eq!(std::fs::read_to_string(reason).unwrap(), "400 bad");
        // Reopened, the spool finds what is waiting.
        let again = Spool::new(dir.path());
        assert_eq!(again.waiting(), vec![names[2].clone()]);
        std::fs::write(again.dir().join("x.rec"), b"no header").unwrap();
        assert!(again.read("x.rec").is_err());
    }
}
