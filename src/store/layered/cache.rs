//! The decompressed blocks of runs that point reads (a person, a distinct id) met, kept
//! for the next read of a key near them: one cache for every run of the process,
//! keyed by (run id, block number). A run's id is given when it is opened and never
//! given again, and a run never changes, so a cached block is never stale: a fold's
//! new run reads its own blocks, and the old run's are evicted as they stop being
//! read. Blocks enter only once their CRC passed.
//!
//! A block is kept with where each of its entries starts ([`Decoded`]), found by the
//! one walk that loading it takes, so a read of a cached block binary-searches its
//! entries: a block of distinct ids holds about a hundred, and walking them with a key
//! comparison each was the largest share of a point read once the block was held.
//!
//! The blocks live in one slab per shard, allocated once at the shard's share of the
//! budget, each block beside its entries' starts, written one after another. The slab
//! is a ring and its write position the CLOCK's hand (second chance): to make room,
//! the hand meets the oldest block ahead of it, evicts it if it was not read since the
//! hand last passed, and otherwise moves it back to the hand, so the blocks of busy
//! persons stay while a stream of one-off reads passes through and the held blocks
//! stay packed. So the cache never allocates a block, and an eviction leaves no hole
//! among other allocations: blocks loaded by whichever thread read them used to sit in
//! that thread's pages of 4-8 KiB blocks, their starts in pages of 256-511 B, and each
//! eviction left a block free among short-lived ones. A read runs under its shard's
//! lock, on the block in place. Scans (a fold, `check`, a listing) read around the
//! cache, not through it: one would otherwise replace all it holds.

use std::cmp::Ordering as Order;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Bytes of decompressed blocks kept, set by measurement: at 5 M events from a million
/// persons, 16 MiB answered a person by distinct id and `/decide` with a stored
/// person as fast at p99 as 32 MiB did (0.46 and 0.16 ms), the compactor no slower,
/// where 8 MiB (with sled's cache at 8) took them to 3.8 and 2.8 ms (BENCHMARKS.md,
/// "The caches in slabs and their budgets").
pub const CAPACITY_BYTES: usize = 16 * 1024 * 1024;
/// Shards, each with its own lock and slab, so readers of the API and the compactor
/// rarely wait on one another.
const SHARDS: usize = 16;

/// A run's id in the cache and which block of it.
pub type Key = (u64, u32);

/// A decompressed block and where each of its entries starts, in order, as a load
/// makes it.
pub struct Decoded {
    pub bytes: Vec<u8>,
    pub starts: Vec<u32>,
    /// Whether the entries stop short of the end (a damaged block): keys past the last
    /// start are not known to be absent.
    pub cut: bool,
}

/// A block as a read sees it: in the slab, or in a buffer of its own when it is not
/// kept.
pub struct View<'a> {
    pub bytes: &'a [u8],
    /// The starts, four little-endian bytes each.
    starts: &'a [u8],
    pub cut: bool,
}

impl View<'_> {
    /// Entries whose start is known.
    pub fn len(&self) -> usize {
        self.starts.len() / 4
    }

    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// Where entry `n` (below [`View::len`]) starts.
    pub fn start(&self, n: usize) -> usize {
        u32_at(self.starts, 4 * n) as usize
    }

    /// [`slice::binary_search_by`] over the entries' starts.
    pub fn search(&self, mut by: impl FnMut(usize) -> Order) -> Result<usize, usize> {
        let (mut low, mut high) = (0, self.len());
        while low < high {
            let mid = low + (high - low) / 2;
            match by(self.start(mid)) {
                Order::Less => low = mid + 1,
                Order::Greater => high = mid,
                Order::Equal => return Ok(mid),
            }
        }
        Err(low)
    }
}

/// A block in the slab: its key, the lengths of its bytes and starts, whether it is
/// cut; then its bytes, then its starts.
const HEADER: usize = 8 + 4 + 4 + 4 + 1;

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

fn record_len(d: &Decoded) -> usize {
    HEADER + d.bytes.len() + 4 * d.starts.len()
}

/// Write `d` as `key`'s record into `out`, exactly [`record_len`] long.
fn write_record(out: &mut [u8], key: Key, d: &Decoded) {
    let (head, rest) = out.split_at_mut(HEADER);
    head[..8].copy_from_slice(&key.0.to_le_bytes());
    head[8..12].copy_from_slice(&key.1.to_le_bytes());
    // A block's raw length is a u32 in the run's index, so its lengths fit one.
    head[12..16].copy_from_slice(&(d.bytes.len() as u32).to_le_bytes());
    head[16..20].copy_from_slice(&(d.starts.len() as u32).to_le_bytes());
    head[20] = u8::from(d.cut);
    let (bytes, starts) = rest.split_at_mut(d.bytes.len());
    bytes.copy_from_slice(&d.bytes);
    for (to, s) in starts.chunks_exact_mut(4).zip(&d.starts) {
        to.copy_from_slice(&s.to_le_bytes());
    }
}

/// The key and length of the record starting `record`.
fn record_key(record: &[u8]) -> (Key, usize) {
    let run = u64::from_le_bytes(record[..8].try_into().unwrap_or_default());
    let bytes = u32_at(record, 12) as usize;
    let starts = u32_at(record, 16) as usize;
    ((run, u32_at(record, 8)), HEADER + bytes + 4 * starts)
}

