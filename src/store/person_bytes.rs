//! Stored persons' bytes kept between the console's reads of persons newest first: a
//! search by a property tests up to 20,000 persons a page, and every search's first
//! page tests the same newest ones. Read from the persons' runs, each is a random
//! block read, checked and LZ4-decoded (4 KiB for one person of about 600 bytes),
//! most of such a page's time at a million persons; the runs' block cache, a tenth of
//! their size and shared with `/decide`, keeps few of them.
//!
//! A value is kept as read from the runs, for the runs it was read from: a read looks
//! in the table's delta first (the compactor's changes since the last fold, in
//! memory) and takes a kept value only while the same runs are current, so it answers
//! what [`Layered::get`] answers. A fold replaces the runs and so drops every kept
//! value; the runs are held weakly, so an old set's files are not kept open. Values in
//! the delta are not kept (they are in memory already). The bytes kept are bounded
//! ([`KEPT_BYTES`]), the oldest kept dropped first.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use sled::IVec;

use super::layered::{Layered, Runs};
use crate::support::sync::lock;

/// Bytes of persons kept: 20,000 persons (a page's bound) of posthog-js's usual
/// properties take about 13.7 MB with their keys and slots; the process is held to
/// 300 MB in all, so no more than a page's worth.
pub const KEPT_BYTES: usize = 16 * 1024 * 1024;
/// What a kept value costs beyond its key and bytes: the map's slot, the queue's.
const ENTRY_OVERHEAD: usize = 64;

/// The values kept, for one set of runs.
#[derive(Default)]
pub struct Kept {
    inner: Mutex<Inner>,
    capacity: usize,
}

#[derive(Default)]
struct Inner {
    runs: Weak<Runs>,
    values: HashMap<Box<[u8]>, IVec>,
    /// The keys in the order they were kept, oldest first.
    order: VecDeque<Box<[u8]>>,
    bytes: usize,
}

impl Inner {
    fn is_for(&self, runs: &Arc<Runs>) -> bool {
        self.runs.upgrade().is_some_and(|r| Arc::ptr_eq(&r, runs))
    }
}

/// The values the console's reads of persons keep.
pub fn global() -> &'static Kept {
    static KEPT: OnceLock<Kept> = OnceLock::new();
    KEPT.get_or_init(|| Kept::new(KEPT_BYTES))
}

impl Kept {
    pub fn new(capacity: usize) -> Kept {
        Kept {
            inner: Mutex::default(),
            capacity,
        }
    }

    /// The value of `key` in `table`, as [`Layered::get`] answers it.
    pub fn get(&self, table: &Layered, key: &[u8]) -> Option<IVec> {
        // The delta before the runs: see `layered`'s module docs.
        if let Some(v) = table.delta_get(key) {
            return (!v.is_empty()).then_some(v);
        }
        let runs = table.run()?;
        {
            let inner = lock(&self.inner);
            if inner.is_for(&runs) {
                if let Some(v) = inner.values.get(key) {
                    return Some(v.clone());
                }
            }
        }
        let value = IVec::from(runs.get(key)?);
        self.keep(&runs, key, &value);
        Some(value)
    }

    fn keep(&self, runs: &Arc<Runs>, key: &[u8], value: &IVec) {
        let weight = key.len() + value.len() + ENTRY_OVERHEAD;
        if weight > self.capacity {
            return;
        }
        let mut inner = lock(&self.inner);
        if !inner.is_for(runs) {
            *inner = Inner {
                runs: Arc::downgrade(runs),
                ..Inner::default()
            };
        }
        if inner.values.contains_key(key) {
            return;
        }
        while inner.bytes + weight > self.capacity {
            let Some(old) = inner.order.pop_front() else {
                break;
            };
            if let Some(v) = inner.values.remove(&old) {
                inner.bytes -= old.len() + v.len() + ENTRY_OVERHEAD;
            }
        }
        inner.values.insert(key.into(), value.clone());
        inner.order.push_back(key.into());
        inner.bytes += weight;
    }

    /// How many values are kept and their bytes (with their cost in the maps).
    pub fn held(&self) -> (usize, usize) {
        let inner = lock(&self.inner);
        (inner.values.len(), inner.bytes)
    }
}

#[cfg(test)]
#[path = "tests/person_bytes.rs"]
mod tests;
