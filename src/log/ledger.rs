//! The groups in flight between the log's writer ([`super::commits`]) and its sync
//! threads ([`super::syncer`]), under one lock: whichever thread sees a sync finish
//! answers every group that is then answerable, in order, so an answer does not wait
//! for the writer thread to wake. A group succeeds only if its sync and every earlier
//! group's did; the durable end is moved past it, under the same lock, before its
//! requests are answered. The answer's types ([`Error`]) and the counters the
//! answers update ([`Stats`]) live here too, below the writer that re-exports them.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

use super::Shared;

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

/// Told the duration of every fsync, for a latency histogram.
pub type FlushObserver = Box<dyn Fn(std::time::Duration) + Send>;

/// One append waiting in a group.
pub(super) struct Pending {
    pub records: Vec<Vec<u8>>,
    pub reply: oneshot::Sender<Result<(), Error>>,
}

/// A group written to the segment, waiting for its sync.
struct Flight {
    /// The number after its last entry: the durable end once it is answered.
    end: u64,
    records: u64,
    /// When its write started, for the flush's duration.
    started: Instant,
    group: Vec<Pending>,
    /// Its sync's outcome and when it finished, once reported.
    done: Option<(io::Result<()>, Instant)>,
}

pub(super) struct Ledger {
    /// Groups written and not yet answered, oldest first.
    flights: VecDeque<Flight>,
    /// The number of the oldest flight; each group written takes the next one.
    first_id: u64,
    /// A group failed: it and every group after it fail; the writer gives the
    /// segment up once nothing is in flight, and writes nothing meanwhile.
    failed_from: Option<u64>,
    /// The end of the last group answered durable.
    synced_end: Option<u64>,
    /// A group was answered durable since the writer last looked.
    succeeded: bool,
    shared: Arc<Shared>,
    stats: Arc<Stats>,
    on_flush: FlushObserver,
}

/// What the writer learns from the ledger ([`Ledger::review`]).
pub(super) struct Review {
    pub in_flight: usize,
    /// A failure waits for the groups still in flight.
    pub failing: bool,
    /// A failure with nothing left in flight: the writer gives the segment up now.
    pub failed: bool,
    pub succeeded: bool,
    pub synced_end: Option<u64>,
}

impl Ledger {
    pub fn new(shared: Arc<Shared>, stats: Arc<Stats>, on_flush: FlushObserver) -> Ledger {
        Ledger {
            flights: VecDeque::new(),
            first_id: 0,
            failed_from: None,
            synced_end: None,
            succeeded: false,
            shared,
            stats,
            on_flush,
        }
    }

    /// A group written, its sync about to start; returns its number.
    pub fn add(&mut self, end: u64, records: u64, started: Instant, group: Vec<Pending>) -> u64 {
        let id = self.first_id + self.flights.len() as u64;
        self.flights.push_back(Flight {
            end,
            records,
            started,
            group,
            done: None,
        });
        id
    }

    /// A group whose write failed: it fails in turn, after the groups before it,
    /// which do not depend on it.
    pub fn add_failed(&mut self, started: Instant, group: Vec<Pending>) {
        let id = self.add(0, 0, started, group);
        self.failed_from = Some(self.failed_from.map_or(id, |f| f.min(id)));
        self.finish(
            id,
            Err(io::Error::other("the group's write failed")),
            started,
        );
    }

    /// A group's sync finished: note it, and answer what is answerable.
    pub fn finish(&mut self, id: u64, result: io::Result<()>, at: Instant) {
        let Some(flight) = id
            .checked_sub(self.first_id)
            .and_then(|at| self.flights.get_mut(at as usize))
        else {
            return;
        };
        if let Err(e) = &result {
            if self.failed_from.is_none_or(|f| id < f) {
                tracing::error!(error = %e, "write-ahead log sync failed; answering 503 until it recovers");
                self.failed_from = Some(id);
            }
        }
        flight.done = Some((result, at));
        self.settle();
    }

    /// Every sync in flight is lost (no sync thread is left): they all fail.
    pub fn fail_all(&mut self) {
        let ids: Vec<u64> = (self.first_id..).take(self.flights.len()).collect();
        for id in ids {
            self.finish(
                id,
                Err(io::Error::other("the log's sync threads are gone")),
                Instant::now(),
            );
        }
    }

    /// Answer the oldest groups whose syncs have finished, in order.
    fn settle(&mut self) {
        while self.flights.front().is_some_and(|f| f.done.is_some()) {
            let Some(flight) = self.flights.pop_front() else {
                break;
            };
            let id = self.first_id;
            self.first_id += 1;
            let failed = self.failed_from.is_some_and(|f| id >= f);
            let Some((result, at)) = flight.done else {
                continue;
            };
            let stats = &self.stats;
            if result.is_err() || failed {
                stats.writable.store(false, Ordering::Relaxed);
                answer(flight.group, Err(Error::Storage));
                continue;
            }
            self.shared.durable.store(flight.end, Ordering::Release);
            self.synced_end = Some(flight.end);
            self.succeeded = true;
            let took = at.saturating_duration_since(flight.started);
            (self.on_flush)(took);
            stats
                .last_flush_micros
                .store(took.as_micros() as u64, Ordering::Relaxed);
            stats.groups.fetch_add(1, Ordering::Relaxed);
            stats
                .appended_records
                .fetch_add(flight.records, Ordering::Relaxed);
            stats.writable.store(true, Ordering::Relaxed);
            answer(flight.group, Ok(()));
        }
    }

    /// What happened since the writer last looked.
    pub fn review(&mut self) -> Review {
        let failed = self.flights.is_empty() && self.failed_from.take().is_some();
        Review {
            in_flight: self.flights.len(),
            failing: self.failed_from.is_some(),
            failed,
            succeeded: std::mem::take(&mut self.succeeded),
            synced_end: self.synced_end,
        }
    }
}

pub(super) fn answer(group: Vec<Pending>, result: Result<(), Error>) {
    for pending in group {
        // A requester that went away (client disconnected) needs no answer.
        let _ = pending.reply.send(result);
    }
}
