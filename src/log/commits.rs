//! The writer thread's group commits ([`super::writer`]): it takes the queued
//! requests as a group, writes the group to the segment, enters it in the
//! [`Ledger`] and hands its sync to a sync thread ([`super::syncer`]) and, while that
//! runs, writes the next group, up to [`SYNC_FILES`] groups in flight. The ledger
//! answers the groups in order as their syncs finish; the writer only learns from it
//! how many are left in flight, where the durable end is, and whether one failed: a
//! failure fails every later group in flight, and the segment is given up and the
//! writer pauses only once nothing is in flight.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::appender::SYNC_FILES;
use super::ledger::{answer, Error, Ledger, Pending, Stats};
use super::record::encode_frame;
use super::segment::HEADER;
use super::syncer::{Syncers, Task};
use super::Appender;
use crate::support::sync::lock;

/// A group stops growing here, so one fsync never waits on an unbounded amount of data.
const MAX_GROUP_BYTES: usize = 64 * 1024 * 1024;
/// A log entry holds at most this many records, and is closed once it reaches this
/// many bytes (a group may span several entries): the compactor reads whole entries,
/// so this bounds what one of its steps holds beyond its chunk size.
const ENTRY_MAX_RECORDS: usize = 512;
pub(super) const ENTRY_MAX_BYTES: usize = 64 * 1024;
/// After a failed write the writer answers groups with [`Error::Storage`] without
/// touching the disk for a while, then tries again: a disk that keeps failing is tried
/// a few times a second, not once per request (each try starts a segment and logs an
/// error). The pause doubles with each failure in a row, up to the maximum.
pub(super) const FIRST_BACKOFF: Duration = Duration::from_millis(if cfg!(test) { 300 } else { 50 });
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A message to the writer thread.
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

/// What the writer waits for.
enum Event {
    /// From a request (None: every sender is gone).
    Job(Option<Job>),
    /// A sync finished (its group is already answered if it could be).
    Synced,
}

/// The writer thread's state.
pub(super) struct Commits {
    log: Appender,
    syncers: Syncers,
    ledger: Arc<Mutex<Ledger>>,
    /// A message for each sync finished, to wake the writer.
    done: mpsc::UnboundedReceiver<()>,
    waiter: tokio::runtime::Runtime,
    /// Groups in flight as the ledger last said; at most [`SYNC_FILES`]. Only the
    /// writer adds to them, and each one finished sends a message, so this is never
    /// below the truth and a wait for a message always ends.
    in_flight: usize,
    /// A group failed and groups are still in flight: nothing is written until the
    /// segment is given up.
    failing: bool,
    /// After a failure: until when groups are refused, and the pause that was set.
    backoff: Option<(Instant, Duration)>,
    stats: Arc<Stats>,
}

impl Commits {
    pub(super) fn new(
        log: Appender,
        syncers: Syncers,
        ledger: Arc<Mutex<Ledger>>,
        done: mpsc::UnboundedReceiver<()>,
        waiter: tokio::runtime::Runtime,
        stats: Arc<Stats>,
    ) -> Self {
        Commits {
            log,
            syncers,
            ledger,
            done,
            waiter,
            in_flight: 0,
            failing: false,
            backoff: None,
            stats,
        }
    }

    pub(super) fn run(&mut self, mut rx: mpsc::Receiver<Job>) {
        let mut stopping = false;
        loop {
            if stopping && self.in_flight == 0 {
                break;
            }
            let takes_jobs = !stopping && !self.failing && self.in_flight < SYNC_FILES;
            let job = match self.next_event(&mut rx, takes_jobs) {
                Event::Synced => {
                    self.review();
                    continue;
                }
                Event::Job(job) => job,
            };
            let mut group = Vec::new();
            let mut bytes = 0usize;
            let mut probe = false;
            let mut next = job;
            let gone = next.is_none();
            while let Some(job) = next {
                match job {
                    Job::Append { records, reply } => {
                        bytes += records.iter().map(Vec::len).sum::<usize>();
                        group.push(Pending { records, reply });
                    }
                    Job::Probe => probe = true,
                    Job::Stop => {
                        stopping = true;
                        break;
                    }
                }
                if bytes >= MAX_GROUP_BYTES {
                    break;
                }
                next = rx.try_recv().ok();
            }
            if !group.is_empty() {
                self.dispatch(group);
            } else if probe && self.in_flight == 0 {
                // With a group in flight, its sync tries the disk.
                self.probe();
            }
            if gone {
                // Every sender is gone: finish what is in flight, without a clean stop.
                self.drain();
                return;
            }
            if rx.is_empty() && self.in_flight == 0 {
                crate::support::idle::idle();
            }
        }
        if let Err(e) = self.log.mark_clean() {
            tracing::warn!(error = %e, "cannot record the write-ahead log's clean stop; the next start cannot tell a segment cut short from a torn write");
        }
    }

