//! Decoded blocks kept for the reads that come back to them: the newest blocks, which
//! the events page and its live tail read every few seconds, and a person's blocks
//! while their page is read again or paged through. Keyed by the pointer to a block's
//! bytes: files are append-only and their numbers never reused by a running server, so
//! a pointer always names the same bytes and nothing is invalidated (a deleted block's
//! pointer is no longer found, so its entry is only evicted).
//! Weighed by decoded bytes and bounded by [`BYTES`]; eviction is a clock (each entry
//! read since the hand last passed gets one more turn).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use super::Rows;
use crate::support::sync::lock;

/// Decoded bytes kept: about 600 blocks of web events (35,000 events), several pages of
/// the events list and of a few persons' events, a twentieth of the memory budget (300
/// MB at 20 M events). Halved from 32 MiB together with sled's cache
/// ([`crate::config::DEFAULT_CACHE_BYTES`]): at 20 million events the lookups read as
/// fast, and the highest resident set through them was 10 MiB lower (`BENCHMARKS.md`).
pub const BYTES: usize = 16 * 1024 * 1024;

/// The budget: [`BYTES`], or `FLAGPOST_EVENT_BLOCK_CACHE_MB` (a knob for measuring it).
pub fn budget() -> usize {
    crate::store::layered::cache::budget_from_env("FLAGPOST_EVENT_BLOCK_CACHE_MB", BYTES)
}

/// Where a block's bytes are (file, offset, length and CRC).
pub type Key = super::pointer::Pointer;

pub struct Cache {
    budget: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Each block, its weight, and whether it was read since the hand passed.
    blocks: HashMap<Key, (Arc<Rows>, usize, bool)>,
    /// The clock's order.
    hand: VecDeque<Key>,
    bytes: usize,
}

impl Cache {
    pub fn new(budget: usize) -> Cache {
        Cache {
            budget,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn get(&self, key: Key) -> Option<Arc<Rows>> {
        let mut inner = lock(&self.inner);
        let (rows, _, read) = inner.blocks.get_mut(&key)?;
        *read = true;
        Some(rows.clone())
    }

    /// Keep `rows` under `key`, evicting others to stay in the budget; a block
    /// heavier than the whole budget is not kept.
    pub fn insert(&self, key: Key, rows: Arc<Rows>) {
        let weight = rows.weight();
        if weight > self.budget {
            return;
        }
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        if inner.blocks.contains_key(&key) {
            return;
        }
        while inner.bytes + weight > self.budget {
            let Some(oldest) = inner.hand.pop_front() else {
                break;
            };
            let Some(entry) = inner.blocks.get_mut(&oldest) else {
                continue;
            };
            if std::mem::take(&mut entry.2) {
                inner.hand.push_back(oldest);
                continue;
            }
            if let Some((_, w, _)) = inner.blocks.remove(&oldest) {
                inner.bytes -= w;
            }
        }
        inner.bytes += weight;
        inner.blocks.insert(key, (rows, weight, false));
        inner.hand.push_back(key);
    }

    /// Decoded bytes held.
    pub fn bytes(&self) -> usize {
        lock(&self.inner).bytes
    }
}

#[cfg(test)]
#[path = "tests/cache.rs"]
mod tests;
