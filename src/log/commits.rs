//! The writer thread's group commits ([`super::writer`]): it takes the queued
//! requests as a group, writes the group to the segment, hands its sync to a sync
//! thread ([`super::syncer`]) and, while that runs, writes the next group, up to
//! [`SYNC_FILES`] groups in flight. It answers each group once its own sync and every
//! earlier group's have succeeded, publishing the durable end in the same order; a
//! failure fails every later group in flight, and the segment is given up and the
//! writer pauses only once nothing is in flight.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::appender::SYNC_FILES;
use super::record::encode_frame;
use super::segment::HEADER;
use super::syncer::{Done, Syncers, Task};
use super::writer::{
    Error, FlushObserver, Job, Stats, ENTRY_MAX_BYTES, ENTRY_MAX_RECORDS, FIRST_BACKOFF,
    MAX_BACKOFF, MAX_GROUP_BYTES,
};
use super::Appender;

/// One append waiting in the current group.
pub(super) struct Pending {
    records: Vec<Vec<u8>>,
    reply: oneshot::Sender<Result<(), Error>>,
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
    done: Option<(std::io::Result<()>, Instant)>,
}

/// What the writer waits for.
enum Event {
    /// From a request (None: every sender is gone).
    Job(Option<Job>),
    Synced(Done),
}

/// The writer thread's state.
pub(super) struct Commits<'a> {
    log: Appender,
    syncers: Syncers,
    done: mpsc::UnboundedReceiver<Done>,
    waiter: tokio::runtime::Runtime,
    /// Groups written and not yet answered, oldest first; at most [`SYNC_FILES`].
    flights: VecDeque<Flight>,
    /// The number of the oldest flight; each group written takes the next one.
    first_id: u64,
    /// A group failed: it and every group after it fail, and once nothing is in
    /// flight the segment is given up. Nothing is written meanwhile.
    failed_from: Option<u64>,
    /// After a failure: until when groups are refused, and the pause that was set.
    backoff: Option<(Instant, Duration)>,
    stats: &'a Stats,
    on_flush: &'a FlushObserver,
}

impl<'a> Commits<'a> {
    pub(super) fn new(
        log: Appender,
        syncers: Syncers,
        done: mpsc::UnboundedReceiver<Done>,
        waiter: tokio::runtime::Runtime,
        stats: &'a Stats,
        on_flush: &'a FlushObserver,
    ) -> Self {
        Commits {
            log,
            syncers,
            done,
            waiter,
            flights: VecDeque::new(),
            first_id: 0,
            failed_from: None,
            backoff: None,
            stats,
            on_flush,
        }
    }

    pub(super) fn run(&mut self, mut rx: mpsc::Receiver<Job>) {
        let mut stopping = false;
        loop {
            if stopping && self.flights.is_empty() {
                break;
            }
            let takes_jobs =
                !stopping && self.failed_from.is_none() && self.flights.len() < SYNC_FILES;
            let job = match self.next_event(&mut rx, takes_jobs) {
                Event::Synced(done) => {
                    self.record(done);
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
            } else if probe && self.flights.is_empty() {
                // With a group in flight, its sync tries the disk.
                self.probe();
            }
            if gone {
                // Every sender is gone: finish what is in flight, without a clean stop.
                self.drain();
                return;
            }
            if rx.is_empty() && self.flights.is_empty() {
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
        if self.flights.is_empty() {
            return Event::Job(rx.blocking_recv());
        }
        if let Ok(done) = self.done.try_recv() {
            return Event::Synced(done);
        }
        if !takes_jobs {
            return self.synced();
        }
        if let Ok(job) = rx.try_recv() {
            return Event::Job(Some(job));
        }
        let done = &mut self.done;
        self.waiter.block_on(async {
            tokio::select! {
                biased;
                Some(done) = done.recv() => Event::Synced(done),
                job = rx.recv() => Event::Job(job),
            }
        })
    }

    /// Wait for the next finished sync.
    fn synced(&mut self) -> Event {
        match self.done.blocking_recv() {
            Some(done) => Event::Synced(done),
            // Cannot happen while the sync threads are there: fail what is in flight.
            None => Event::Synced(Done {
                id: self.first_id,
                result: Err(std::io::Error::other("the log's sync threads are gone")),
                at: Instant::now(),
            }),
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
        let id = self.first_id + self.flights.len() as u64;
        let (end, done) = match written {
            Ok((end, file)) => {
                self.syncers.sync(Task { id, end, file });
                (end, None)
            }
            Err(e) => {
                // Answered in turn, after the groups before it, which do not depend on
                // it; nothing more is written until the segment is given up.
                let _ = storage_error(e);
                self.failed_from = Some(self.failed_from.map_or(id, |f| f.min(id)));
                let failed = Err(std::io::Error::other("the group's write failed"));
                (0, Some((failed, started)))
            }
        };
        self.flights.push_back(Flight {
            end,
            records,
            started,
            group,
            done,
        });
        self.settle();
    }

    /// A sync finished: note it, and answer what is answerable.
    fn record(&mut self, done: Done) {
        let Some(flight) = done
            .id
            .checked_sub(self.first_id)
            .and_then(|at| self.flights.get_mut(at as usize))
        else {
            return;
        };
        if let Err(e) = &done.result {
            if self.failed_from.is_none_or(|f| done.id < f) {
                tracing::error!(error = %e, "write-ahead log sync failed; answering 503 until it recovers");
                self.failed_from = Some(done.id);
            }
        }
        flight.done = Some((done.result, done.at));
        self.settle();
    }

    /// Answer the oldest groups whose syncs have finished, in order: a group succeeds
    /// only if its sync and every earlier one's did. Once a failure has nothing left
    /// in flight, give the segment up and pause.
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
            if result.is_err() || failed {
                self.stats.writable.store(false, Ordering::Relaxed);
                answer(flight.group, Err(Error::Storage));
                continue;
            }
            self.log.synced(flight.end);
            let took = at.saturating_duration_since(flight.started);
            (self.on_flush)(took);
            let stats = self.stats;
            stats
                .last_flush_micros
                .store(took.as_micros() as u64, Ordering::Relaxed);
            stats.groups.fetch_add(1, Ordering::Relaxed);
            stats
                .appended_records
                .fetch_add(flight.records, Ordering::Relaxed);
            self.backoff = next_backoff(true, self.backoff);
            stats.writable.store(true, Ordering::Relaxed);
            answer(flight.group, Ok(()));
        }
        if self.flights.is_empty() && self.failed_from.take().is_some() {
            self.log.abandon();
            self.backoff = next_backoff(false, self.backoff);
            self.stats.writable.store(false, Ordering::Relaxed);
        }
    }

    /// Wait until every group in flight is answered (and a failure dealt with).
    fn drain(&mut self) {
        while !self.flights.is_empty() {
            if let Event::Synced(done) = self.synced() {
                self.record(done);
            }
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

fn answer(group: Vec<Pending>, result: Result<(), Error>) {
    for pending in group {
        // A requester that went away (client disconnected) needs no answer.
        let _ = pending.reply.send(result);
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
