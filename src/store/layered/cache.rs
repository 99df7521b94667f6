//! The decompressed blocks of runs that point reads (a person, a distinct id) met, kept
//! for the next read of a key near them: one cache for every run of the process,
//! weighed by the blocks' decompressed bytes, keyed by (run id, block number). A run's
//! id is given when it is opened and never given again, and a run never changes, so a
//! cached block is never stale: a fold's new run reads its own blocks, and the old
//! run's are evicted as they stop being read. Blocks enter only once their CRC passed.
//!
//! A block is kept with where each of its entries starts ([`Decoded`]), found by the
//! one walk that loading it takes, so a read of a cached block binary-searches its
//! entries: a block of distinct ids holds about a hundred, and walking them with a key
//! comparison each was the largest share of a point read once the block was held.
//!
//! Eviction is CLOCK (second chance) per shard: a block read since the hand last
//! passed it stays for another round, so the blocks of busy persons stay while a
//! stream of one-off reads passes through. Scans (a fold, `check`, a listing) read
//! around the cache, not through it: one would otherwise replace all it holds.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Bytes of decompressed blocks kept: at a million persons (about 100 MB of runs) it
/// keeps the blocks of the busiest third, well inside the 300 MB the whole process
/// is held to.
pub const CAPACITY_BYTES: usize = 32 * 1024 * 1024;
/// Shards, each with its own lock, so readers of the API and the compactor rarely wait
/// on one another.
const SHARDS: usize = 16;

/// A run's id in the cache and which block of it.
pub type Key = (u64, u32);

/// A decompressed block and where each of its entries starts, in order.
pub struct Decoded {
    pub bytes: Vec<u8>,
    pub starts: Vec<u32>,
    /// Whether the entries stop short of the end (a damaged block): keys past the last
    /// start are not known to be absent.
    pub cut: bool,
}

impl Decoded {
    /// Bytes it holds.
    fn weight(&self) -> usize {
        self.bytes.len() + self.starts.len() * std::mem::size_of::<u32>()
    }
}

/// A block as cached: shared with the readers using it when it is evicted.
pub type Block = Arc<Decoded>;

struct Slot {
    block: Block,
    referenced: bool,
}

#[derive(Default)]
struct Shard {
    map: HashMap<Key, Slot>,
    /// The keys in the order the hand meets them.
    clock: VecDeque<Key>,
    bytes: usize,
}

pub struct Cache {
    shards: Vec<Mutex<Shard>>,
    per_shard: usize,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// The cache every run reads through.
pub fn global() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Cache::new(CAPACITY_BYTES))
}

/// A run id never given before in this process.
pub fn next_run_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// What a block weighs besides its bytes (the map's and the clock's entries).
const OVERHEAD_BYTES: usize = 64;

impl Cache {
    pub fn new(capacity_bytes: usize) -> Cache {
        Cache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            per_shard: capacity_bytes / SHARDS,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    fn shard(&self, (run, block): Key) -> &Mutex<Shard> {
        let h = (run.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(block))
            .wrapping_mul(0xbf58_476d_1ce4_e5b9);
        &self.shards[(h >> 60) as usize % SHARDS]
    }

    /// The block of `key`, read by `load` when it is not held (and kept if it loads).
    pub fn get_or_load<E>(
        &self,
        key: Key,
        load: impl FnOnce() -> Result<Decoded, E>,
    ) -> Result<Block, E> {
        let shard = self.shard(key);
        {
            // A poisoned lock only means a reader panicked between two statements
            // that each leave the shard whole.
            let mut s = shard.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(slot) = s.map.get_mut(&key) {
                slot.referenced = true;
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(slot.block.clone());
            }
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        // Read outside the lock: two readers of one block may both read it.
        let block: Block = Arc::new(load()?);
        let weight = block.weight() + OVERHEAD_BYTES;
        if weight > self.per_shard {
            return Ok(block);
        }
        let mut s = shard.lock().unwrap_or_else(|e| e.into_inner());
        if s.map.contains_key(&key) {
            return Ok(block);
        }
        while s.bytes + weight > self.per_shard {
            let Some(k) = s.clock.pop_front() else { break };
            match s.map.get_mut(&k) {
                Some(slot) if slot.referenced => {
                    slot.referenced = false;
                    s.clock.push_back(k);
                }
                Some(_) => {
                    if let Some(gone) = s.map.remove(&k) {
                        s.bytes -= gone.block.weight() + OVERHEAD_BYTES;
                    }
                }
                None => {}
            }
        }
        s.bytes += weight;
        s.clock.push_back(key);
        let slot = Slot {
            block: block.clone(),
            referenced: false,
        };
        s.map.insert(key, slot);
        Ok(block)
    }

    /// Reads answered from the cache and reads that loaded a block, since the start.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }

    /// Decompressed bytes held (with their overhead).
    pub fn bytes(&self) -> usize {
        let held = |s: &Mutex<Shard>| s.lock().unwrap_or_else(|e| e.into_inner()).bytes;
        self.shards.iter().map(held).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(n: u8, len: usize) -> Result<Decoded, ()> {
        Ok(Decoded {
            bytes: vec![n; len],
            starts: Vec::new(),
            cut: false,
        })
    }

    #[test]
    fn holds_what_it_loaded_within_its_weight() {
        let cache = Cache::new(SHARDS * 10_000);
        let mut loads = 0;
        for round in 0..3 {
            for b in 0..20u32 {
                let got = cache
                    .get_or_load((7, b), || {
                        loads += 1;
                        block(b as u8, 1000)
                    })
                    .unwrap();
                assert_eq!(&got.bytes[..], &[b as u8; 1000][..], "round {round}");
            }
        }
        assert_eq!(loads, 20, "a block is loaded once while it fits");
        assert_eq!(cache.counts(), (40, 20));
        // Another run's block of the same number is another block.
        let other = cache.get_or_load((8, 0), || block(99, 10)).unwrap();
        assert_eq!(&other.bytes[..], &[99; 10][..]);
        assert!(cache.bytes() <= SHARDS * 10_000);
    }

    #[test]
    fn stays_within_its_capacity_and_keeps_what_is_read_again() {
        let cache = Cache::new(SHARDS * 4 * 1000);
        // One block read over and over among many read once.
        let _ = cache.get_or_load((1, 0), || block(1, 900));
        for b in 1..2000u32 {
            let _ = cache.get_or_load((1, b), || block(2, 900));
            let kept = cache.get_or_load((1, 0), || block(3, 900)).unwrap();
            assert_eq!(
                kept.bytes[0], 1,
                "the busy block is still the one loaded first"
            );
        }
        assert!(cache.bytes() <= SHARDS * 4 * 1000, "{}", cache.bytes());
        // Each block read once was loaded; the busy one was loaded once.
        assert_eq!(cache.counts(), (1999, 2000));
    }

    #[test]
    fn a_failed_load_is_not_kept() {
        let cache = Cache::new(SHARDS * 10_000);
        let failed = cache.get_or_load((3, 1), || Err::<Decoded, _>("damaged"));
        assert_eq!(failed.err(), Some("damaged"));
        let read = cache.get_or_load((3, 1), || block(5, 10)).unwrap();
        assert_eq!(&read.bytes[..], &[5; 10][..]);
        assert_eq!(cache.bytes(), 10 + OVERHEAD_BYTES);
    }
}
