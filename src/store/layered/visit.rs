//! A scan of a key range that costs what reading its blocks costs: each entry is
//! given to the reader as the decompressed block holds it, with no copy and no page
//! of entries built ([`super::Iter`] makes an owned key and value of each, about 200
//! ns an entry, the most of a search of a million persons' values). Consecutive blocks
//! are read from the file at once ([`READ_BYTES`]) into buffers the visit keeps, and a
//! reader may leave a block unread: from its bounds alone (the index's first keys),
//! from the table's note of the block (written with the run, or for a run written
//! before notes were, made when a reader last read the block and kept with the run),
//! or from its decompressed bytes before any entry of it is given ([`Visitor`]).

use std::ops::Bound;
use std::os::unix::fs::FileExt;

use super::run::{entries, Run, Window};
use super::Layered;

/// Stored bytes of consecutive blocks a visit reads from the file at once: a key of a
/// million persons' entries is about 18,000 blocks, and a read of each cost about a
/// microsecond of system time.
const READ_BYTES: u64 = 256 * 1024;

/// What a visit gives its entries to.
pub trait Visitor {
    /// Whether a run's block can be left unread, knowing only that each key it holds
    /// is at least `first` and below `next` (the next block's first key). Its keys
    /// that the delta rewrites are still given, from the delta.
    fn pass_over(&mut self, _first: &[u8], _next: &[u8]) -> bool {
        false
    }

    /// Whether a run's block can be left unread, given its entries decompressed (see
    /// [`block_entries`]), before any of them is given.
    fn pass_over_block(&mut self, _raw: &[u8]) -> bool {
        false
    }

    /// Which part of the blocks' notes the visit gives [`Visitor::pass_over_noted`]
    /// (see [`super::Noter`]), if it reads them.
    fn reads_notes(&self) -> Option<usize> {
        None
    }

    /// The part it reads of a note of a run's block written before its table's fold
    /// noted blocks (as its [`super::Noter`] makes it), given its entries
    /// decompressed: the run keeps it while it is open (within a bound). None keeps no
    /// note. Asked once a block and part, when none is kept.
    fn note(&mut self, _raw: &[u8]) -> Option<Vec<u8>> {
        None
    }

    /// Whether a run's block can be left unread, given the part it reads of the
    /// table's note of it. Its keys that the delta rewrites are still given, from the
    /// delta.
    fn pass_over_noted(&mut self, _note: &[u8]) -> bool {
        false
    }

    /// One entry (never a tombstone), in key order.
    fn entry(&mut self, key: &[u8], value: &[u8]);
}

impl<F: FnMut(&[u8], &[u8])> Visitor for F {
    fn entry(&mut self, key: &[u8], value: &[u8]) {
        self(key, value)
    }
}

/// The entries of a decompressed block as [`Visitor::pass_over_block`] is given it:
/// each as the offset of its key in `raw`, its key and its value, in key order, up to
/// where they are cut (if they are).
pub fn block_entries(raw: &[u8]) -> impl Iterator<Item = (usize, &[u8], &[u8])> {
    // Each entry is its key's and value's lengths, u32 each, then the key.
    entries(raw).map_while(|e| e).scan(0, |at, (k, v)| {
        let key_at = *at + 8;
        *at = key_at + k.len() + v.len();
        Some((key_at, k, v))
    })
}

impl Layered {
    /// Every entry from `from` on and below `to` (none: to the end), in key order, the
    /// delta's over the runs', given to `f` (tombstones are not). The delta's part of
    /// the range is read first, then the runs, as an iteration reads them (see the
    /// module docs of [`super`]).
    pub fn visit(&self, from: &[u8], to: Option<&[u8]>, mut f: impl FnMut(&[u8], &[u8])) {
        self.visit_with(from, to, &mut f)
    }

    /// [`Layered::visit`], asking `v` which of the runs' blocks it can leave unread.
    pub fn visit_with(&self, from: &[u8], to: Option<&[u8]>, v: &mut impl Visitor) {
        let upper = to.map_or(Bound::Unbounded, |t| Bound::Excluded(t.to_vec()));
        let delta = self
            .delta()
            .page(&(Bound::Included(from.to_vec()), upper), usize::MAX);
        let runs = self.inner.runs.load_full();
        let mut merged = Merged {
            delta: delta.iter().peekable(),
            v,
        };
        let mut buffers = Buffers::default();
        let parts = runs.parts();
        for part in parts.iter().skip(runs.part_of(from)) {
            if to.is_some_and(|t| *part.lower >= *t) {
                break;
            }
            visit_run(&part.run, from, to, &mut merged, &mut buffers);
        }
        for (dk, dv) in merged.delta {
            if !dv.is_empty() {
                merged.v.entry(dk, dv);
            }
        }
    }
}

/// The runs' entries with the delta's merged in: a delta entry before a run's entry is
/// given first, and one of the same key replaces it.
struct Merged<'a, I: Iterator<Item = &'a (sled::IVec, sled::IVec)>, V> {
    delta: std::iter::Peekable<I>,
    v: &'a mut V,
}

