//! A read of events that tests each block's events as the block loads
//! ([`Events::tested`]), for filters that [`BlockTest`] can answer from a block's
//! columns (the console's filter by a property) rather than from each event made
//! whole; only the events that pass are ever made. A test that only events having a
//! property key can pass ([`BlockTest::key`]) reads only the blocks that may hold the
//! key: those the event index names for it, or without the index every block with
//! those lacking it passed over ([`super::source::Narrow`]), so both read the same
//! blocks and answer the same pages. Such a read is bounded in blocks loaded, not in
//! events: when the bound is reached and the next block is needed, the read stops at
//! a cut below which nothing was returned, every event above it having been tested,
//! and [`Events::stopped_at`] gives the place the next page reads below. So a key few
//! events have takes a page to its matches however many blocks lack it, and the
//! bound holds for what the key cannot narrow (a value test on a key every event has).
//!
//! The cut is just above the newest event the next unread block may hold (blocks come
//! newest block first, so every unread event is at or below it). It is always below
//! the page's own cursor: a read that cannot yet cut below it loads on past the bound,
//! so every page moves on.

use super::source::Narrow;
use super::{Events, Place};
use crate::store::block::Rows;

/// A read without the index passes over at most this many blocks lacking the key for
/// each block it may load, then stops as at its bound: its time stays within about
/// what its loads cost (passing over one decompresses its first few KiB).
const PASSED_A_LOAD: usize = 10;

/// A test of a loaded block's events.
pub trait BlockTest: Send {
    /// The property key every event that can pass has, when only such events can:
    /// the blocks that cannot hold it are not read at all. None when an event without
    /// it may pass (a negative test) or the key is not a property (`distinct_id`).
    fn key(&self) -> Option<String>;

    /// Keep in `left` (indexes of `rows`' events, oldest first) those that pass; a
    /// test that reads more than the block (a person's properties) may fail reading.
    fn keep(&mut self, rows: &Rows, left: &mut Vec<u32>) -> Result<(), sled::Error>;
}

/// The test of a read, its bound, and what it did.
pub(super) struct Tested {
    test: Box<dyn BlockTest>,
    /// Blocks it may load before it stops.
    budget: usize,
    loaded: usize,
    /// Events tested: those within the filter in the blocks loaded.
    examined: usize,
    /// Where the read stopped: it returns nothing below this place.
    cut: Option<Place>,
}

impl Events {
    /// Only the events `test` passes, tested a block at a time, loading at most
    /// `budget` blocks (more only when needed to move below the page's cursor); when
    /// the test needs a key, only blocks that may hold it are read and counted.
    pub fn tested(self, test: Box<dyn BlockTest>, budget: usize) -> Events {
        let passes = budget.saturating_mul(PASSED_A_LOAD);
        self.tested_within(test, budget, passes)
    }

    /// [`Events::tested`], passing over at most `passes` blocks without the key when
    /// the index is not built.
    fn tested_within(mut self, test: Box<dyn BlockTest>, budget: usize, passes: usize) -> Events {
        if let Some(key) = test.key() {
            let narrow = Narrow {
                key,
                files: self.files.clone(),
                newest: None,
                event: None,
                who: None,
                passed: 0,
                limit: passes,
            };
            if self.failed.is_none() {
                match self.plan.source(Some(narrow)) {
                    Ok(blocks) => self.blocks = blocks,
                    Err(e) => self.failed = Some(e),
                }
            }
        }
        self.test = Some(Tested {
            test,
            budget,
            loaded: 0,
            examined: 0,
            cut: None,
        });
        self
    }

    /// Where the read stopped for its bound, if it did: the next page reads below it.
    pub fn stopped_at(&self) -> Option<Place> {
        self.test.as_ref()?.cut
    }

    /// Events the test was run on (see [`Tested::examined`]).
    pub fn examined(&self) -> usize {
        self.test.as_ref().map_or(0, |t| t.examined)
    }

    /// Whether the read stops instead of loading the next block, whose newest event
    /// is at `newest` (None when unreadable: loaded, to report it).
    pub(super) fn over_budget(&mut self, newest: Option<i64>) -> bool {
        let below = self.bounds.below;
        let passed_all = self.blocks.passed_all();
        let Some(t) = &mut self.test else {
            return false;
        };
        if t.cut.is_some() {
            return true;
        }
        let spent = t.loaded >= t.budget || passed_all;
        let (Some(newest), true) = (newest, spent) else {
            return false;
        };
        let Some(above) = newest.checked_add(1) else {
            return false;
        };
        let cut = (above, 0);
        if below.is_some_and(|b| cut >= b) {
            return false;
        }
        t.cut = Some(cut);
        true
    }

    /// A block is loaded: it counts towards the bound.
    pub(super) fn count_loaded(&mut self) {
        if let Some(t) = &mut self.test {
            t.loaded += 1;
        }
    }

    /// `left` less the events the test fails.
    pub(super) fn keep(&mut self, rows: &Rows, left: &mut Vec<u32>) -> Result<(), sled::Error> {
        if let Some(t) = &mut self.test {
            t.examined += left.len();
            if !left.is_empty() {
                t.test.keep(rows, left)?;
            }
        }
        Ok(())
    }

    /// Whether the newest pending match is below the cut, so the read ends here.
    pub(super) fn held_back(&self) -> bool {
        let Some(cut) = self.test.as_ref().and_then(|t| t.cut) else {
            return false;
        };
        self.heap.peek().is_none_or(|next| next.place < cut)
    }
}

#[cfg(test)]
#[path = "../tests/query_tested.rs"]
mod tests;

#[cfg(test)]
#[path = "../tests/query_props.rs"]
mod props_tests;
