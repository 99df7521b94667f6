//! A table's recent changes in memory, as an LSM keeps its memtable: the *active*
//! map, which writes go to, over the *frozen* one a fold is writing into the runs
//! (read until the new runs are in place). Both are ordered, so iteration pages
//! through them with the runs. What they hold is in the journal ([`super::journal`]),
//! from which a start fills them again.
//!
//! Each map's blocks (its nodes and long keys, and the values the chunks make for it)
//! are allocated in a heap of its own ([`heaps`]), from the freeze that starts the
//! map to its drop once folded, so the fold that drops it frees whole pages. The heap
//! goes with the map ([`Generation`]).
//!
//! The active map counts its own bytes as it changes ([`Delta::active_bytes`]): that,
//! not the bytes written to it, decides a fold, so a key rewritten five times between
//! folds counts once, as the map holds it once. It counts its memory too, estimated
//! entry by entry ([`entry_footprint`]), which the deltas' budget weighs
//! ([`Delta::memory`], `compactor::fold`).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use sled::IVec;

pub use super::key::Key;
use super::key::KEY_INLINE;
use crate::support::heaps::{self, Heap};

/// Keys to values; an empty value is a removal (the runs may hold the key).
pub type Map = BTreeMap<Key, IVec>;

/// What a write replaced, to put back if its chunk does not commit.
pub type Undo = Vec<(Key, Option<IVec>)>;

/// `entries` as a map (a later entry of a key replacing an earlier).
#[cfg(test)]
pub fn map_of(entries: impl IntoIterator<Item = (IVec, IVec)>) -> Map {
    entries
        .into_iter()
        .map(|(k, v)| (Key::from(&k[..]), v))
        .collect()
}

/// A map with the heap its blocks are allocated in: the map is dropped first, then
/// the heap, released once its owner next can ([`heaps::release`]).
pub struct Generation {
    map: Map,
    /// Held for its drop, after the map's.
    heap: Arc<Heap>,
}

impl std::ops::Deref for Generation {
    type Target = Map;

    fn deref(&self) -> &Map {
        &self.map
    }
}

#[derive(Default)]
pub struct Delta {
    active: Map,
    /// The heap of `active`'s blocks.
    heap: Arc<Heap>,
    /// Bytes of keys and values in `active`, kept as it changes.
    active_bytes: u64,
    /// About the memory `active` takes ([`entry_footprint`]), kept as it changes.
    active_memory: u64,
    frozen: Option<Arc<Generation>>,
    /// `active_memory` when the frozen map was frozen.
    frozen_memory: u64,
}

/// About the memory a delta's maps take ([`entry_footprint`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    pub active: u64,
    /// The map a fold is writing into the runs, dropped when it ends.
    pub frozen: u64,
}

impl Memory {
    pub fn total(&self) -> u64 {
        self.active + self.frozen
    }
}

fn size(k: &[u8], v: &IVec) -> u64 {
    (k.len() + v.len()) as u64
}

fn memory(k: &[u8], v: &IVec) -> u64 {
    entry_footprint(k.len(), v.len())
}

/// Bytes of keys and values in `map`.
pub fn bytes(map: &Map) -> u64 {
    map.iter().map(|(k, v)| size(k, v)).sum()
}

fn bounds(range: &(Bound<Vec<u8>>, Bound<Vec<u8>>)) -> (Bound<&[u8]>, Bound<&[u8]>) {
    (one(&range.0), one(&range.1))
}

fn one(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_slice()),
        Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

impl Delta {
    /// A delta whose active map is `active` (what a start read).
    pub fn new(active: Map) -> Delta {
        Delta {
            active_bytes: bytes(&active),
            active_memory: footprint_of(&active),
            active,
            heap: Arc::default(),
            frozen: None,
            frozen_memory: 0,
        }
    }

    /// The heap of the active map's blocks, for the values made for it (a chunk's).
    pub fn heap(&self) -> Arc<Heap> {
        self.heap.clone()
    }

    /// The map writes go to.
    pub fn active(&self) -> &Map {
        &self.active
    }

    /// What the delta holds for `key` (an empty value is a removal).
    pub fn get(&self, key: &[u8]) -> Option<IVec> {
        match self.active.get(key) {
            Some(v) => Some(v.clone()),
            None => self.frozen.as_ref()?.get(key).cloned(),
        }
    }