impl<'a, I: Iterator<Item = &'a (sled::IVec, sled::IVec)>, V: Visitor> Visitor
    for Merged<'a, I, V>
{
    fn pass_over(&mut self, first: &[u8], next: &[u8]) -> bool {
        self.v.pass_over(first, next)
    }

    fn pass_over_block(&mut self, raw: &[u8]) -> bool {
        self.v.pass_over_block(raw)
    }

    fn reads_notes(&self) -> Option<usize> {
        self.v.reads_notes()
    }

    fn note(&mut self, raw: &[u8]) -> Option<Vec<u8>> {
        self.v.note(raw)
    }

    fn pass_over_noted(&mut self, note: &[u8]) -> bool {
        self.v.pass_over_noted(note)
    }

    fn entry(&mut self, k: &[u8], v: &[u8]) {
        while let Some((dk, dv)) = self.delta.next_if(|(dk, _)| &dk[..] <= k) {
            if !dv.is_empty() {
                self.v.entry(dk, dv);
            }
            if &dk[..] == k {
                return;
            }
        }
        self.v.entry(k, v);
    }
}

/// What a visit reads blocks into, kept from block to block.
#[derive(Default)]
struct Buffers {
    stored: Vec<u8>,
    raw: Vec<u8>,
    /// The notes of the run being read.
    notes: Window,
}

/// The entries of `run` from `from` on and below `to`, given to `v`; blocks that cannot
/// be read are passed over (and reported).
fn visit_run(
    run: &Run,
    from: &[u8],
    to: Option<&[u8]>,
    v: &mut impl Visitor,
    buffers: &mut Buffers,
) {
    let blocks = &run.blocks;
    let first = run.first_block(from);
    let end = to.map_or(blocks.len(), |t| run.blocks_to_below(t));
    let part = v.reads_notes();
    buffers.notes.clear();
    let passed = |i: usize, v: &mut dyn Visitor, notes: &mut Window| {
        let bounded = i + 1 < blocks.len() && v.pass_over(run.first_key(i), run.first_key(i + 1));
        let mut noted = |p| {
            run.notes
                .with(&run.file, (p, i, end), notes, |n| v.pass_over_noted(n))
        };
        bounded || part.is_some_and(|p| noted(p) == Some(true))
    };
    // The blocks to read, as spans of consecutive ones.
    let mut i = first;
    while i < end {
        if passed(i, v, &mut buffers.notes) {
            i += 1;
            continue;
        }
        let mut span = Span {
            start: i,
            end: i + 1,
            bytes: u64::from(blocks[i].stored),
            check_from: i == first,
        };
        while span.end < end {
            let (b, last) = (&blocks[span.end], &blocks[span.end - 1]);
            let follows = last.offset + u64::from(last.stored) == b.offset;
            let bytes = span.bytes + u64::from(b.stored);
            if !follows || bytes > READ_BYTES || passed(span.end, v, &mut buffers.notes) {
                break;
            }
            (span.bytes, span.end) = (bytes, span.end + 1);
        }
        i = span.end;
        if !read_span(run, &span, to, from, v, buffers) {
            return;
        }
    }
}

/// Blocks `start..end`, consecutive in the file, of `bytes` stored bytes; the first
/// may hold keys before the visit's start if `check_from`.
struct Span {
    start: usize,
    end: usize,
    bytes: u64,
    check_from: bool,
}

/// The entries of `span`'s blocks from `from` on and below `to`, given to `v`; false
/// once a key at or past `to` was met.
fn read_span(
    run: &Run,
    span: &Span,
    to: Option<&[u8]>,
    from: &[u8],
    v: &mut impl Visitor,
    buffers: &mut Buffers,
) -> bool {
    let blocks = &run.blocks;
    let Buffers { stored, raw, .. } = buffers;
    stored.resize(span.bytes as usize, 0);
    let read = run.file.read_exact_at(stored, blocks[span.start].offset);
    let mut at = 0;
    for i in span.start..span.end {
        let len = blocks[i].stored as usize;
        let unpacked = match &read {
            Ok(()) => (run.unpack(i, &stored[at..at + len], raw))
                .map_err(|e| run.report(i, &e))
                .is_ok(),
            // Read again alone, so that only a block that fails is reported.
            Err(_) => run.readable_block(i).map(|b| *raw = b).is_some(),
        };
        at += len;
        if !unpacked {
            continue;
        }
        if let Some(part) = v.reads_notes() {
            run.notes.keep((part, i), || v.note(raw));
        }
        if v.pass_over_block(raw) {
            continue;
        }
        // Past the first block every key is at or after `from`; when the next block
        // starts at or before `to`, every key of this one is below it.
        let check_from = span.check_from && i == span.start;
        let check_to = to.filter(|t| i + 1 >= blocks.len() || run.first_key(i + 1) > *t);
        for entry in entries(raw) {
            let Some((k, value)) = entry else {
                run.report(i, &run.bad_block(i, "its entries are cut"));
                break;
            };
            if check_to.is_some_and(|t| k >= t) {
                return false;
            }
            if !check_from || k >= from {
                v.entry(k, value);
            }
        }
    }
    true
}

#[cfg(test)]
#[path = "tests/visit.rs"]
mod tests;
