//! What a table notes of each block of a run, so a visit may leave the block unread
//! ([`super::super::Visitor::pass_over_noted`]): written by the fold beside the blocks
//! for a table that asks ([`Noter`]), or, for a run written before, made by readers
//! as they read its blocks and kept while the run is open.
//!
//! On disk, after the blocks: one note a block, each of the same length, followed by
//! the CRC32 of its bytes; the index ends with where they start and that length (a
//! build that predates them reads the index as before and never looks). A visit reads
//! the notes of the blocks it may read at once, a window at a time ([`Window`]); a
//! note that fails its CRC, or a window that cannot be read, is no note: the block is
//! read.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::RwLock;

/// Bytes of notes every open run keeps in memory at most together (runs written
/// before notes were; see [`Notes`]): about 60,000 blocks' notes of a search of
/// persons by property, the blocks of three keys every one of a million persons has.
const MAX_NOTE_BYTES: usize = 16 << 20;
/// Bytes of notes the open runs keep in memory.
static NOTE_BYTES: AtomicUsize = AtomicUsize::new(0);
/// Bytes of notes a visit reads from the file at once.
const WINDOW_BYTES: usize = 256 * 1024;

/// How a table notes the blocks its folds write.
#[derive(Clone, Copy, Debug)]
pub struct Noter {
    /// Bytes of every note.
    pub len: u32,
    /// Append the note of a block, given its entries decompressed: `len` bytes.
    pub note: fn(&[u8], &mut Vec<u8>),
}

/// A run's notes: those the fold wrote (`stored`: where the first is, and the length
/// of each), or those readers made, by block, in memory only, within
/// [`MAX_NOTE_BYTES`] for every run together (a note past it is not kept); they go
/// with the run when a fold replaces it.
#[derive(Default)]
pub(in super::super) struct Notes {
    stored: Option<(u64, u32)>,
    by_block: RwLock<HashMap<u32, Box<[u8]>>>,
    /// Their bytes, counted in [`NOTE_BYTES`] too.
    bytes: AtomicUsize,
}

/// A visit's notes of a run read from its file: those of `blocks`.
#[derive(Default)]
pub(in super::super) struct Window {
    bytes: Vec<u8>,
    blocks: Range<usize>,
}

impl Window {
    /// Read nothing yet (a visit's next run).
    pub(in super::super) fn clear(&mut self) {
        self.blocks = 0..0;
    }
}

impl std::fmt::Debug for Notes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self.bytes.load(Ordering::Relaxed);
        write!(f, "Notes({:?} stored, {kept} bytes kept)", self.stored)
    }
}

impl Drop for Notes {
    fn drop(&mut self) {
        NOTE_BYTES.fetch_sub(*self.bytes.get_mut(), Ordering::Relaxed);
    }
}

impl Notes {
    /// The notes a run's index names (after its Bloom filter, `rest`), for `blocks`
    /// blocks ending before `index_at`; none if it names none, or none that fit.
    pub(in super::super) fn stored(rest: &[u8], blocks: usize, index_at: u64) -> Notes {
        let (Some(at), Some(len)) = (rest.get(..8), rest.get(8..12)) else {
            return Notes::default();
        };
        let at = u64::from_le_bytes(at.try_into().unwrap_or_default());
        let len = u32::from_le_bytes(len.try_into().unwrap_or_default());
        let end = (u64::from(len) + 4)
            .checked_mul(blocks as u64)
            .and_then(|n| n.checked_add(at));
        let fits = len > 0 && at >= super::MAGIC.len() as u64 && end.is_some_and(|e| e <= index_at);
        let mut notes = Notes::default();
        notes.stored = fits.then_some((at, len));
        notes
    }

    /// Whether the fold wrote notes of the run's blocks.
    pub(in super::super) fn on_disk(&self) -> bool {
        self.stored.is_some()
    }

    /// `f` of the note of block `i` (of a visit reading blocks up to `end`, through
    /// `window`), if there is one.
    pub(in super::super) fn with<R>(
        &self,
        file: &File,
        (i, end): (usize, usize),
        window: &mut Window,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        let Some((at, len)) = self.stored else {
            let notes = self.by_block.read().unwrap_or_else(|e| e.into_inner());
            return notes.get(&(i as u32)).map(|n| f(n));
        };
        let each = len as usize + 4;
        if !window.blocks.contains(&i) {
            let count = (WINDOW_BYTES / each).clamp(1, end.saturating_sub(i).max(1));
            window.bytes.resize(count * each, 0);
            window.blocks = match file.read_exact_at(&mut window.bytes, at + (i * each) as u64) {
                Ok(()) => i..i + count,
                Err(_) => 0..0,
            };
        }
        let from = (i.checked_sub(window.blocks.start)?) * each;
        let (note, crc) = window.bytes.get(from..from + each)?.split_at(len as usize);
        (crc == crc32fast::hash(note).to_le_bytes()).then(|| f(note))
    }

    /// Keep the note `make` makes of block `i` read, for a run with none on disk that
    /// keeps none of it yet, unless the notes of every run are at their bound.
    pub(in super::super) fn keep(&self, i: usize, make: impl FnOnce() -> Option<Vec<u8>>) {
        let kept = |n: &HashMap<u32, Box<[u8]>>| n.contains_key(&(i as u32));
        if self.on_disk() || kept(&self.by_block.read().unwrap_or_else(|e| e.into_inner())) {
            return;
        }
        let Some(note) = make() else {
            return;
        };
        // The note's own bytes and about what a map's entry of it costs.
        let bytes = note.len() + 32;
        if NOTE_BYTES.fetch_add(bytes, Ordering::Relaxed) + bytes > MAX_NOTE_BYTES {
            NOTE_BYTES.fetch_sub(bytes, Ordering::Relaxed);
            return;
        }
        let mut notes = self.by_block.write().unwrap_or_else(|e| e.into_inner());
        match notes.insert(i as u32, note.into()) {
            // Noted twice at once: the first one's bytes were counted already.
            Some(_) => NOTE_BYTES.fetch_sub(bytes, Ordering::Relaxed),
            None => self.bytes.fetch_add(bytes, Ordering::Relaxed),
        };
    }

    /// The bytes its notes take in memory.
    pub(in super::super) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The first block whose stored note fails its CRC or cannot be read, if one does.
    pub(in super::super) fn damaged(&self, file: &File, blocks: usize) -> Option<usize> {
        let mut window = Window::default();
        let mut read = |i| self.with(file, (i, blocks), &mut window, |_| ()).is_some();
        (self.on_disk())
            .then(|| (0..blocks).find(|&i| !read(i)))
            .flatten()
    }
}

/// Append the note of `block` by `noter`, and its CRC.
pub(in super::super) fn put(noter: &Noter, block: &[u8], out: &mut Vec<u8>) -> std::io::Result<()> {
    let start = out.len();
    (noter.note)(block, out);
    if out.len() - start != noter.len as usize {
        return Err(std::io::Error::other(
            "a block's note is not of its table's length",
        ));
    }
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(())
}
