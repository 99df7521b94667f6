//! A key's blocks in one run as places in the run's read order ([`ByNewest`]), so a
//! read takes the key's newest blocks from where its range starts without passing
//! over the key's other blocks or the run's blocks without the key ([`Places`]): a
//! sorted list of places for a key in few of the run's blocks, bits with a summary bit
//! a word for a key in many. Runs never change, so the places of the event names (and
//! property keys) read are kept with the run ([`Names`]): a page of events by name or
//! by a property then costs a lookup and a few steps a run whatever the run's size,
//! and only the first read of a name after
//! its run was written or opened decodes its entry. They are kept within a budget of
//! bytes a block of the run ([`NAMES_BYTES_A_BLOCK`]), the name read least recently
//! going first. A name a run does not have is kept too, as no places: asking for it
//! again decodes no page.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::table::{BlockRef, ByNewest};

/// A key is held as bits rather than a list once it names at least one in this many
/// of the run's blocks: a list's four bytes a place then cost more than the bits' one
/// a block, and a read's walk to the next set bit stays a few words long.
pub const WALK_SHARE: usize = 8;

/// The bytes a run keeps for its names' places, per block of the run: the bits of 64
/// names in every block, against the 36 bytes a block its table and order take.
pub const NAMES_BYTES_A_BLOCK: usize = 8;

/// What a held name costs beside its key and places: its map slot, `Arc` and counts.
const HELD_OVERHEAD: usize = 96;

/// Places in a run's read order (positions in [`ByNewest::order`]).
pub enum Places {
    /// Ascending.
    List(Vec<u32>),
    /// A bit a place; `summary` has a bit for each word of `words` that is not zero,
    /// so the next place is found past a long gap in a word a 4096 places.
    Bits { words: Vec<u64>, summary: Vec<u64> },
}

impl Places {
    /// The places of the blocks `ids` (ascending, each once) in the run whose table is
    /// `blocks` and read order `order`; ids the table does not have are left out.
    pub fn of(blocks: &[BlockRef], order: &ByNewest, ids: &[u64]) -> Places {
        let mut rows = Vec::with_capacity(ids.len());
        if ids.len() * WALK_SHARE < blocks.len() {
            rows.extend(
                ids.iter()
                    .filter_map(|&id| blocks.binary_search_by_key(&id, |b| b.id).ok()),
            );
        } else {
            // Most of the table: walked once along it rather than searched for each id.
            let mut at = 0;
            for &id in ids {
                while blocks.get(at).is_some_and(|b| b.id < id) {
                    at += 1;
                }
                if blocks.get(at).is_some_and(|b| b.id == id) {
                    rows.push(at);
                }
            }
        }
        let places = rows.into_iter().filter_map(|r| order.rank.get(r).copied());
        if ids.len() * WALK_SHARE < blocks.len() {
            let mut list: Vec<u32> = places.collect();
            list.sort_unstable();
            return Places::List(list);
        }
        let mut words = vec![0u64; blocks.len().div_ceil(64)];
        let mut summary = vec![0u64; words.len().div_ceil(64)];
        for p in places {
            let p = p as usize;
            words[p / 64] |= 1 << (p % 64);
            summary[p / 4096] |= 1 << (p / 64 % 64);
        }
        Places::Bits { words, summary }
    }

    /// The first place at or after `at`.
    pub fn next_from(&self, at: usize) -> Option<usize> {
        match self {
            Places::List(list) => {
                let i = list.partition_point(|&p| (p as usize) < at);
                list.get(i).map(|&p| p as usize)
            }
            Places::Bits { words, summary } => {
                let w = at / 64;
                let here = words.get(w)? & (!0u64 << (at % 64));
                if here != 0 {
                    return Some(w * 64 + here.trailing_zeros() as usize);
                }
                // The next word that is not zero, through the summary.
                let from = w + 1;
                let mut s = from / 64;
                let mut marks = summary.get(s)? & (!0u64 << (from % 64));
                while marks == 0 {
                    s += 1;
                    marks = *summary.get(s)?;
                }
                let w = s * 64 + marks.trailing_zeros() as usize;
                Some(w * 64 + words.get(w)?.trailing_zeros() as usize)
            }
        }
    }

    pub fn has(&self, place: usize) -> bool {
        match self {
            Places::List(list) => {
                u32::try_from(place).is_ok_and(|p| list.binary_search(&p).is_ok())
            }
            Places::Bits { words, .. } => words
                .get(place / 64)
                .is_some_and(|w| w & (1 << (place % 64)) != 0),
        }
    }

    pub fn is_empty(&self) -> bool {
        match self {
            Places::List(list) => list.is_empty(),
            Places::Bits { summary, .. } => summary.iter().all(|&w| w == 0),
        }
    }

    pub fn is_bits(&self) -> bool {
        matches!(self, Places::Bits { .. })
    }

    /// The bytes it holds.
    pub fn bytes(&self) -> usize {
        match self {
            Places::List(list) => list.capacity() * 4,
            Places::Bits { words, summary } => (words.capacity() + summary.capacity()) * 8,
        }
    }
}

/// The places of the names a run was read for, within its budget.
pub struct Names {
    budget: usize,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    /// Each name's places and when it was last read (by `clock`).
    by_key: HashMap<Vec<u8>, (Arc<Places>, u64)>,
    clock: u64,
    bytes: usize,
}

fn cost(key: &[u8], places: &Places) -> usize {
    key.len() + places.bytes() + HELD_OVERHEAD
}

impl Names {
    /// For a run of `blocks` blocks.
    pub fn new(blocks: usize) -> Names {
        Names {
            budget: blocks.saturating_mul(NAMES_BYTES_A_BLOCK),
            held: Mutex::default(),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, key: &[u8]) -> Option<Arc<Places>> {
        let mut held = self.held();
        held.clock += 1;
        let now = held.clock;
        let (places, read) = held.by_key.get_mut(key)?;
        *read = now;
        Some(places.clone())
    }

    /// Keep `places` for `key`, the names read least recently making room; a name
    /// larger than the whole budget is not kept.
    pub fn put(&self, key: &[u8], places: Arc<Places>) {
        let need = cost(key, &places);
        if need > self.budget {
            return;
        }
        let mut held = self.held();
        if let Some((old, _)) = held.by_key.remove(key) {
            held.bytes -= cost(key, &old);
        }
        while held.bytes + need > self.budget {
            let Some(oldest) = held
                .by_key
                .iter()
                .min_by_key(|(_, (_, read))| *read)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some((gone, _)) = held.by_key.remove(&oldest) {
                held.bytes -= cost(&oldest, &gone);
            }
        }
        held.clock += 1;
        let now = held.clock;
        held.bytes += need;
        held.by_key.insert(key.to_vec(), (places, now));
    }

    /// The bytes held.
    pub fn bytes(&self) -> usize {
        self.held().bytes
    }
}

#[cfg(test)]
#[path = "tests/names.rs"]
mod tests;
