//! Deduplication by uuid without a key per event: an exact in-memory window of the
//! uuids stored recently, persisted compactly in the `recent_ids` tree.
//!
//! The compactor writes one `recent_ids` entry per chunk (the chunk's stored uuids,
//! sorted and packed) in the chunk's own transaction, so after a crash the window
//! reloads exactly as committed. In memory, new uuids go to a hash set; once it holds
//! [`SEGMENT_IDS`] or grows old it is frozen into a sorted array (binary search), and
//! whole frozen segments are dropped once their newest uuid is older than the window's
//! age or the rest of the window still holds the count. A uuid that arrived within the
//! window is therefore always found: the window is a lower bound, never an upper one.

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use sled::IVec;

use super::keys;

/// Uuids per frozen segment: few enough segments that a lookup stays cheap, small
/// enough that dropping one forgets little.
const SEGMENT_IDS: usize = 65_536;
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

/// The uuids of a chunk as one `recent_ids` value: per project (ascending), the
/// project (u64 LE), a count (u32 LE) and that many uuids (16 bytes), ascending.
pub fn encode(ids: &[Id]) -> Vec<u8> {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = Vec::with_capacity(16 * sorted.len() + 16);
    for run in sorted.chunk_by(|a, b| a.0 == b.0) {
        out.extend_from_slice(&run[0].0.to_le_bytes());
        out.extend_from_slice(&(run.len() as u32).to_le_bytes());
        for (_, id) in run {
            out.extend_from_slice(&id.to_be_bytes());
        }
    }
    out
}

pub fn decode(mut bytes: &[u8]) -> Option<Vec<Id>> {
    let mut out = Vec::with_capacity(bytes.len() / 16);
    while !bytes.is_empty() {
        let project = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
        let n = u32::from_le_bytes(bytes.get(8..12)?.try_into().ok()?) as usize;
        let ids = bytes.get(12..12 + n.checked_mul(16)?)?;
        for id in ids.chunks_exact(16) {
            out.push((project, u128::from_be_bytes(id.try_into().ok()?)));
        }
        bytes = &bytes[12 + 16 * n..];
    }
    Some(out)
}

/// The uuids of one segment, sorted by project then uuid, with each project's range.
struct Frozen {
    /// Arrival time of the newest uuid in it.
    newest: i64,
    /// Its `recent_ids` keys, deleted with it.
    keys: Vec<IVec>,
    projects: Vec<(u64, usize, usize)>,
    ids: Box<[u128]>,
}

impl Frozen {
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
}

