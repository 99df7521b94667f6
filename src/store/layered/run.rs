//! A sorted run: an immutable file of keys and their values in key order, written once
//! by a fold ([`super::Layered::fold`]) and read in place.
//!
//! ```text
//! "flagpost-run 1\n\0"                       16 bytes
//! blocks     LZ4 (lz4_flex's block format) of about 4 KiB of entries:
//!            per entry: key_len u32 LE, value_len u32 LE, key, value
//! notes      (a table that notes its blocks) per part of a note, per block: the
//!            part, crc32 of it u32
//! index      entries u64, raw bytes u64, blocks u32,
//!            per block: offset u64, stored u32, raw u32, crc32 u32, first_key_len u32, first key
//!            filter: probes u32, words u32, words (u64 LE)
//!            (with notes) notes offset u64, parts u32, per part: its length u32
//! footer     index offset u64, index length u64, crc32 of the index u32, "FPRE"
//! ```
//!
//! Opening reads the footer and the index (one first key a block, and a Bloom filter
//! of about ten bits a key, so a key that is not in the run is almost never read for);
//! a lookup reads and decompresses one block, or finds it in the block
//! [`cache`](super::cache) shared by every run (scans read around it), and
//! binary-searches the entries the cache found in it. A block that cannot be read (its bytes
//! fail their CRC, or the read fails) is logged once, naming the file and the block, and
//! its keys read as absent; the other blocks still read. [`Run::verify`] (`flagpost
//! check`) reports it as an error, and the fold that replaces the run keeps the
//! damaged file aside ([`Run::damage_seen`]). The blocks' notes: [`notes`].

use std::fs::File;
use std::io;
use std::ops::{Bound, ControlFlow};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::cache;
use super::filter::Filter;
use super::key::{Key, KEY_INLINE};

#[path = "run_entries.rs"]
mod block;
pub(super) use block::entries;
use block::{decoded, entry_at};
#[path = "run_notes.rs"]
mod notes;
pub use notes::Noter;
pub(super) use notes::{put as put_note, Notes, Window};

pub(super) const MAGIC: &[u8; 16] = b"flagpost-run 1\n\0";
pub(super) const FOOTER_MAGIC: &[u8; 4] = b"FPRE";
const FOOTER_LEN: u64 = 8 + 8 + 4 + 4;
/// A block is cut once its entries reach this many bytes. A point read that misses
/// the block cache reads, checks and decompresses one whole block, so its cost grows
/// with this size: `/decide`'s lookup of a person whose two blocks were not cached took
/// about 201,000 instructions at 16 KiB and 70,000 at 4 KiB, against 25,000 with them
/// cached (`benches/person_lookup.rs`). Smaller blocks give LZ4 less to match: the
/// persons' run came out about a fifth larger at 4 KiB, the distinct ids' the same.
pub(super) const BLOCK_BYTES: usize = 4 * 1024;
/// No index is larger: a footer claiming more is damaged.
const MAX_INDEX_BYTES: u64 = 1 << 32;

/// One entry: a key and its value.
pub type Entry = (Vec<u8>, Vec<u8>);

#[derive(Debug)]
pub(super) struct BlockInfo {
    pub(super) offset: u64,
    pub(super) stored: u32,
    pub(super) raw: u32,
    pub(super) crc: u32,
    /// Read with [`Run::first_key`].
    first_key: FirstKey,
}

/// A block's first key: inline when short, since the index is binary-searched on every
/// point read; a longer one (a search index's key holds a value) in the run's
/// [`Run::long_keys`], one allocation for them all. Allocated each on its own, they
/// were small blocks that outlive the fold's buffers of their size on the fold's
/// thread, each keeping a page of freed memory resident (12 MiB at 20 M events).
#[derive(Debug)]
enum FirstKey {
    Inline(Key),
    Long { at: u32, len: u32 },
}

/// An open run.
#[derive(Debug)]
pub struct Run {
    /// Its id in the block cache, never another run's.
    id: u64,
    path: PathBuf,
    pub(super) file: File,
    pub(super) blocks: Vec<BlockInfo>,
    /// The first keys longer than [`KEY_INLINE`], one after another.
    long_keys: Box<[u8]>,
    filter: Filter,
    entries: u64,
    raw_bytes: u64,
    file_bytes: u64,
    /// Blocks found damaged, each logged once.
    reported: Vec<AtomicBool>,
    pub(super) notes: Notes,
}

