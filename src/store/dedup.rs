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
//! whose matches are confirmed in the segment named. A segment's uuids are on disk
//! ([`segment`]: a scratch file, unlinked, in [`DIR_NAME`]), so a confirmation is one
//! read of 4 KiB; in memory the window takes 4 to 8 bytes a uuid for the table's
//! slots and about 0.1 for the segments' sparse indexes (2,000,000 uuids: 16 MiB, and
//! 32 MiB on disk). A read that fails (the file damaged) is an error: the window is
//! then dropped and loaded again from the database, never answered from.

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};

use sled::IVec;

use super::keys;

mod entry;
mod hash;
mod rewrite;
mod segment;
mod table;

pub use entry::{decode, decode_ranges, encode, encode_ranges, uuids_of_blocks};
pub use hash::{IdHasher, IdSet};
pub use rewrite::Rewrite;

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

/// The directory of the segments' files, in the database's: emptied at every load.
pub const DIR_NAME: &str = "dedup";

/// A project and a uuid.
pub type Id = (u64, u128);

/// Why the window could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] sled::Error),
    /// Writing or reading a segment's file failed (a full disk, say, or damage).
    #[error("the deduplication window's segment files: {0}")]
    Segments(#[from] io::Error),
}

/// The uuids of one segment, sorted by project then uuid, on disk.
struct Frozen {
    /// Its place in the table: generations count up by one a segment.
    generation: u8,
    /// Arrival time of the newest uuid in it.
    newest: i64,
    /// Its `recent_ids` keys, deleted with it.
    keys: Vec<IVec>,
    ids: segment::Segment,
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

/// After any of its methods returned an error the window may be wrong: drop it and
/// load it again ([`Window::load`]).
pub struct Window {
    /// Where its segments' files are made.
    dir: PathBuf,
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

impl Window {
    /// An empty window whose segments' files are made in `dir`.
    pub fn new(dir: &Path, max_age_ms: i64, max_ids: usize) -> Window {
        Window {
            dir: dir.to_path_buf(),
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
    /// entries are deleted from the tree. `dir` is emptied of earlier segments' files
    /// (made if missing) and takes the new ones.
    /// `uuids_of` reads the uuids of the blocks entries name ([`uuids_of_blocks`]).
    pub fn load(
        tree: &sled::Tree,
        dir: &Path,
        max_age_ms: i64,
        max_ids: usize,
        now: i64,
        uuids_of: impl FnOnce(
            &[(u64, u64)],
        ) -> Result<std::collections::HashMap<u64, Vec<Id>>, sled::Error>,
    ) -> Result<Window, Error> {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e.into()),
            _ => std::fs::create_dir_all(dir)?,
        }
        let mut w = Window::new(dir, max_age_ms, max_ids);
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
                Ok(ids) => w.insert(key, at, &ids, None, now)?,
                Err(ranges) => {
                    let ids: Vec<Id> = ranges
                        .iter()
                        .flat_map(|&(first, end)| first..end)
                        .filter_map(|block| by_block.get(&block))
                        .flatten()
                        .copied()
                        .collect();
                    w.insert(key, at, &ids, Some(&ranges), now)?
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

    /// Test hook: damage every frozen segment's file; returns how many there are.
    #[cfg(test)]
    pub(crate) fn damage_segments(&self) -> usize {
        for f in &self.frozen {
            f.ids.damage(0, &[0xff; 16]).unwrap();
        }
        self.frozen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// About the bytes it takes in memory: the hash set (a slot and a control byte a
    /// place), the frozen segments' sparse indexes and the fingerprint table.
    pub fn footprint(&self) -> usize {
        let set = self.active.ids.capacity() * (std::mem::size_of::<Id>() + 1);
        let frozen: usize = self.frozen.iter().map(|f| f.ids.bytes()).sum();
        set + frozen + self.table.bytes()
    }

    /// Whether the window holds `id`: a read of a segment's file only when a
    /// fingerprint matches.
    pub fn contains(&self, id: Id) -> io::Result<bool> {
        match self.active.ids.contains(&id) {
            true => Ok(true),
            false => self.frozen_contains(id),
        }
    }

    fn frozen_contains(&self, id: Id) -> io::Result<bool> {
        let (project, uuid) = id;
        let within = self
            .bounds
            .iter()
            .any(|&(p, lo, hi)| p == project && lo <= uuid && uuid <= hi);
        let Some(first) = self.frozen.front().map(|s| s.generation) else {
            return Ok(false);
        };
        if !within {
            return Ok(false);
        }
        let mut failed = None;
        let found = self.table.any(table::hash(id), |g| {
            let segment = self.frozen.get(usize::from(g.wrapping_sub(first)));
            match segment.map(|s| s.ids.contains(id)) {
                Some(Ok(found)) => found,
                None => false,
                // Stop at the first failure: it is the answer.
                Some(Err(e)) => {
                    failed = Some(e);
                    true
                }
            }
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(found),
        }
    }

    fn recompute_bounds(&mut self) {
        self.bounds.clear();
        for s in &self.frozen {
            for (project, lo, hi) in s.ids.bounds() {
                match self.bounds.iter_mut().find(|b| b.0 == project) {
                    Some(b) => *b = (project, b.1.min(lo), b.2.max(hi)),
                    None => self.bounds.push((project, lo, hi)),
                }
            }
        }
    }

    /// Add a committed chunk's uuids, stored under `key` at `arrival` (its entry names
    /// the blocks `ranges`, or holds the uuids); returns what the tree should do
    /// (rewrite small entries as one, drop old ones). It fails when a segment's file
    /// cannot be written or read.
    pub fn insert(
        &mut self,
        key: IVec,
        arrival: i64,
        ids: &[Id],
        ranges: Option<&[(u64, u64)]>,
        now: i64,
    ) -> io::Result<Rewrite> {
        let mut batch = Rewrite::default();
        // Measured from this chunk's arrival, not `now`: reloading entries hours old
        // must not freeze each into a segment of its own.
        let too_old = self
            .active
            .oldest
            .is_some_and(|t| t < arrival - self.max_age_ms / SEGMENT_AGE_FRACTION);
        if too_old {
            self.freeze()?;
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
            self.freeze()?;
        }
        self.prune_into(now, &mut batch)?;
        Ok(batch)
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

    fn freeze(&mut self) -> io::Result<()> {
        if self.active.ids.is_empty() {
            return Ok(());
        }
        // The emptied set keeps its room for the next segment's uuids: grown again
        // from nothing, it was rehashed seven times a segment.
        let mut set = std::mem::take(&mut self.active.ids);
        let active = std::mem::take(&mut self.active);
        let fresh: Vec<Id> = set.drain().collect();
        self.active.ids = set;
        if !self.table.has_room(fresh.len()) {
            self.rebuild_table(fresh.len())?;
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
                let mut all = Vec::with_capacity(last.ids.len() + fresh.len());
                last.ids.for_each(|id| all.push(id))?;
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
        let ids = segment::Segment::write(&self.dir, &all)?;
        self.frozen.push_back(Frozen {
            generation,
            newest,
            keys,
            ids,
        });
        self.recompute_bounds();
        Ok(())
    }

    /// Build the table again from the segments, with room for `more`: it does not
    /// grow by itself, and this drops its tombstones.
    fn rebuild_table(&mut self, more: usize) -> io::Result<()> {
        self.table.reset(self.frozen_len + more);
        for segment in &self.frozen {
            let slots = &mut self.table;
            segment
                .ids
                .for_each(|id| slots.insert(table::hash(id), segment.generation))?;
        }
        Ok(())
    }

    /// Drop the segments past the window's age, and the oldest while the rest still
    /// hold `max_ids`; returns their entries to delete.
    pub fn prune(&mut self, now: i64) -> io::Result<Rewrite> {
        let mut batch = Rewrite::default();
        self.prune_into(now, &mut batch)?;
        Ok(batch)
    }

    fn prune_into(&mut self, now: i64, batch: &mut Rewrite) -> io::Result<()> {
        let cutoff = now - self.max_age_ms;
        let mut dropped = false;
        while let Some(oldest) = self.frozen.front() {
            let rest = self.len() - oldest.ids.len();
            if oldest.newest >= cutoff && rest < self.max_ids {
                break;
            }
            self.frozen_len -= oldest.ids.len();
            if let Some(gone) = self.frozen.pop_front() {
                let slots = &mut self.table;
                gone.ids
                    .for_each(|id| slots.remove(table::hash(id), gone.generation))?;
                for k in gone.keys {
                    batch.remove(k);
                }
                dropped = true;
            }
        }
        if dropped {
            self.recompute_bounds();
        }
        Ok(())
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

#[cfg(test)]
#[path = "tests/dedup_files.rs"]
mod files_tests;