pub struct Window {
    max_age_ms: i64,
    max_ids: usize,
    active: Active,
    frozen: VecDeque<Frozen>,
    frozen_len: usize,
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
        }
    }

    /// The window as last committed: every entry of `recent_ids` still within it. Old
    /// entries are deleted from the tree.
    pub fn load(
        tree: &sled::Tree,
        max_age_ms: i64,
        max_ids: usize,
        now: i64,
    ) -> Result<Window, sled::Error> {
        let mut w = Window::new(max_age_ms, max_ids);
        let cutoff = now - w.max_age_ms;
        // Changes are applied once the tree has been read, not while reading it.
        let mut changes = Rewrite::default();
        for entry in tree.iter() {
            let (key, value) = entry?;
            let arrival = key
                .get(..8)
                .and_then(|t| t.try_into().ok())
                .map(keys::time_from);
            match (arrival, decode(&value)) {
                (Some(at), Some(ids)) if at >= cutoff => {
                    let more = w.insert(key, at, &ids, now);
                    changes.ops.extend(more.ops);
                }
                _ => changes.remove(key),
            }
        }
        changes.apply(tree)?;
        Ok(w)
    }

    pub fn len(&self) -> usize {
        self.frozen_len + self.active.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn contains(&self, id: Id) -> bool {
        self.active.ids.contains(&id) || self.frozen.iter().any(|s| s.contains(id))
    }

    /// Add a committed chunk's uuids, stored under `key` at `arrival`; returns what
    /// the tree should do (rewrite small entries as one, drop old ones).
    pub fn insert(&mut self, key: IVec, arrival: i64, ids: &[Id], now: i64) -> Rewrite {
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
        if a.keys.len() > MAX_ENTRIES_PER_SEGMENT {
            self.combine(&mut batch);
        }
        if self.active.ids.len() >= SEGMENT_IDS {
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
        let ids: Vec<Id> = a.ids.iter().copied().collect();
        for k in a.keys.drain(..) {
            batch.remove(k);
        }
        batch.insert(key.clone(), encode(&ids));
        a.keys.push(key);
    }

    fn freeze(&mut self) {
        let active = std::mem::take(&mut self.active);
        if active.ids.is_empty() {
            return;
        }
        let mut all: Vec<Id> = active.ids.into_iter().collect();
        all.sort_unstable();
        let mut projects = Vec::new();
        let mut start = 0;
        for run in all.chunk_by(|a, b| a.0 == b.0) {
            projects.push((run[0].0, start, start + run.len()));
            start += run.len();
        }
        self.frozen_len += all.len();
        self.frozen.push_back(Frozen {
            newest: active.newest,
            keys: active.keys,
            projects,
            ids: all.into_iter().map(|(_, id)| id).collect(),
        });
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
        while let Some(oldest) = self.frozen.front() {
            let rest = self.len() - oldest.ids.len();
            if oldest.newest >= cutoff && rest < self.max_ids {
                break;
            }
            self.frozen_len -= oldest.ids.len();
            if let Some(gone) = self.frozen.pop_front() {
                for k in gone.keys {
                    batch.remove(k);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DEFAULT_DEDUP_MAX_AGE_MS, DEFAULT_DEDUP_MAX_IDS};

    const HOUR: i64 = 60 * 60 * 1000;

    /// A `recent_ids` tree in a fresh database, removed when the dir is dropped.
    fn recent_ids() -> (tempfile::TempDir, sled::Tree) {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path()).unwrap();
        let tree = db.open_tree("recent_ids").unwrap();
        (dir, tree)
    }

    fn ids(from: u128, n: u128) -> Vec<Id> {
        (from..from + n)
            .map(|i| (1 + (i % 2) as u64, i * 7919))
            .collect()
    }

    #[test]
    fn values_round_trip_and_reject_damage() {
        let mut chunk = ids(0, 100);
        chunk.push((9, u128::MAX));
        chunk.push(chunk[0]);
        let bytes = encode(&chunk);
        let mut back = decode(&bytes).unwrap();
        chunk.sort_unstable();
        chunk.dedup();
        back.sort_unstable();
        assert_eq!(back, chunk);
        for n in [1, 8, 11, 13, bytes.len() - 1] {
            assert_eq!(decode(&bytes[..n]), None, "prefix {n}");
        }
        assert_eq!(decode(&[]), Some(Vec::new()));
    }

    fn key(n: u64) -> IVec {
        IVec::from(&keys::recent(0, n)[..])
    }

    #[test]
    fn finds_every_id_in_the_window_and_nothing_else() {
        let mut w = Window::new(DEFAULT_DEDUP_MAX_AGE_MS, DEFAULT_DEDUP_MAX_IDS);
        // Enough for several frozen segments plus a partial hash set.
        for c in 0..300u64 {
            let _ = w.insert(key(c), 1000, &ids(c as u128 * 1000, 1000), 1000);
        }
        assert!(w.frozen.len() >= 4, "{} segments", w.frozen.len());
        assert_eq!(w.len(), 300_000);
        for i in (0..300_000u128).step_by(97) {
            assert!(w.contains((1 + (i % 2) as u64, i * 7919)), "{i}");
            // The same uuid in the other project was never seen.
            assert!(!w.contains((2 - (i % 2) as u64, i * 7919)), "{i}");
            assert!(!w.contains((1, i * 7919 + 1)), "{i}");
        }
    }

    #[test]
    fn prunes_by_count_keeping_at_least_the_count() {
        let max = 3 * SEGMENT_IDS;
        let mut w = Window::new(DEFAULT_DEDUP_MAX_AGE_MS, max);
        let mut deleted = 0;
        let n = SEGMENT_IDS as u128;
        for c in 0..6u128 {
            deleted += w.insert(key(c as u64), 0, &ids(c * n, n), 0).removals();
        }
        // Six segments inserted; the oldest go once the rest hold the count.
        assert_eq!(w.len(), max);
        assert!(!w.contains(ids(0, 1)[0]));
        assert!(w.contains(ids(6 * n - 1, 1)[0]));
        assert!(w.contains(ids(3 * n, 1)[0]));
        assert_eq!(deleted, 3, "the dropped segments' entries are deleted");
    }

    #[test]
    fn prunes_by_age() {
        let day = 24 * HOUR;
        let mut w = Window::new(day, DEFAULT_DEDUP_MAX_IDS);
        let _ = w.insert(key(1), 0, &ids(0, 10), 0);
        // Two hours later the old hash set is frozen (past an hour) ...
        let _ = w.insert(key(2), 2 * HOUR, &ids(10, 10), 2 * HOUR);
        assert!(w.contains(ids(0, 1)[0]) && w.contains(ids(10, 1)[0]));
        // ... and a day after its newest arrival it is dropped, the later one kept.
        let batch = w.prune(day + HOUR);
        assert!(!w.contains(ids(0, 1)[0]));
        assert!(w.contains(ids(10, 1)[0]));
        assert_eq!(batch.removals(), 1);
        assert_eq!(w.len(), 10);
    }

    #[test]
    fn reloads_what_was_committed_without_the_expired() {
        let (_dir, tree) = recent_ids();
        let now = 100 * HOUR;
        for (i, at) in [(1u64, now - 30 * HOUR), (2, now - 2 * HOUR), (3, now)] {
            let chunk = ids(u128::from(i) * 100, 10);
            tree.insert(keys::recent(at, i), encode(&chunk)).unwrap();
        }
        tree.insert(keys::recent(now, 4), &b"damaged"[..]).unwrap();
        let w = Window::load(&tree, DEFAULT_DEDUP_MAX_AGE_MS, DEFAULT_DEDUP_MAX_IDS, now).unwrap();
        assert_eq!(w.len(), 20);
        assert!(!w.contains(ids(100, 1)[0]), "older than a day");
        assert!(w.contains(ids(200, 1)[0]) && w.contains(ids(309, 1)[0]));
        assert_eq!(
            tree.len(),
            2,
            "the expired and the damaged entries are deleted"
        );
    }

    /// Reloading a day of entries groups them by the hour they arrived in, as they
    /// were grouped when stored, not one segment per entry: every lookup scans the
    /// segments.
    #[test]
    fn reloaded_entries_are_frozen_by_arrival_hour() {
        let (_dir, tree) = recent_ids();
        let now = 100 * HOUR;
        let entries = 1000u64;
        for i in 0..entries {
            let at = now - 20 * HOUR + (i as i64) * 20 * HOUR / entries as i64;
            let chunk = ids(u128::from(i) * 10, 10);
            tree.insert(keys::recent(at, i), encode(&chunk)).unwrap();
        }
        let w = Window::load(&tree, DEFAULT_DEDUP_MAX_AGE_MS, DEFAULT_DEDUP_MAX_IDS, now).unwrap();
        assert_eq!(w.len(), 10_000);
        assert!(w.frozen.len() <= 21, "{} segments", w.frozen.len());
        assert!((0..10_000).step_by(7).all(|i| w.contains(ids(i, 1)[0])));
    }

    #[test]
    fn many_small_chunks_become_one_entry() {
        let (_dir, tree) = recent_ids();
        let mut w = Window::new(DEFAULT_DEDUP_MAX_AGE_MS, DEFAULT_DEDUP_MAX_IDS);
        for c in 0..1000u64 {
            let chunk = ids(u128::from(c), 1);
            let k = keys::recent(5, c);
            tree.insert(k, encode(&chunk)).unwrap();
            w.insert(IVec::from(&k[..]), 5, &chunk, 5)
                .apply(&tree)
                .unwrap();
        }
        assert!(tree.len() <= MAX_ENTRIES_PER_SEGMENT + 1, "{}", tree.len());
        let back = Window::load(&tree, DEFAULT_DEDUP_MAX_AGE_MS, DEFAULT_DEDUP_MAX_IDS, 5).unwrap();
        assert_eq!(back.len(), 1000);
        assert!((0..1000).all(|c| back.contains(ids(c, 1)[0])));
    }
}
