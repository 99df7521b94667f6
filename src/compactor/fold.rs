//! When the layered tables ([`crate::store::layered`]: persons, distinct ids, first
//! seen, persons by property) are folded into their runs: after a step once a table's
//! delta has grown past its share of the run, once the compactor has been idle for a
//! while with changes not yet folded, and at a clean stop.
//!
//! A fold runs on a thread of its own, `layered-fold`, one at a time, while the
//! compactor goes on applying chunks: the fold holds the tables' journal only to freeze
//! the delta and to switch to the new runs (see [`Layered::fold`]). The compactor only
//! hands it the table due. If the compactor outruns the folds, so that a table's
//! active map passes [`Layered::outran`] (twice what makes it due) while a fold is
//! under way, the compactor waits for that fold before its next chunk: the delta then
//! holds at most a frozen map and an active one of about twice the fold's threshold
//! each (the threshold is an eighth of the table's runs, at most 64 MiB of keys and
//! values), however far behind it is.
//!
//! The deltas are bounded by memory too: once the tables' deltas together take more
//! than the budget ([`crate::config::Compaction::delta_budget_bytes`], by their maps'
//! estimated memory, `layered::delta::entry_footprint`), the table whose active map
//! is largest is folded, due by its share or not; once they take more than
//! [`OUTRUN`] times it (the frozen map of the fold under way counted), the compactor
//! waits for that fold, as for a table that outran it. The share still decides while
//! the deltas are small (a small table folds early, at little cost); the budget, at
//! scale, where the shares alone let the deltas together reach 90-100 MiB at 5 million
//! events from a million persons (`BENCHMARKS.md`). A fold for the budget takes every
//! part with changes ([`Take::Every`]), so the whole map goes, and its heap with it.
//!
//! A fold holds the compactor's gate for reading, as a step does, so a backup finds no
//! fold under way; it takes it only if no backup is waiting for it, so neither waits
//! for the other. A clean stop waits for the fold under way, then folds what is left
//! on the compactor's thread. A failed fold (a full disk, a panic on the fold thread)
//! is logged, changes nothing, and is tried again after [`RETRY_AFTER`].

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::OwnedRwLockReadGuard;

use super::Compactor;
use crate::store::layered::delta::Memory;
use crate::store::layered::{cache, Folded, Layered, Take, OUTRUN};
use crate::store::Error;
use crate::support::sync::{lock, Gate};
use crate::support::worker::{Job, Worker};

/// Idle this long before changes not yet folded are folded...
const IDLE_BEFORE_FOLD: Duration = Duration::from_secs(10);
/// ... and no sooner than this after the last fold, so a trickle of events does not
/// rewrite a large run again and again.
const IDLE_FOLD_SPACING: Duration = Duration::from_secs(60);
/// After a failed fold.
const RETRY_AFTER: Duration = Duration::from_secs(30);
/// The fold thread's name.
pub const THREAD: &str = "layered-fold";

/// Why a fold is considered.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Moment {
    /// A step applied records.
    Busy,
    /// A step found nothing to do.
    Idle,
    /// The compactor is stopping.
    Stop,
}

/// What the compactor and the fold thread share.
#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Told when a fold ends.
    ended: Condvar,
}

#[derive(Default)]
struct State {
    /// A fold is under way ([`Running`]).
    running: bool,
    retry_at: Option<Instant>,
    /// Times the compactor waited for a fold under way: a table had outrun it, or at
    /// a stop.
    waits: u64,
}

/// A fold under way until dropped: ended, or never run (the thread gone with its
/// job), or past a panic. Whoever waits for it is then woken, so the compactor never
/// waits for a fold that will not end.
struct Running(Arc<Shared>);

