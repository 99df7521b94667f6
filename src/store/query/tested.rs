//! A read of events that tests each block's events as the block loads
//! ([`Events::tested`]), for filters that [`BlockTest`] can answer from a block's
//! columns (the console's filter by a property) rather than from each event made
//! whole; only the events that pass are ever made. Such a read is bounded in blocks
//! loaded, not in events: when the bound is reached and the next block is needed, the
//! read stops at a cut below which nothing was returned, every event above it having
//! been tested, and [`Events::stopped_at`] gives the place the next page reads below.
//!
//! The cut is just above the newest event the next unread block may hold (blocks come
//! newest block first, so every unread event is at or below it). It is always below
//! the page's own cursor: a read that cannot yet cut below it loads on past the bound,
//! so every page moves on.

use super::{Events, Place};
use crate::store::block::{self, Rows};

/// A test of a loaded block's events.
pub trait BlockTest: Send {
    /// Whether the block whose stored bytes are `value` ([`crate::store::block::Files::resolve`])
    /// holds no event that can pass, told without decoding it; false when unsure.
    fn skips(&mut self, value: &[u8]) -> bool;

    /// Keep in `left` (indexes of `rows`' events, oldest first) those that pass.
    fn keep(&mut self, rows: &Rows, left: &mut Vec<u32>);
}

/// The test of a read, its bound, and what it did.
pub(super) struct Tested {
    test: Box<dyn BlockTest>,
    /// Blocks it may load before it stops.
    budget: usize,
    loaded: usize,
    /// Events tested: those within the filter in the blocks decoded, and every event
    /// of the blocks skipped undecoded.
    examined: usize,
    /// Where the read stopped: it returns nothing below this place.
    cut: Option<Place>,
}

impl Events {
    /// Only the events `test` passes, tested a block at a time, loading at most
    /// `budget` blocks (more only when needed to move below the page's cursor).
    pub fn tested(mut self, test: Box<dyn BlockTest>, budget: usize) -> Events {
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
        let Some(t) = &mut self.test else {
            return false;
        };
        if t.cut.is_some() {
            return true;
        }
        let (Some(newest), true) = (newest, t.loaded >= t.budget) else {
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

    /// Whether the test tells, from the block's stored bytes, that none of its events
    /// can pass: then it is not decoded, and all its events count as examined.
    pub(super) fn skipped(&mut self, value: &[u8]) -> bool {
        let Some(t) = &mut self.test else {
            return false;
        };
        t.loaded += 1;
        // A block that cannot be read is decoded as every read does, which reports it.
        let Ok(bytes) = self.files.resolve(value) else {
            return false;
        };
        if !t.test.skips(&bytes) {
            return false;
        }
        t.examined += block::count(&bytes).map_or(0, |n| n as usize);
        true
    }

    /// `left` less the events the test fails.
    pub(super) fn keep(&mut self, rows: &Rows, left: &mut Vec<u32>) {
        if let Some(t) = &mut self.test {
            t.examined += left.len();
            if !left.is_empty() {
                t.test.keep(rows, left);
            }
        }
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
