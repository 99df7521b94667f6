//! The write-ahead log: accepted events become durable here before any 2xx is sent.
//!
//! One writer thread owns every append. Requests hand it their encoded records over a
//! bounded channel and wait; the writer takes everything that has queued up, writes it
//! to the log's segment file ([`crate::log`]) as a few entries, and has the whole group
//! synced with one `fdatasync`. Under load the groups grow, so one sync is shared by
//! many requests (group commit). Dedicated threads keep the blocking calls off the
//! reactor.
//!
//! Group commits are pipelined: while a group's sync runs on a sync thread
//! ([`super::syncer`]), the writer writes the next group and starts its sync on
//! another, up to [`SYNC_FILES`] groups in flight. A group is answered only once its
//! own sync and every earlier group's succeeded, so answers and the durable end the
//! compactor reads up to ([`Appender::synced`]) go in order. A failed sync fails its
//! group and every later one in flight (their pages follow the lost ones in the
//! segment); the writer then waits for every sync in flight to finish before it gives
//! up the segment ([`Appender::abandon`]) and pauses. A group that would roll to a new
//! segment also waits for the syncs in flight, so a roll syncs and publishes exactly
//! as it does alone.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::appender::SYNC_FILES;
use super::commits::Commits;
use super::ledger::Ledger;
use super::syncer::Syncers;
use super::{Appender, Preparer};

/// Requests waiting for the writer. A full queue means the disk cannot keep up: new
/// requests get 503 with Retry-After rather than an ever-growing backlog in memory.
pub(super) const QUEUE_CAPACITY: usize = 8192;
/// A group stops growing here, so one fsync never waits on an unbounded amount of data.
pub(super) const MAX_GROUP_BYTES: usize = 64 * 1024 * 1024;
/// A log entry holds at most this many records, and is closed once it reaches this
/// many bytes (a group may span several entries): the compactor reads whole entries,
/// so this bounds what one of its steps holds beyond its chunk size.
pub(super) const ENTRY_MAX_RECORDS: usize = 512;
pub(super) const ENTRY_MAX_BYTES: usize = 64 * 1024;
/// After a failed write the writer answers groups with [`Error::Storage`] without
/// touching the disk for a while, then tries again: a disk that keeps failing is tried
/// a few times a second, not once per request (each try starts a segment and logs an
/// error). The pause doubles with each failure in a row, up to the maximum.
pub(super) const FIRST_BACKOFF: Duration = Duration::from_millis(if cfg!(test) { 300 } else { 50 });
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Why an append was not acknowledged. Nothing here was made durable by this call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The queue is full: retry later.
    Overloaded,
    /// The storage failed (disk full, I/O error); retry later.
    Storage,
    /// The log is shutting down.
    Closed,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Error::Overloaded => "the write-ahead log is overloaded",
            Error::Storage => "the write-ahead log cannot write to disk",
            Error::Closed => "the write-ahead log is closed",
        })
    }
}

impl std::error::Error for Error {}

pub(super) enum Job {
    Append {
        records: Vec<Vec<u8>>,
        reply: oneshot::Sender<Result<(), Error>>,
    },
    /// After a failure: check whether the disk takes writes again.
    Probe,
    /// Write what is queued ahead of this, then stop.
    Stop,
}

/// Counters the writer keeps for metrics and readiness.
#[derive(Debug, Default)]
pub struct Stats {
    pub appended_records: AtomicU64,
    pub groups: AtomicU64,
    /// The latest flush's duration in microseconds (all of them go to the histogram).
    pub last_flush_micros: AtomicU64,
    /// False after a failed write until the next one succeeds.
    pub writable: AtomicBool,
}

/// The handle requests append through.
#[derive(Clone)]
pub struct Wal {
    tx: mpsc::Sender<Job>,
    stats: Arc<Stats>,
}

/// The writer thread.
pub struct Writer {
    thread: JoinHandle<()>,
    tx: mpsc::Sender<Job>,
    preparer: Preparer,
    shared: Arc<super::Shared>,
}

impl Writer {
    /// Write everything queued so far (or refuse it, in the pause after a failed
    /// write), then stop the thread and wait for it. Appends that come later fail with
    /// [`Error::Closed`].
    pub fn stop(self) {
        // A full queue is drained by the writer, so this waits at most one group.
        if self.tx.blocking_send(Job::Stop).is_ok() && self.thread.join().is_err() {
            tracing::error!("write-ahead log writer panicked");
        }
        self.preparer.stop();
        self.shared.close();
    }
}

/// Told the duration of every fsync, for a latency histogram.
pub type FlushObserver = Box<dyn Fn(std::time::Duration) + Send>;

impl Wal {
    /// Start the writer on an open log (see [`super::open`]).
    pub fn start(
        appender: Appender,
        preparer: Preparer,
        on_flush: FlushObserver,
    ) -> std::io::Result<(Wal, Writer)> {
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let stats = Arc::new(Stats {
            writable: AtomicBool::new(true),
            ..Stats::default()
        });
        let shared = appender.shared().clone();
        let ledger = Arc::new(Mutex::new(Ledger::new(
            shared.clone(),
            stats.clone(),
            on_flush,
        )));
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let syncers = Syncers::start(SYNC_FILES, &shared, &ledger, done_tx)?;
        // Only to wait for a request or a finished sync, whichever comes first.
        let waiter = tokio::runtime::Builder::new_current_thread().build()?;
        let writer_stats = stats.clone();
        let thread = std::thread::Builder::new()
            .name("wal-writer".into())
            .spawn(move || {
                Commits::new(appender, syncers, ledger, done_rx, waiter, writer_stats).run(rx);
            })?;
        let writer = Writer {
            thread,
            tx: tx.clone(),
            preparer,
            shared,
        };
        Ok((Wal { tx, stats }, writer))
    }

    /// Append records in order; resolves once they are fsync'd.
    pub async fn append(&self, records: Vec<Vec<u8>>) -> Result<(), Error> {
        if records.is_empty() {
            return Ok(());
        }
        let (reply, done) = oneshot::channel();
        self.tx
            .try_send(Job::Append { records, reply })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => Error::Overloaded,
                mpsc::error::TrySendError::Closed(_) => Error::Closed,
            })?;
        done.await.map_err(|_| Error::Closed)?
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// After a failed write, ask the writer to check the disk once its pause is over,
    /// so the log is seen writable again without waiting for an event to try it.
    /// Asks nothing when the log is writable or the queue is full.
    pub fn probe(&self) {
        if !self.stats.writable.load(Ordering::Relaxed) {
            let _ = self.tx.try_send(Job::Probe);
        }
    }

    /// Requests queued for the writer right now.
    pub fn queued(&self) -> usize {
        QUEUE_CAPACITY - self.tx.capacity()
    }
}

#[cfg(test)]
#[path = "tests/writer.rs"]
mod tests;