impl Running {
    fn start(shared: &Arc<Shared>) -> Running {
        lock(&shared.state).running = true;
        Running(shared.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        lock(&self.0.state).running = false;
        self.0.ended.notify_all();
    }
}

pub struct Schedule {
    /// Since when steps have found nothing to do.
    idle_since: Option<Instant>,
    /// The table looked at first next time, so that one due again and again does not
    /// keep the others waiting.
    next: usize,
    /// When each table (by name) was last handed to a fold.
    last_fold: HashMap<String, Instant>,
    /// The fold thread's nice value, the compactor's.
    nice: i32,
    /// The deltas' memory budget, 0 for none.
    budget: u64,
    gate: Option<Arc<Gate>>,
    shared: Arc<Shared>,
    /// The fold thread, started at the first fold; stopped (after the fold under way)
    /// when the compactor is dropped.
    folder: Option<Worker>,
}

impl Schedule {
    pub fn new(nice: i32, budget: u64) -> Schedule {
        Schedule {
            idle_since: None,
            next: 0,
            last_fold: HashMap::new(),
            nice,
            budget,
            gate: None,
            shared: Arc::default(),
            folder: None,
        }
    }

    /// The gate a fold holds for reading, as the compactor's steps do.
    pub fn set_gate(&mut self, gate: Arc<Gate>) {
        self.gate = Some(gate);
    }

    /// Wait for the fold under way, if any; the state after it.
    fn wait(&self) -> MutexGuard<'_, State> {
        let mut state = lock(&self.shared.state);
        state.waits += u64::from(state.running);
        self.shared
            .ended
            .wait_while(state, |s| s.running)
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Hand `table` to the fold thread, unless a backup is waiting for the gate.
    fn start(&mut self, table: &Layered, moment: Moment, take: Take) {
        let pass = match &self.gate {
            Some(gate) => match gate.clone().try_read_owned() {
                Ok(pass) => Some(pass),
                // A backup is waiting: the fold is tried again after it.
                Err(_) => return,
            },
            None => None,
        };
        self.last_fold
            .insert(table.name().to_owned(), Instant::now());
        let job = fold_job(&self.shared, table, moment, take, pass);
        if self.folder.is_none() {
            match Worker::spawn(THREAD, self.nice, 1) {
                Ok(worker) => self.folder = Some(worker),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start the fold thread; folding on the compactor's")
                }
            }
        }
        let unsent = match &self.folder {
            Some(folder) => folder.send(job).err(),
            None => Some(job),
        };
        if let Some(job) = unsent {
            // The thread could not start, or is gone (it panicked past a fold): the
            // fold runs here, and a thread is started again for the next.
            self.folder = None;
            job.run_here();
        }
    }
}

/// The fold of `table` (the parts `take` says), holding `pass` (the compactor's gate,
/// for reading) until it ends.
fn fold_job(
    shared: &Arc<Shared>,
    table: &Layered,
    moment: Moment,
    take: Take,
    pass: Option<OwnedRwLockReadGuard<()>>,
) -> Job {
    let running = Running::start(shared);
    let (folding, table) = (table.clone(), table.clone());
    Job::new(
        move || folding.fold_taking(take),
        move |outcome| {
            drop(pass);
            let outcome = outcome
                .unwrap_or_else(|_| Err(Error::Tables(std::io::Error::other("the fold panicked"))));
            ended(&running.0, &table, moment, outcome);
            drop(running);
            // The fold's maps and buffers go back now, not when this thread next idles.
            crate::support::idle::freed();
        },
    )
}

/// Record and log how a fold of `table` ended.
fn ended(shared: &Shared, table: &Layered, moment: Moment, outcome: Result<Folded, Error>) {
    let mut state = lock(&shared.state);
    match outcome {
        Ok(f) => {
            state.retry_at = None;
            let (hits, misses) = cache::global().counts();
            tracing::info!(
                table = table.name(),
                entries = f.entries,
                taken = f.taken,
                bytes = f.file_bytes,
                rewritten = f.rewritten,
                parts = f.parts_before,
                written_bytes = f.written_bytes,
                took_ms = f.took.as_millis() as u64,
                held_us = f.held.as_micros() as u64,
                at = ?moment,
                block_cache_hits = hits,
                block_cache_misses = misses,
                "folded recent changes into the table's run"
            );
        }
        Err(e) => {
            state.retry_at = Some(Instant::now() + RETRY_AFTER);
            tracing::warn!(table = table.name(), error = %e, "cannot fold recent changes into the table's run; they stay where they are and are read from there, and the fold is tried again");
        }
    }
}

/// The deltas' memory (each table's, in order) against `budget`.
#[derive(Debug, PartialEq, Eq)]
pub struct Budgeted {
    /// The table to fold: the one whose active map takes the most, once the deltas
    /// together pass the budget.
    pub largest: Option<usize>,
    /// The deltas together take more than [`OUTRUN`] times the budget: the compactor
    /// waits for the fold under way.
    pub past_bound: bool,
}

