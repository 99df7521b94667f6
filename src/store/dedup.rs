//! Deduplication by uuid without a key per event: an exact in-memory window of the
//! uuids stored recently, persisted compactly in the `recent_ids` tree.
//!
//! The compactor writes one `recent_ids` entry per chunk in the chunk's own
//! transaction, so after a crash the window reloads exactly as committed. The entry
//! names the event blocks the chunk stored (its ids, [`encode_ranges`]): their uuids
//! are the chunk's, so a start reads them from the blocks rather than keeping every
//! uuid twice on disk. Databases written before hold the uuids themselves (sorted and
//! packed, [`encode`]); both load. In memory, new uuids go to a hash set; once it holds
//! [`SEGMENT_IDS`] or grows old it is frozen into a sorted array, and whole frozen
//! segments are dropped once their newest uuid is older than the window's age or the
//! rest of the window still holds the count. A uuid that arrived within the window is
//! therefore always found: the window is a lower bound, never an upper one.
//!
//! Membership costs the same however many segments the window holds: a uuid outside
//! every frozen uuid of its project (a new time-ordered one) is answered by two
//! comparisons, any other by one [`table::Table`] of fingerprints over all segments,
//! whose matches are confirmed in the segment named. It takes 16 bytes a uuid for the
//! segments and 4 to 8 for the table's slots (2,000,000 uuids: 32 and 16 MiB).

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use sled::IVec;

use super::keys;

mod entry;
mod table;

pub use entry::{decode, decode_ranges, encode, encode_ranges, uuids_of_blocks};

/// Uuids per frozen segment: small enough that dropping one forgets little, large
/// enough that sorting one and dropping one (its uuids leave the table) are rare.
const SEGMENT_IDS: usize = 65_536;
/// A larger window has larger segments, so that those frozen by count leave most of
/// the table's generations ([`table::GENERATIONS`]) to those frozen by age.
const MAX_COUNTED_SEGMENTS: usize = 64;
/// The hash set is frozen at this fraction of the window's age at the latest, so age
/// pruning works in steps of an hour (for the default day) even at low traffic.
const SEGMENT_AGE_FRACTION: i64 = 24;
/// Chunk entries of the hash set are rewritten as one `recent_ids` entry past this,
/// so the tree holds few keys however small the chunks are.
const MAX_ENTRIES_PER_SEGMENT: usize = 256;

/// A project and a uuid.
pub type Id = (u64, u128);

