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
//! (`syncer.rs`), the writer writes the next group and starts its sync on another, up
//! to four (`SYNC_FILES`) groups in flight. A group is answered only once its own sync
//! and every earlier group's succeeded, so answers and the durable end the compactor
//! reads up to go in order (`ledger.rs`). A failed sync fails its group and every
//! later one in flight (their pages follow the lost ones in the segment); the writer
//! then waits for every sync in flight to finish before it gives up the segment
//! ([`Appender::abandon`]) and pauses. A group that would roll to a new segment also
//! waits for the syncs in flight, so a roll syncs and publishes exactly as it does
//! alone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::{mpsc, oneshot};

use super::appender::SYNC_FILES;
use super::commits::{Commits, Job};
#[cfg(test)]
use super::commits::{ENTRY_MAX_BYTES, FIRST_BACKOFF};
use super::ledger::Ledger;
pub use super::ledger::{Error, FlushObserver, Stats};
use super::syncer::Syncers;
use super::{Appender, Preparer};

/// Requests waiting for the writer. A full queue means the disk cannot keep up: new
/// requests get 503 with Retry-After rather than an ever-growing backlog in memory.
pub(super) const QUEUE_CAPACITY: usize = 8192;
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