    /// Up to `limit` entries within `range`, the active map's over the frozen's.
    pub fn page(
        &self,
        range: &(Bound<Vec<u8>>, Bound<Vec<u8>>),
        limit: usize,
    ) -> Vec<(IVec, IVec)> {
        let r = bounds(range);
        let mut active = self.active.range::<[u8], _>(r).peekable();
        let empty = Map::new();
        let frozen = self.frozen.as_deref().map_or(&empty, |g| &g.map);
        let mut frozen = frozen.range::<[u8], _>(r).peekable();
        let mut out = Vec::new();
        while out.len() < limit {
            let next = match (active.peek(), frozen.peek()) {
                (None, None) => break,
                (Some(_), None) => active.next(),
                (None, Some(_)) => frozen.next(),
                (Some((a, _)), Some((f, _))) => match a.cmp(f) {
                    Ordering::Less => active.next(),
                    Ordering::Greater => frozen.next(),
                    Ordering::Equal => {
                        frozen.next();
                        active.next()
                    }
                },
            };
            if let Some((k, v)) = next {
                out.push((IVec::from(&k[..]), v.clone()));
            }
        }
        out
    }

    /// Write `entries` to the active map; what they replaced.
    pub fn stage(&mut self, entries: &[(IVec, IVec)]) -> Undo {
        let heap = self.heap.clone();
        heaps::within(&heap, || self.stage_here(entries))
    }

    fn stage_here(&mut self, entries: &[(IVec, IVec)]) -> Undo {
        let mut undo = Vec::with_capacity(entries.len());
        for (k, v) in entries {
            let key = Key::from(&k[..]);
            self.count_in(k, v);
            let old = self.active.insert(key.clone(), v.clone());
            if let Some(old) = &old {
                self.count_out(k, old);
            }
            undo.push((key, old));
        }
        undo
    }

    /// An entry of `k` and `v` enters the active map...
    fn count_in(&mut self, k: &[u8], v: &IVec) {
        self.active_bytes += size(k, v);
        self.active_memory += memory(k, v);
    }

    /// ... or leaves it.
    fn count_out(&mut self, k: &[u8], v: &IVec) {
        self.active_bytes -= size(k, v);
        self.active_memory -= memory(k, v);
    }

    /// Put back what [`Delta::stage`] replaced, newest first.
    pub fn unstage(&mut self, undo: Undo) {
        let heap = self.heap.clone();
        heaps::within(&heap, || self.unstage_here(undo))
    }

    fn unstage_here(&mut self, undo: Undo) {
        for (k, old) in undo.into_iter().rev() {
            let now = match old {
                Some(v) => {
                    self.count_in(&k, &v);
                    self.active.insert(k.clone(), v)
                }
                None => self.active.remove(&k),
            };
            if let Some(now) = now {
                self.count_out(&k, &now);
            }
        }
    }

    /// The active map becomes the frozen one, which a fold writes into the runs;
    /// reads still see it until [`Delta::unfreeze`]. The new active map starts a heap
    /// of its own.
    pub fn freeze(&mut self) -> Arc<Generation> {
        // A fold that failed or panicked thaws its map (see fold.rs); should one ever
        // leave it frozen, it goes back under this one rather than being lost.
        self.thaw();
        let frozen = Arc::new(Generation {
            map: std::mem::take(&mut self.active),
            heap: std::mem::take(&mut self.heap),
        });
        self.active_bytes = 0;
        self.frozen_memory = std::mem::take(&mut self.active_memory);
        self.frozen = Some(frozen.clone());
        frozen
    }

    /// The fold is done: the frozen map is dropped (the runs hold it now) and `left`,
    /// what the runs did not take, goes under whatever was written since the freeze.
    /// `left` is built by the caller, outside the lock; here each of its keys is
    /// looked up once in the active map (usually it is empty), so the lock is held a
    /// moment however much the compactor wrote during the fold.
    pub fn unfreeze(&mut self, left: Map) {
        for (k, v) in left {
            if let std::collections::btree_map::Entry::Vacant(e) = self.active.entry(k) {
                self.active_bytes += size(e.key(), &v);
                self.active_memory += memory(e.key(), &v);
                e.insert(v);
            }
        }
        self.frozen = None;
        self.frozen_memory = 0;
    }