/// The block of the record starting `record`.
fn view(record: &[u8]) -> View<'_> {
    let bytes = u32_at(record, 12) as usize;
    let starts = u32_at(record, 16) as usize;
    let body = &record[HEADER..];
    View {
        bytes: &body[..bytes],
        starts: &body[bytes..bytes + 4 * starts],
        cut: record[20] != 0,
    }
}

/// Where a held block's record starts, and whether it was read since the hand passed.
struct Place {
    at: usize,
    read: bool,
}

#[derive(Default)]
struct Shard {
    /// The records, allocated at the shard's budget on the first block kept.
    slab: Box<[u8]>,
    map: HashMap<Key, Place>,
    /// Where the next record goes: the clock's hand.
    hand: usize,
    /// The records the hand has not passed this lap lie in `ahead..end`, one after
    /// another; those before the hand were written or moved this lap.
    ahead: usize,
    end: usize,
    /// Bytes of the slab written at least once (the memory it has cost).
    touched: usize,
}

impl Shard {
    /// Room for a record of `len` bytes (where it starts), made by the hand: `None` if
    /// it is larger than the slab.
    fn make_room(&mut self, len: usize, budget: usize) -> Option<usize> {
        if len > budget {
            return None;
        }
        if self.slab.is_empty() {
            // Zeroed, so the pages are the system's untouched ones until written.
            self.slab = vec![0; budget].into_boxed_slice();
        }
        loop {
            let free_to = if self.ahead < self.end {
                self.ahead
            } else {
                self.slab.len()
            };
            if free_to - self.hand >= len {
                let at = self.hand;
                self.hand += len;
                self.touched = self.touched.max(self.hand);
                return Some(at);
            }
            if self.ahead >= self.end {
                // Every record is behind the hand: the next lap starts at the slab's
                // start, its records those of this lap.
                self.end = self.hand;
                self.ahead = 0;
                self.hand = 0;
                continue;
            }
            let (key, size) = record_key(&self.slab[self.ahead..]);
            let from = self.ahead;
            self.ahead += size;
            match self.map.get_mut(&key) {
                Some(place) if place.read => {
                    place.read = false;
                    place.at = self.hand;
                    self.slab.copy_within(from..from + size, self.hand);
                    self.hand += size;
                }
                _ => {
                    self.map.remove(&key);
                }
            }
        }
    }
}

pub struct Cache {
    shards: Vec<Mutex<Shard>>,
    per_shard: usize,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// The cache every run reads through, at [`CAPACITY_BYTES`] or
/// `FLAGPOST_RUN_BLOCK_CACHE_MB` (a knob for measuring the budget).
pub fn global() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| {
        Cache::new(budget_from_env(
            "FLAGPOST_RUN_BLOCK_CACHE_MB",
            CAPACITY_BYTES,
        ))
    })
}

/// `name`'s MiB if it is set to a number, else `default` bytes.
pub(crate) fn budget_from_env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|mb| mb.trim().parse::<usize>().ok())
        .map_or(default, |mb| mb.saturating_mul(1024 * 1024))
}

/// A run id never given before in this process.
pub fn next_run_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

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

    /// `read` of the block of `key`, which `load` reads when it is not held (and which
    /// is kept if it loads). `read` runs under the shard's lock: keep it short.
    pub fn read<R, E>(
        &self,
        key: Key,
        load: impl FnOnce() -> Result<Decoded, E>,
        read: impl FnOnce(View<'_>) -> R,
    ) -> Result<R, E> {
        let shard = self.shard(key);
        // A poisoned lock only means a reader panicked while the shard was whole: a
        // record and its place are both written before a read runs.
        let lock = || shard.lock().unwrap_or_else(|e| e.into_inner());
        {
            let mut s = lock();
            if let Some(place) = s.map.get_mut(&key) {
                place.read = true;
                let at = place.at;
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(read(view(&s.slab[at..])));
            }
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        // Read outside the lock: two readers of one block may both read it.
        let decoded = load()?;
        let len = record_len(&decoded);
        let mut s = lock();
        let s = &mut *s;
        if let Some(place) = s.map.get(&key) {
            return Ok(read(view(&s.slab[place.at..])));
        }
        let Some(at) = s.make_room(len, self.per_shard) else {
            let mut own = vec![0; len];
            write_record(&mut own, key, &decoded);
            return Ok(read(view(&own)));
        };
        write_record(&mut s.slab[at..at + len], key, &decoded);
        s.map.insert(key, Place { at, read: false });
        Ok(read(view(&s.slab[at..])))
    }

    /// Reads answered from the cache and reads that loaded a block, since the start.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }

    /// Bytes held: the slabs' bytes written at least once, and the maps' tables.
    pub fn bytes(&self) -> usize {
        let entry = std::mem::size_of::<(Key, Place)>() + 1;
        let held = |s: &Mutex<Shard>| {
            let s = s.lock().unwrap_or_else(|e| e.into_inner());
            s.touched + s.map.capacity() * entry
        };
        self.shards.iter().map(held).sum()
    }

    /// Blocks held.
    pub fn blocks(&self) -> usize {
        let held = |s: &Mutex<Shard>| s.lock().unwrap_or_else(|e| e.into_inner()).map.len();
        self.shards.iter().map(held).sum()
    }
}

#[cfg(test)]
#[path = "tests/cache.rs"]
mod tests;