fn damaged(path: &Path, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{} is damaged: {what}", path.display()),
    )
}

/// Bytes from `at`, with a bounds check that names `what` when they are not there.
fn take<'a>(bytes: &'a [u8], at: &mut usize, n: usize) -> Option<&'a [u8]> {
    let end = at.checked_add(n)?;
    let out = bytes.get(*at..end)?;
    *at = end;
    Some(out)
}

fn u32_at(bytes: &[u8], at: &mut usize) -> Option<u32> {
    take(bytes, at, 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn u64_at(bytes: &[u8], at: &mut usize) -> Option<u64> {
    take(bytes, at, 8).map(|b| {
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        u64::from_le_bytes(a)
    })
}

impl Run {
    /// Open the run at `path`: its footer and index are read and checked.
    pub fn open(path: &Path) -> io::Result<Run> {
        let file = File::open(path)?;
        let file_bytes = file.metadata()?.len();
        let min = MAGIC.len() as u64 + FOOTER_LEN;
        if file_bytes < min {
            return Err(damaged(path, format!("{file_bytes} bytes is too short")));
        }
        let mut magic = [0u8; 16];
        file.read_exact_at(&mut magic, 0)?;
        if &magic != MAGIC {
            return Err(damaged(path, "it does not start as a run"));
        }
        let mut footer = [0u8; FOOTER_LEN as usize];
        file.read_exact_at(&mut footer, file_bytes - FOOTER_LEN)?;
        let mut at = 0;
        let (index_at, index_len, crc) = match (
            u64_at(&footer, &mut at),
            u64_at(&footer, &mut at),
            u32_at(&footer, &mut at),
        ) {
            (Some(a), Some(b), Some(c)) => (a, b, c),
            _ => return Err(damaged(path, "its footer is cut")),
        };
        if &footer[20..24] != FOOTER_MAGIC {
            return Err(damaged(path, "its footer is not whole"));
        }
        let fits = index_at
            .checked_add(index_len)
            .is_some_and(|end| end == file_bytes - FOOTER_LEN);
        if !fits || index_len > MAX_INDEX_BYTES || index_at < MAGIC.len() as u64 {
            return Err(damaged(path, "its footer names an index outside the file"));
        }
        let mut index = vec![0u8; index_len as usize];
        file.read_exact_at(&mut index, index_at)?;
        if crc32fast::hash(&index) != crc {
            return Err(damaged(path, "its index fails its CRC"));
        }
        let cut = || damaged(path, "its index is cut");
        let mut at = 0;
        let entries = u64_at(&index, &mut at).ok_or_else(cut)?;
        let raw_bytes = u64_at(&index, &mut at).ok_or_else(cut)?;
        let count = u32_at(&index, &mut at).ok_or_else(cut)?;
        let mut blocks = Vec::with_capacity((count as usize).min(index.len() / 24));
        let mut long_keys = Vec::new();
        for _ in 0..count {
            let offset = u64_at(&index, &mut at).ok_or_else(cut)?;
            let stored = u32_at(&index, &mut at).ok_or_else(cut)?;
            let raw = u32_at(&index, &mut at).ok_or_else(cut)?;
            let crc = u32_at(&index, &mut at).ok_or_else(cut)?;
            let key_len = u32_at(&index, &mut at).ok_or_else(cut)?;
            let first_key = take(&index, &mut at, key_len as usize).ok_or_else(cut)?;
            if offset
                .checked_add(u64::from(stored))
                .is_none_or(|end| end > index_at)
            {
                return Err(damaged(path, "its index names a block outside the file"));
            }
            let first_key = match first_key.len() {
                0..=KEY_INLINE => FirstKey::Inline(Key::from(first_key)),
                len => {
                    let at = u32::try_from(long_keys.len()).map_err(|_| cut())?;
                    long_keys.extend_from_slice(first_key);
                    FirstKey::Long {
                        at,
                        len: len as u32,
                    }
                }
            };
            blocks.push(BlockInfo {
                offset,
                stored,
                raw,
                crc,
                first_key,
            });
        }
        let probes = u32_at(&index, &mut at).ok_or_else(cut)?;
        let words = u32_at(&index, &mut at).ok_or_else(cut)?;
        let bits = take(&index, &mut at, words as usize * 8).ok_or_else(cut)?;
        let filter = Filter {
            probes,
            words: bits
                .chunks_exact(8)
                .map(|w| {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(w);
                    u64::from_le_bytes(a)
                })
                .collect(),
        };
        let notes = Notes::stored(index.get(at..).unwrap_or_default(), blocks.len(), index_at);
        Ok(Run {
            id: cache::next_run_id(),
            path: path.to_path_buf(),
            file,
            reported: blocks.iter().map(|_| AtomicBool::new(false)).collect(),
            blocks,
            long_keys: long_keys.into_boxed_slice(),
            filter,
            entries,
            raw_bytes,
            file_bytes,
            notes,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keys in the run.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Bytes of its keys and values, uncompressed.
    pub fn raw_bytes(&self) -> u64 {
        self.raw_bytes
    }

    /// The file's size.
    pub fn file_bytes(&self) -> u64 {
        self.file_bytes
    }

    pub fn block_count(&self) -> usize {
        self.blocks.len()
    }

    /// Bytes it keeps in memory while open: its block index, Bloom filter and notes.
    pub fn resident_bytes(&self) -> u64 {
        let block = std::mem::size_of::<BlockInfo>() + std::mem::size_of::<AtomicBool>();
        let keys = self.long_keys.len();
        let filter = self.filter.words.len() * std::mem::size_of::<u64>();
        let notes = self.notes.bytes();
        (self.blocks.len() * block + keys + filter + notes) as u64
    }

    /// The value of `key`, if the run holds it (a block that cannot be read holds
    /// nothing: see the module docs).
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        if !self.filter.may_hold(key) {
            return None;
        }
        let i = self.blocks_to(key);
        if i == 0 {
            return None;
        }
        let found = self.cached_block(i - 1, |block| {
            let at = |start: usize| entry_at(block.bytes, &mut { start });
            // Every start was read once when the block was loaded, so `at` finds an entry.
            let by_key = |start| at(start).map_or(std::cmp::Ordering::Less, |(k, _)| k.cmp(key));
            match block.search(by_key) {
                Ok(n) => Ok(at(block.start(n)).map(|(_, v)| v.to_vec())),
                // Past the last whole entry of a cut block, the key may have been there.
                Err(n) => Err(block.cut && n == block.len()),
            }
        })?;
        match found {
            Ok(value) => value,
            Err(cut) => {
                if cut {
                    self.report(i - 1, &self.bad_block(i - 1, "its entries are cut"));
                }
                None
            }
        }
    }

    /// Up to `limit` entries from `from` on (and below `to`), in key order; blocks
    /// that cannot be read are passed over.
    pub fn scan(&self, from: Bound<&[u8]>, to: Bound<&[u8]>, limit: usize) -> Vec<Entry> {
        let mut out = Vec::new();
        let first = match from {
            Bound::Unbounded => 0,
            Bound::Included(k) | Bound::Excluded(k) => self.first_block(k),
        };
        self.each(first, |k, v| {
            let after_start = match from {
                Bound::Unbounded => true,
                Bound::Included(f) => k >= f,
                Bound::Excluded(f) => k > f,
            };
            if !after_start {
                return ControlFlow::Continue(());
            }
            let before_end = match to {
                Bound::Unbounded => true,
                Bound::Included(t) => k <= t,
                Bound::Excluded(t) => k < t,
            };
            if !before_end || out.len() >= limit {
                return ControlFlow::Break(());
            }
            out.push((k.to_vec(), v.to_vec()));
            ControlFlow::Continue(())
        });
        out
    }

    /// The block that may hold `key`, or the first.
    pub(super) fn first_block(&self, key: &[u8]) -> usize {
        self.blocks_to(key).max(1) - 1
    }

    /// How many blocks start before `key`.
    pub(super) fn blocks_to_below(&self, key: &[u8]) -> usize {
        self.blocks.partition_point(|b| self.key_of(b) < key)
    }

    /// How many blocks start at or before `key`.
    fn blocks_to(&self, key: &[u8]) -> usize {
        self.blocks.partition_point(|b| self.key_of(b) <= key)
    }

    /// The first key of block `i`.
    pub(super) fn first_key(&self, i: usize) -> &[u8] {
        self.key_of(&self.blocks[i])
    }

    fn key_of<'a>(&'a self, b: &'a BlockInfo) -> &'a [u8] {
        match &b.first_key {
            FirstKey::Inline(k) => k,
            FirstKey::Long { at, len } => {
                &self.long_keys[*at as usize..*at as usize + *len as usize]
            }
        }
    }

    /// Each entry of the blocks from `first` on, in key order, until `f` breaks; blocks
    /// that cannot be read are passed over (and reported).
    fn each(&self, first: usize, mut f: impl FnMut(&[u8], &[u8]) -> ControlFlow<()>) {
        for i in first..self.blocks.len() {
            let Some(raw) = self.readable_block(i) else {
                continue;
            };
            for entry in entries(&raw) {
                let Some((k, v)) = entry else {
                    self.report(i, &self.bad_block(i, "its entries are cut"));
                    break;
                };
                if f(k, v).is_break() {
                    return;
                }
            }
        }
    }

    /// Read every block through, and every note of them: the entries read, or the
    /// first damage met.
    pub fn verify(&self) -> io::Result<u64> {
        let mut count = 0u64;
        let mut last: Option<Vec<u8>> = None;
        for i in 0..self.blocks.len() {
            let raw = self.block(i)?;
            for entry in entries(&raw) {
                let (k, _) = entry.ok_or_else(|| self.bad_block(i, "its entries are cut"))?;
                if last.as_deref().is_some_and(|l| l >= k) {
                    return Err(self.bad_block(i, "its keys are out of order"));
                }
                last = Some(k.to_vec());
                count += 1;
            }
        }
        if count != self.entries {
            return Err(damaged(
                &self.path,
                format!("{count} entries read, the index says {}", self.entries),
            ));
        }
        if let Some(i) = self.notes.damaged(&self.file, self.blocks.len()) {
            let what = "its note fails its CRC (searches read the block instead)";
            return Err(self.bad_block(i, what));
        }
        Ok(count)
    }

    /// Whether a read met a damaged block.
    pub fn damage_seen(&self) -> bool {
        self.reported.iter().any(|r| r.load(Ordering::Relaxed))
    }

    /// Whether the run may hold `key` (its Bloom filter; no block read).
    pub fn may_hold(&self, key: &[u8]) -> bool {
        self.filter.may_hold(key)
    }

    /// Read every block as if none had failed (a failure that passed).
    pub fn forget_damage(&self) {
        for r in &self.reported {
            r.store(false, Ordering::Relaxed);
        }
    }

    /// `read` of block `i` through the block cache, or `None` (logged once) when it
    /// cannot be read.
    fn cached_block<R>(&self, i: usize, read: impl FnOnce(cache::View<'_>) -> R) -> Option<R> {
        let key = (self.id, i as u32);
        match cache::global().read(key, || self.block(i).map(decoded), read) {
            Ok(found) => Some(found),
            Err(e) => {
                self.report(i, &e);
                None
            }
        }
    }

    /// Block `i`, or `None` (logged once) when it cannot be read.
    pub(super) fn readable_block(&self, i: usize) -> Option<Vec<u8>> {
        match self.block(i) {
            Ok(raw) => Some(raw),
            Err(e) => {
                self.report(i, &e);
                None
            }
        }
    }

    pub(super) fn report(&self, i: usize, e: &io::Error) {
        if !self.reported[i].swap(true, Ordering::Relaxed) {
            tracing::error!(error = %e, "a block of persons or distinct ids cannot be read; its keys read as absent (run `flagpost check`)");
        }
    }

    pub(super) fn bad_block(&self, i: usize, what: impl std::fmt::Display) -> io::Error {
        damaged(&self.path, format_args!("block {i}: {what}"))
    }

    /// Block `i`'s entries, decompressed.
    fn block(&self, i: usize) -> io::Result<Vec<u8>> {
        let b = &self.blocks[i];
        let mut stored = vec![0u8; b.stored as usize];
        self.file.read_exact_at(&mut stored, b.offset)?;
        let mut raw = Vec::new();
        self.unpack(i, &stored, &mut raw)?;
        Ok(raw)
    }

    /// Block `i`'s stored bytes checked against their CRC and decompressed into `raw`.
    pub(super) fn unpack(&self, i: usize, stored: &[u8], raw: &mut Vec<u8>) -> io::Result<()> {
        if crc32fast::hash(stored) != self.blocks[i].crc {
            return Err(self.bad_block(i, "its bytes fail their CRC"));
        }
        raw.clear();
        raw.resize(self.blocks[i].raw as usize, 0);
        let n = lz4_flex::block::decompress_into(stored, raw)
            .map_err(|e| self.bad_block(i, format_args!("it does not decompress: {e}")))?;
        raw.truncate(n);
        Ok(())
    }
}

#[cfg(test)]
#[path = "tests/run.rs"]
pub(super) mod tests;