    /// The frozen map back under the active one (a fold that failed). Its entries
    /// moved into the active map stay valid once its heap is released (their pages
    /// go to the owner thread's own heap).
    pub fn thaw(&mut self) {
        if let Some(frozen) = self.frozen.take() {
            let frozen = match Arc::try_unwrap(frozen) {
                Ok(generation) => generation.map,
                Err(shared) => shared.map.clone(),
            };
            self.unfreeze(frozen);
        }
    }

    /// Whether both maps are empty.
    pub fn is_empty(&self) -> bool {
        self.active.is_empty() && self.frozen.as_ref().is_none_or(|f| f.is_empty())
    }

    /// Entries in both maps, counting a key once.
    pub fn len(&self) -> usize {
        self.page(&(Bound::Unbounded, Bound::Unbounded), usize::MAX)
            .len()
    }

    /// Bytes of keys and values in the active map, a key counted once however often
    /// it was written.
    pub fn active_bytes(&self) -> u64 {
        self.active_bytes
    }

    /// About the bytes both maps take in memory: their nodes and what each key and
    /// value holds outside them ([`entry_footprint`]).
    pub fn footprint(&self) -> u64 {
        self.memory().total()
    }

    /// [`Delta::footprint`] by map, kept as they change.
    pub fn memory(&self) -> Memory {
        Memory {
            active: self.active_memory,
            frozen: self.frozen_memory,
        }
    }

    /// Bytes committed in the maps' own heaps' pages ([`heaps`]): what the compactor
    /// allocated for them, as mimalloc holds it. Zero without the binary's allocator.
    pub fn heap_bytes(&self) -> u64 {
        let frozen = self.frozen.as_deref().map_or(0, |g| g.heap.committed());
        self.heap.committed() + frozen
    }
}

/// An `IVec` longer than this is kept on the heap behind a counted pointer; shorter
/// ones sit inside it (sled's `CUTOFF`).
const IVEC_INLINE: usize = 22;
/// A heap `IVec`'s reference count, before its bytes.
const IVEC_HEADER: usize = 8;
/// Entries a B-tree leaf holds at most (std's `CAPACITY`)...
const BTREE_NODE_ENTRIES: usize = 11;
/// ... and holds on average when filled in random order: about ln 2 of it, so a leaf
/// of 11 slots carries about 7.6 entries; the internal nodes add about an eighth.
const BTREE_FILL_PERCENT: usize = 69;
const BTREE_INTERNAL_PERCENT: usize = 12;

fn footprint_of(map: &Map) -> u64 {
    map.iter()
        .map(|(k, v)| entry_footprint(k.len(), v.len()))
        .sum()
}

/// About the bytes one entry of `key_len` and `value_len` takes in a [`Map`]: its share
/// of a B-tree node (a [`Key`] and an `IVec` slot in a node filled to
/// [`BTREE_FILL_PERCENT`], plus the node's header and the internal nodes above it) and
/// the heap copies of a key or value too long to sit inline, rounded as an allocator
/// rounds them. The bytes of keys and values alone understate it two to three times
/// for short keys and values.
pub fn entry_footprint(key_len: usize, value_len: usize) -> u64 {
    let slot = std::mem::size_of::<Key>() + std::mem::size_of::<IVec>();
    let node = BTREE_NODE_ENTRIES * slot + 16;
    let share = node * 100 / (BTREE_NODE_ENTRIES * BTREE_FILL_PERCENT);
    let share = share * (100 + BTREE_INTERNAL_PERCENT) / 100;
    let key = match key_len {
        0..=KEY_INLINE => 0,
        _ => size_class(key_len),
    };
    let value = match value_len {
        0..=IVEC_INLINE => 0,
        _ => size_class(value_len + IVEC_HEADER),
    };
    (share + key + value) as u64
}

/// `n` bytes in the allocator's size class (steps of 16 bytes up to 128, then of an
/// eighth).
fn size_class(n: usize) -> usize {
    if n <= 128 {
        return n.div_ceil(16) * 16;
    }
    let step = (n.next_power_of_two() / 8).max(16);
    n.div_ceil(step) * step
}

#[cfg(test)]
#[path = "tests/footprint.rs"]
mod tests;

#[cfg(test)]
#[path = "tests/generations.rs"]
mod generations;
