//! When the compactor folds the persons' and distinct ids' deltas into their runs
//! ([`crate::store::layered`]): after a step once a delta has grown past its share of
//! the run, once the compactor has been idle for a while with changes not yet folded,
//! and at a clean stop. Folds run on the compactor's thread between chunks, the only
//! time nothing writes the deltas. A failed fold (a full disk) is logged, changes
//! nothing, and is tried again after [`RETRY_AFTER`].

use std::time::{Duration, Instant};

use super::Compactor;
use crate::store::layered::{cache, Layered};

/// Idle this long before changes not yet folded are folded...
const IDLE_BEFORE_FOLD: Duration = Duration::from_secs(10);
/// ... and no sooner than this after the last fold, so a trickle of events does not
/// rewrite a large run again and again.
const IDLE_FOLD_SPACING: Duration = Duration::from_secs(60);
/// After a failed fold.
const RETRY_AFTER: Duration = Duration::from_secs(30);
/// While busy, the next fold waits this many times as long as the last one took, so
/// folds take at most about a quarter of the compactor's time however large the run
/// (or slow the build): the delta grows meanwhile and the next fold takes more.
const BUSY_SPACING: u32 = 3;

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

#[derive(Default)]
pub struct Schedule {
    /// Since when steps have found nothing to do.
    idle_since: Option<Instant>,
    last_fold: Option<Instant>,
    retry_at: Option<Instant>,
    /// No fold while busy before this ([`BUSY_SPACING`]).
    busy_after: Option<Instant>,
}

impl Compactor {
    /// Fold whichever table is due at `moment` (see the module docs).
    pub(super) fn fold_tables(&mut self, moment: Moment) {
        let now = Instant::now();
        let s = &mut self.folds;
        match moment {
            Moment::Busy => s.idle_since = None,
            Moment::Idle => {
                s.idle_since.get_or_insert(now);
            }
            Moment::Stop => {}
        }
        if moment != Moment::Stop && s.retry_at.is_some_and(|t| now < t) {
            return;
        }
        if moment == Moment::Busy && s.busy_after.is_some_and(|t| now < t) {
            return;
        }
        let idle_enough = s.idle_since.is_some_and(|t| now - t >= IDLE_BEFORE_FOLD)
            && s.last_fold.is_none_or(|t| now - t >= IDLE_FOLD_SPACING);
        let t = &self.trees;
        for table in t.tables().map(Layered::clone) {
            let due = match moment {
                Moment::Busy => table.should_fold(),
                Moment::Idle => table.should_fold() || (idle_enough && table.pending() > 0),
                Moment::Stop => table.pending() > 0,
            };
            if due {
                self.fold(&table, moment);
            }
        }
    }

    fn fold(&mut self, table: &Layered, moment: Moment) {
        let s = &mut self.folds;
        s.last_fold = Some(Instant::now());
        match table.fold() {
            Ok(f) => {
                // The delta folded was allocated on this thread: its memory goes back now,
                // not when the compactor next idles (after the log empties, while busy).
                crate::support::idle::freed();
                s.retry_at = None;
                s.busy_after = Some(Instant::now() + f.took * BUSY_SPACING);
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
                    at = ?moment,
                    block_cache_hits = hits,
                    block_cache_misses = misses,
                    "folded recent changes into the table's run"
                );
            }
            Err(e) => {
                s.retry_at = Some(Instant::now() + RETRY_AFTER);
                tracing::warn!(table = table.name(), error = %e, "cannot fold recent changes into the table's run; they stay where they are and are read from there, and the fold is tried again");
            }
        }
    }
}