    /// The next request, or the next finished sync. Requests are taken only while
    /// another group may go in flight, so a disk that cannot keep up fills the queue.
    fn next_event(&mut self, rx: &mut mpsc::Receiver<Job>, takes_jobs: bool) -> Event {
        if self.in_flight == 0 {
            return Event::Job(rx.blocking_recv());
        }
        if self.done.try_recv().is_ok() {
            return Event::Synced;
        }
        if !takes_jobs {
            self.wait_synced();
            return Event::Synced;
        }
        if let Ok(job) = rx.try_recv() {
            return Event::Job(Some(job));
        }
        let done = &mut self.done;
        self.waiter.block_on(async {
            tokio::select! {
                biased;
                Some(()) = done.recv() => Event::Synced,
                job = rx.recv() => Event::Job(job),
            }
        })
    }

    /// Wait for the next finished sync.
    fn wait_synced(&mut self) {
        if self.done.blocking_recv().is_none() {
            // Cannot happen while the sync threads are there: fail what is in flight.
            lock(&self.ledger).fail_all();
        }
    }

    /// Take in what the syncs finished since the last look: the end of what is
    /// durable (for the next segment's record of skipped numbers), the pause, and,
    /// once a failure has nothing left in flight, give the segment up.
    fn review(&mut self) {
        let review = lock(&self.ledger).review();
        self.in_flight = review.in_flight;
        self.failing = review.failing;
        if let Some(end) = review.synced_end {
            self.log.note_synced(end);
        }
        if review.succeeded {
            self.backoff = next_backoff(true, self.backoff);
        }
        if review.failed {
            self.log.abandon();
            self.backoff = next_backoff(false, self.backoff);
            self.stats.writable.store(false, Ordering::Relaxed);
        }
    }

    /// Write a group and start its sync, or refuse it in the pause after a failure.
    fn dispatch(&mut self, mut group: Vec<Pending>) {
        let (frames, records) = frame_entries(&mut group);
        let bytes = frames.iter().map(|f| (HEADER + f.len()) as u64).sum();
        if !self.log.fits(bytes) {
            // A roll syncs the segment and publishes its end itself: not while
            // syncs are in flight. After a failure the segment is given up first.
            self.drain();
        }
        if let Some((until, _)) = self.backoff {
            if Instant::now() < until {
                self.stats.writable.store(false, Ordering::Relaxed);
                answer(group, Err(Error::Storage));
                return;
            }
        }
        let started = Instant::now();
        let written = frames
            .iter()
            .try_for_each(|frame| self.log.push(frame).map(drop))
            .and_then(|()| self.log.write());
        match written {
            Ok((end, file)) => {
                // In the ledger before its sync can finish.
                let id = lock(&self.ledger).add(end, records, started, group);
                self.in_flight += 1;
                self.syncers.sync(Task { id, end, file });
            }
            Err(e) => {
                let _ = storage_error(e);
                lock(&self.ledger).add_failed(started, group);
                // Given up at once if nothing was in flight; nothing more is written
                // until then.
                self.review();
            }
        }
    }

    /// Wait until every group in flight is answered (and a failure dealt with).
    fn drain(&mut self) {
        while self.in_flight > 0 {
            self.wait_synced();
            self.review();
        }
    }

    /// After a failure, check whether the disk takes writes again (nothing in flight).
    fn probe(&mut self) {
        let result = match self.backoff {
            Some((until, _)) if Instant::now() < until => Err(Error::Storage),
            _ => {
                let result = self.log.probe().map_err(|e| {
                    self.log.abandon();
                    storage_error(e)
                });
                self.backoff = next_backoff(result.is_ok(), self.backoff);
                result
            }
        };
        self.stats.writable.store(result.is_ok(), Ordering::Relaxed);
    }
}

/// The pause after a try of the disk: none after a success; after a failure, the
/// first pause, or twice the last one up to the maximum.
fn next_backoff(ok: bool, last: Option<(Instant, Duration)>) -> Option<(Instant, Duration)> {
    match (ok, last) {
        (true, None) => None,
        (true, Some(_)) => {
            tracing::info!("the write-ahead log writes again");
            None
        }
        (false, None) => Some((Instant::now() + FIRST_BACKOFF, FIRST_BACKOFF)),
        (false, Some((_, last))) => {
            let next = (last * 2).min(MAX_BACKOFF);
            Some((Instant::now() + next, next))
        }
    }
}

/// Frame the group's records as log entries, in order; returns them and how many
/// records.
fn frame_entries(group: &mut [Pending]) -> (Vec<Vec<u8>>, u64) {
    let mut frames = Vec::new();
    let mut count = 0u64;
    let mut entry: Vec<Vec<u8>> = Vec::new();
    let mut entry_bytes = 0usize;
    for pending in group.iter_mut() {
        for record in pending.records.drain(..) {
            entry_bytes += record.len();
            entry.push(record);
            count += 1;
            if entry.len() >= ENTRY_MAX_RECORDS || entry_bytes >= ENTRY_MAX_BYTES {
                frames.push(encode_frame(entry.iter().map(Vec::as_slice)));
                entry.clear();
                entry_bytes = 0;
            }
        }
    }
    if !entry.is_empty() {
        frames.push(encode_frame(entry.iter().map(Vec::as_slice)));
    }
    (frames, count)
}

fn storage_error(e: std::io::Error) -> Error {
    tracing::error!(error = %e, "write-ahead log write failed; answering 503 until it recovers");
    Error::Storage
}
