//! What a table notes of each block of a run, so a visit may leave the block unread
//! ([`super::super::Visitor::pass_over_noted`]): written by the fold beside the blocks
//! for a table that asks ([`Noter`]), or, for a run written before, made by readers
//! as they read its blocks and kept while the run is open.
//!
//! A note is in parts, each of a fixed length, and a visit reads one of them (a search
//! for a text a value must hold reads other facts than one for a text it must lack).
//! On disk, after the blocks: each part's array, one a block, each followed by the
//! CRC32 of its bytes; the index ends with where they start, how many parts and each
//! one's length (a build that predates them reads the index as before and never looks
//! there). A visit reads its part of the notes of the blocks it may read at once, a
//! window at a time ([`Window`]); a note that fails its CRC, or a window that cannot
//! be read, is no note: the block is read.

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

/// Parts a note may have: an index naming more is damaged.
const MAX_PARTS: usize = 8;

/// How a table notes the blocks its folds write.
#[derive(Clone, Copy, Debug)]
pub struct Noter {
    /// Bytes of each part of every note.
    pub parts: &'static [u32],
    /// Append the note of a block, given its entries decompressed: its parts one
    /// after the other.
    pub note: fn(&[u8], &mut Vec<u8>),
}

/// A run's notes: those the fold wrote (`stored`: where each part's first is, and the
/// part's length), or those readers made, by block and part, in memory only, within
/// [`MAX_NOTE_BYTES`] for every run together (a note past it is not kept); they go
/// with the run when a fold replaces it.
#[derive(Default)]
pub(in super::super) struct Notes {
    stored: Vec<(u64, u32)>,
    by_block: RwLock<Kept>,
    /// Their bytes, counted in [`NOTE_BYTES`] too.
    bytes: AtomicUsize,
}

/// Notes readers made, by block and part.
type Kept = HashMap<(u32, u8), Box<[u8]>>;

/// A visit's notes of a run read from its file: part `part` of those of `blocks`.
#[derive(Default)]
pub(in super::super) struct Window {
    bytes: Vec<u8>,
    part: usize,
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
        let mut notes = Notes::default();
        let word = |at: usize| Some(u32::from_le_bytes(rest.get(at..at + 4)?.try_into().ok()?));
        let (Some(at), Some(count)) = (rest.get(..8), word(8)) else {
            return notes;
        };
        let mut at = u64::from_le_bytes(at.try_into().unwrap_or_default());
        if count as usize > MAX_PARTS || at < super::MAGIC.len() as u64 {
            return notes;
        }
        for part in 0..count as usize {
            // A damaged index may name lengths whose arrays run past any file.
            let next = word(12 + part * 4).filter(|&l| l > 0).and_then(|len| {
                let array = (u64::from(len) + 4).checked_mul(blocks as u64)?;
                Some((len, at.checked_add(array)?))
            });
            let Some((len, end)) = next else {
                notes.stored.clear();
                return notes;
            };
            notes.stored.push((at, len));
            at = end;
        }
        if at > index_at {
            notes.stored.clear();
        }
        notes
    }

    /// Whether the fold wrote notes of the run's blocks.
    pub(in super::super) fn on_disk(&self) -> bool {
        !self.stored.is_empty()
    }

    /// `f` of part `part` of the note of block `i` (of a visit reading blocks up to
    /// `end`, through `window`), if there is one.
    pub(in super::super) fn with<R>(
        &self,
        file: &File,
        (part, i, end): (usize, usize, usize),
        window: &mut Window,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        if !self.on_disk() {
            let notes = self.by_block.read().unwrap_or_else(|e| e.into_inner());
            return notes.get(&(i as u32, part as u8)).map(|n| f(n));
        }
        let &(at, len) = self.stored.get(part)?;
        let each = len as usize + 4;
        if !window.blocks.contains(&i) || window.part != part {
            let count = (WINDOW_BYTES / each).clamp(1, end.saturating_sub(i).max(1));
            window.bytes.resize(count * each, 0);
            window.part = part;
            window.blocks = match file.read_exact_at(&mut window.bytes, at + (i * each) as u64) {
                Ok(()) => i..i + count,
                Err(_) => 0..0,
            };
        }
        let from = (i.checked_sub(window.blocks.start)?) * each;
        let (note, crc) = window.bytes.get(from..from + each)?.split_at(len as usize);
        (crc == crc32fast::hash(note).to_le_bytes()).then(|| f(note))
    }

    /// Keep part `part` of the note `make` makes of block `i` read, for a run with none
    /// on disk that keeps none of it yet, unless the notes of every run are at their
    /// bound.
    pub(in super::super) fn keep(
        &self,
        (part, i): (usize, usize),
        make: impl FnOnce() -> Option<Vec<u8>>,
    ) {
        let key = (i as u32, part as u8);
        let kept = |n: &Kept| n.contains_key(&key);
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
        match notes.insert(key, note.into()) {
            // Noted twice at once: the first one's bytes were counted already.
            Some(_) => NOTE_BYTES.fetch_sub(bytes, Ordering::Relaxed),
            None => self.bytes.fetch_add(bytes, Ordering::Relaxed),
        };
    }

    /// The bytes its notes take in memory.
    pub(in super::super) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The first block one of whose stored notes' parts fails its CRC or cannot be
    /// read, if one does.
    pub(in super::super) fn damaged(&self, file: &File, blocks: usize) -> Option<usize> {
        let mut window = Window::default();
        let mut read = |p, i| {
            self.with(file, (p, i, blocks), &mut window, |_| ())
                .is_some()
        };
        let mut each = (0..self.stored.len()).flat_map(|p| (0..blocks).map(move |i| (p, i)));
        each.find(|&(p, i)| !read(p, i)).map(|(_, i)| i)
    }
}

/// Append the note of `block` by `noter`, each part to its own of `parts` with its
/// CRC (`scratch` holds the whole note on the way).
pub(in super::super) fn put(
    noter: &Noter,
    block: &[u8],
    scratch: &mut Vec<u8>,
    parts: &mut [Vec<u8>],
) -> std::io::Result<()> {
    scratch.clear();
    (noter.note)(block, scratch);
    let whole: usize = noter.parts.iter().map(|&l| l as usize).sum();
    if scratch.len() != whole || parts.len() != noter.parts.len() {
        return Err(std::io::Error::other(
            "a block's note is not of its table's length",
        ));
    }
    let mut rest = &scratch[..];
    for (out, &len) in parts.iter_mut().zip(noter.parts) {
        let (note, after) = rest.split_at(len as usize);
        out.extend_from_slice(note);
        out.extend_from_slice(&crc32fast::hash(note).to_le_bytes());
        rest = after;
    }
    Ok(())
}