/// Hashes ids by mixing their bits: uuids are random already, SipHash is not needed.
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(23) ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_u128(&mut self, x: u128) {
        self.write_u64(x as u64);
        self.write_u64((x >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
}

pub type IdSet = HashSet<Id, BuildHasherDefault<IdHasher>>;

/// The uuids of one segment, sorted by project then uuid, with each project's range.
struct Frozen {
    /// Its place in the table: generations count up by one a segment.
    generation: u8,
    /// Arrival time of the newest uuid in it.
    newest: i64,
    /// Its `recent_ids` keys, deleted with it.
    keys: Vec<IVec>,
    projects: Vec<(u64, usize, usize)>,
    ids: Box<[u128]>,
}

impl Frozen {
    /// Its (project, uuid) pairs, in order.
    fn entries(&self) -> impl Iterator<Item = Id> + '_ {
        self.projects.iter().flat_map(|&(project, start, end)| {
            self.ids[start..end].iter().map(move |&id| (project, id))
        })
    }

    fn contains(&self, (project, id): Id) -> bool {
        self.projects
            .iter()
            .find(|(p, _, _)| *p == project)
            .is_some_and(|&(_, start, end)| {
                let ids = &self.ids[start..end];
                // Time-ordered (v7) uuids of older segments fail the range check.
                ids.first().is_some_and(|&lo| lo <= id)
                    && ids.last().is_some_and(|&hi| id <= hi)
                    && ids.binary_search(&id).is_ok()
            })
    }
}

/// The hash set new uuids go to, and the `recent_ids` entries it came from.
#[derive(Default)]
struct Active {
    ids: IdSet,
    oldest: Option<i64>,
    newest: i64,
    keys: Vec<IVec>,
    /// The block ids its entries name, while every entry names blocks.
    ranges: Vec<(u64, u64)>,
    /// An entry holding uuids (an earlier format) joined: a combined entry holds uuids.
    has_uuids: bool,
}

pub struct Window {
    max_age_ms: i64,
    max_ids: usize,
    active: Active,
    frozen: VecDeque<Frozen>,
    frozen_len: usize,
    /// Every frozen uuid by fingerprint.
    table: table::Table,
    next_generation: u8,
    /// Per project, the least and greatest frozen uuid.
    bounds: Vec<(u64, u128, u128)>,
}

/// Changes the window asks of the `recent_ids` tree, in order: entries of dropped
/// segments to delete, small entries rewritten as one. Applying them late or twice is
/// harmless: the window in memory already reflects them.
#[derive(Debug, Default)]
pub struct Rewrite {
    ops: Vec<(IVec, Option<Vec<u8>>)>,
}

impl Rewrite {
    fn remove(&mut self, key: IVec) {
        self.ops.push((key, None));
    }

    fn insert(&mut self, key: IVec, value: Vec<u8>) {
        self.ops.push((key, Some(value)));
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Deletions asked for (a rewrite deletes the entries it replaces).
    pub fn removals(&self) -> usize {
        self.ops.iter().filter(|(_, v)| v.is_none()).count()
    }

    /// Apply to the tree atomically.
    pub fn apply(self, tree: &sled::Tree) -> Result<(), sled::Error> {
        if self.ops.is_empty() {
            return Ok(());
        }
        let mut batch = sled::Batch::default();
        for (k, v) in self.ops {
            match v {
                Some(v) => batch.insert(k, v),
                None => batch.remove(k),
            }
        }
        tree.apply_batch(batch)
    }
}

impl Window {
    pub fn new(max_age_ms: i64, max_ids: usize) -> Window {
        Window {
            max_age_ms: max_age_ms.max(1),
            max_ids,
            active: Active::default(),
            frozen: VecDeque::new(),
            frozen_len: 0,
            table: table::Table::default(),
            next_generation: 0,
            bounds: Vec::new(),
        }
    }

    /// The window as last committed: every entry of `recent_ids` still within it. Old
    /// entries are deleted from the tree.
    /// `uuids_of` reads the uuids of the blocks entries name ([`uuids_of_blocks`]).
    pub fn load(
        tree: &sled::Tree,
        max_age_ms: i64,
        max_ids: usize,
        now: i64,
        uuids_of: impl FnOnce(
            &[(u64, u64)],
        ) -> Result<std::collections::HashMap<u64, Vec<Id>>, sled::Error>,
    ) -> Result<Window, sled::Error> {
        let mut w = Window::new(max_age_ms, max_ids);
        let cutoff = now - w.max_age_ms;
        // Changes are applied once the tree has been read, not while reading it.
        let mut changes = Rewrite::default();
        let mut entries = Vec::new();
        for entry in tree.iter() {
            let (key, value) = entry?;
            let arrival = key
                .get(..8)
                .and_then(|t| t.try_into().ok())
                .map(keys::time_from);
            let content = match decode_ranges(&value) {
                Some(ranges) => Some(Err(ranges)),
                None => decode(&value).map(Ok),
            };
            match (arrival, content) {
                (Some(at), Some(content)) if at >= cutoff => entries.push((key, at, content)),
                _ => changes.remove(key),
            }
        }
        let ranges: Vec<(u64, u64)> = entries
            .iter()
            .filter_map(|(_, _, c)| c.as_ref().err())
            .flatten()
            .copied()
            .collect();
        let by_block = match ranges.is_empty() {
            true => Default::default(),
            false => uuids_of(&ranges)?,
        };
        for (key, at, content) in entries {
            let more = match content {
                Ok(ids) => w.insert(key, at, &ids, None, now),
                Err(ranges) => {
                    let ids: Vec<Id> = ranges
                        .iter()
                        .flat_map(|&(first, end)| first..end)
                        .filter_map(|block| by_block.get(&block))
                        .flatten()
                        .copied()
                        .collect();
                    w.insert(key, at, &ids, Some(&ranges), now)
                }
            };
            changes.ops.extend(more.ops);
        }
        changes.apply(tree)?;
        Ok(w)
    }

    /// The same window with fingerprints of `bits` bits, so that uuids share them.
    #[cfg(test)]
    fn with_fingerprint_bits(mut self, bits: u32) -> Window {
        self.table = table::Table::default().with_fingerprint_bits(bits);
        self
    }

    pub fn len(&self) -> usize {
        self.frozen_len + self.active.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// About the bytes it takes in memory: the hash set (a slot and a control byte a
    /// place), the frozen segments' uuids and the fingerprint table.
    pub fn footprint(&self) -> usize {
        let set = self.active.ids.capacity() * (std::mem::size_of::<Id>() + 1);
        let frozen: usize = self
            .frozen
            .iter()
            .map(|f| f.ids.len() * std::mem::size_of::<u128>())
            .sum();
        set + frozen + self.table.bytes()
    }

    pub fn contains(&self, id: Id) -> bool {
        self.active.ids.contains(&id) || self.frozen_contains(id)
    }

    fn frozen_contains(&self, id: Id) -> bool {
        let (project, uuid) = id;
        let within = self
            .bounds
            .iter()
            .any(|&(p, lo, hi)| p == project && lo <= uuid && uuid <= hi);
        let Some(first) = self.frozen.front().map(|s| s.generation) else {
            return false;
        };
        within
            && self.table.any(table::hash(id), |g| {
                let segment = self.frozen.get(usize::from(g.wrapping_sub(first)));
                segment.is_some_and(|s| s.contains(id))
            })
    }

    fn recompute_bounds(&mut self) {
        self.bounds.clear();
        for s in &self.frozen {
            for &(project, start, end) in &s.projects {
                let (Some(&lo), Some(&hi)) = (s.ids.get(start), s.ids.get(end - 1)) else {
                    continue;
                };
                match self.bounds.iter_mut().find(|b| b.0 == project) {
                    Some(b) => *b = (project, b.1.min(lo), b.2.max(hi)),
                    None => self.bounds.push((project, lo, hi)),
                }
            }
        }
    }

    /// Add a committed chunk's uuids, stored under `key` at `arrival` (its entry names
    /// the blocks `ranges`, or holds the uuids); returns what the tree should do
    /// (rewrite small entries as one, drop old ones).
    pub fn insert(
        &mut self,
        key: IVec,
        arrival: i64,
        ids: &[Id],
        ranges: Option<&[(u64, u64)]>,
        now: i64,
    ) -> Rewrite {
        let mut batch = Rewrite::default();
        // Measured from this chunk's arrival, not `now`: reloading entries hours old
        // must not freeze each into a segment of its own.
        let too_old = self
            .active
            .oldest
            .is_some_and(|t| t < arrival - self.max_age_ms / SEGMENT_AGE_FRACTION);
        if too_old {
            self.freeze();
        }
        let a = &mut self.active;
        a.ids.extend(ids.iter().copied());
        a.oldest = Some(a.oldest.map_or(arrival, |t| t.min(arrival)));
        a.newest = a.newest.max(arrival);
        a.keys.push(key);
        match ranges {
            Some(r) => a.ranges.extend_from_slice(r),
            None => a.has_uuids = true,
        }
        if a.keys.len() > MAX_ENTRIES_PER_SEGMENT {
            self.combine(&mut batch);
        }
        if self.active.ids.len() >= self.max_ids.div_ceil(MAX_COUNTED_SEGMENTS).max(SEGMENT_IDS) {
            self.freeze();
        }
        self.prune_into(now, &mut batch);
        batch
    }

    /// Rewrite the hash set's entries as one, keyed by its newest arrival.
    fn combine(&mut self, batch: &mut Rewrite) {
        let a = &mut self.active;
        let Some(first_id) = a.keys.first().and_then(|k| k.get(8..16)) else {
            return;
        };
        let mut id = [0u8; 8];
        id.copy_from_slice(first_id);
        let key = IVec::from(&keys::recent(a.newest, u64::from_be_bytes(id))[..]);
        let value = match a.has_uuids {
            false => {
                // Runs that meet are one.
                a.ranges.sort_unstable();
                let mut merged: Vec<(u64, u64)> = Vec::with_capacity(a.ranges.len());
                for &(first, end) in &a.ranges {
                    match merged.last_mut() {
                        Some(last) if first <= last.1 => last.1 = last.1.max(end),
                        _ => merged.push((first, end)),
                    }
                }
                a.ranges = merged;
                encode_ranges(&a.ranges)
            }
            true => encode(&a.ids.iter().copied().collect::<Vec<_>>()),
        };
        for k in a.keys.drain(..) {
            batch.remove(k);
        }
        batch.insert(key.clone(), value);
        a.keys.push(key);
    }

    fn freeze(&mut self) {
        let active = std::mem::take(&mut self.active);
        if active.ids.is_empty() {
            return;
        }
        let fresh: Vec<Id> = active.ids.into_iter().collect();
        if !self.table.has_room(fresh.len()) {
            self.rebuild_table(fresh.len());
        }
        let (mut keys, mut newest) = (active.keys, active.newest);
        // With every generation the table tells apart in use (segments frozen by age
        // faster than they expire), the newest segment takes the uuids in.
        let last = match self.frozen.len() + 1 >= table::GENERATIONS {
            true => self.frozen.pop_back(),
            false => None,
        };
        let (generation, mut all) = match last {
            Some(last) => {
                let all = last.entries().collect();
                let mut older = last.keys;
                older.append(&mut keys);
                keys = older;
                newest = newest.max(last.newest);
                (last.generation, all)
            }
            None => {
                let generation = self.next_generation;
                self.next_generation = generation.wrapping_add(1);
                (generation, Vec::with_capacity(fresh.len()))
            }
        };
        for &id in &fresh {
            self.table.insert(table::hash(id), generation);
        }
        self.frozen_len += fresh.len();
        all.extend(fresh);
        all.sort_unstable();
        let mut projects = Vec::new();
        let mut start = 0;
        for run in all.chunk_by(|a, b| a.0 == b.0) {
            projects.push((run[0].0, start, start + run.len()));
            start += run.len();
        }
        self.frozen.push_back(Frozen {
            generation,
            newest,
            keys,
            projects,
            ids: all.into_iter().map(|(_, id)| id).collect(),
        });
        self.recompute_bounds();
    }

    /// Build the table again from the segments, with room for `more`: it does not
    /// grow by itself, and this drops its tombstones.
    fn rebuild_table(&mut self, more: usize) {
        self.table.reset(self.frozen_len + more);
        for segment in &self.frozen {
            for id in segment.entries() {
                self.table.insert(table::hash(id), segment.generation);
            }
        }
    }

    /// Drop the segments past the window's age, and the oldest while the rest still
    /// hold `max_ids`; returns their entries to delete.
    pub fn prune(&mut self, now: i64) -> Rewrite {
        let mut batch = Rewrite::default();
        self.prune_into(now, &mut batch);
        batch
    }

    fn prune_into(&mut self, now: i64, batch: &mut Rewrite) {
        let cutoff = now - self.max_age_ms;
        let mut dropped = false;
        while let Some(oldest) = self.frozen.front() {
            let rest = self.len() - oldest.ids.len();
            if oldest.newest >= cutoff && rest < self.max_ids {
                break;
            }
            self.frozen_len -= oldest.ids.len();
            if let Some(gone) = self.frozen.pop_front() {
                for id in gone.entries() {
                    self.table.remove(table::hash(id), gone.generation);
                }
                for k in gone.keys {
                    batch.remove(k);
                }
                dropped = true;
            }
        }
        if dropped {
            self.recompute_bounds();
        }
    }
}

#[cfg(test)]
#[path = "tests/dedup.rs"]
mod tests;

#[cfg(test)]
#[path = "tests/dedup_entries.rs"]
mod entries_tests;

#[cfg(test)]
#[path = "tests/dedup_ages.rs"]
mod ages_tests;