pub fn budgeted(memory: &[Memory], budget: u64) -> Budgeted {
    let total: u64 = memory.iter().map(Memory::total).sum();
    if budget == 0 || total <= budget {
        return Budgeted {
            largest: None,
            past_bound: false,
        };
    }
    let largest = (0..memory.len())
        .filter(|&i| memory[i].active > 0)
        .max_by_key(|&i| memory[i].active);
    Budgeted {
        largest,
        past_bound: total > OUTRUN * budget,
    }
}

#[cfg(test)]
#[path = "tests/fold_hooks.rs"]
pub(super) mod hooks;

impl Compactor {
    /// Fold whichever table is due at `moment` (see the module docs).
    pub(super) fn fold_tables(&mut self, moment: Moment) {
        let now = Instant::now();
        let tables: Vec<Layered> = self.trees.tables().map(Layered::clone).into();
        let s = &mut self.folds;
        match moment {
            Moment::Busy => s.idle_since = None,
            Moment::Idle => {
                s.idle_since.get_or_insert(now);
            }
            Moment::Stop => {
                drop(s.wait());
                for table in tables.iter().filter(|t| t.pending() > 0) {
                    fold_job(&s.shared, table, moment, Take::Due, None).run_here();
                }
                return;
            }
        }
        let memory = |tables: &[Layered]| -> Vec<Memory> {
            tables.iter().map(Layered::delta_memory).collect()
        };
        let mut budget = budgeted(&memory(&tables), s.budget);
        let mut state = lock(&s.shared.state);
        if state.running {
            let outran = tables.iter().any(Layered::outran);
            if !outran && !budget.past_bound {
                return;
            }
            drop(state);
            let waited = Instant::now();
            state = s.wait();
            tracing::info!(
                waited_ms = waited.elapsed().as_millis() as u64,
                times = state.waits,
                outran,
                past_budget = budget.past_bound,
                "the compactor waited for a fold: a table's recent changes had passed twice the size that makes them due, or the tables' together twice their budget"
            );
            // The fold's frozen map is gone.
            budget = budgeted(&memory(&tables), s.budget);
        }
        if state.retry_at.is_some_and(|t| now < t) {
            return;
        }
        drop(state);
        let idle = s.idle_since.is_some_and(|t| now - t >= IDLE_BEFORE_FOLD);
        let count = tables.len();
        // A table that outran its fold first, so the delta stays within its bound;
        // then the largest, if the deltas are past their budget.
        let outran = tables.iter().position(Layered::outran);
        for i in outran
            .into_iter()
            .chain(budget.largest)
            .chain((0..count).map(|i| (s.next + i) % count))
        {
            let table = &tables[i];
            let spaced = || {
                let last = s.last_fold.get(table.name());
                last.is_none_or(|&t| now - t >= IDLE_FOLD_SPACING)
            };
            // Folded for the budget, the whole delta goes, its heap with it.
            let by_budget = budget.largest == Some(i);
            let due = by_budget
                || match moment {
                    Moment::Busy => table.should_fold(),
                    _ => table.should_fold() || (idle && table.pending() > 0 && spaced()),
                };
            if due {
                if tracing::enabled!(tracing::Level::DEBUG) {
                    log_deltas(&tables, table, by_budget);
                }
                let take = if by_budget { Take::Every } else { Take::Due };
                s.next = (i + 1) % count;
                s.start(table, moment, take);
                return;
            }
        }
    }
}

/// Each table's delta as a fold of `folded` starts: its estimated memory (what the
/// budget weighs) and the bytes its maps' heaps hold, to compare the two.
fn log_deltas(tables: &[Layered], folded: &Layered, by_budget: bool) {
    let mine = |t: &Layered| (t.delta_memory().total() >> 10, t.delta_heap_bytes() >> 10);
    let kib: Vec<(&str, (u64, u64))> = tables.iter().map(|t| (t.name(), mine(t))).collect();
    tracing::debug!(
        table = folded.name(),
        by_budget,
        deltas_estimated_and_heap_kib = ?kib,
        "folding"
    );
}
