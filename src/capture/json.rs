//! JSON parsing for ingestion, with simd-json, guarded against input that would
//! overflow the stack when turned into (or dropped as) a recursive value.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde_json::Value;
use simd_json::{Buffers, Node, Tape};

use super::Error;

/// Deeper nesting than any real event has; serde_json's own default limit.
pub const MAX_DEPTH: usize = 128;

/// Parse bytes into a JSON value. The buffer is used as scratch space by simd-json.
pub fn parse_value(bytes: &mut [u8]) -> Result<Value, Error> {
    check_depth(bytes, MAX_DEPTH)?;
    simd_json::serde::from_slice::<Value>(bytes).map_err(|e| Error::InvalidJson(e.to_string()))
}

/// Parse bytes into a simd-json tape that borrows its strings from `bytes`, with the
/// same checks and errors as [`parse_value`]. Hand the tape back with [`recycle`].
pub fn parse_tape(bytes: &mut [u8]) -> Result<Vec<Node<'_>>, Error> {
    let parsed = parse_tape_within(bytes, SCRATCH_MAX_BYTES)?;
    if let Some(original) = parsed.original {
        recycle_original(original);
    }
    Ok(parsed.tape)
}

/// A body parsed by [`parse_tape_keeping`].
pub struct Parsed<'a> {
    pub tape: Vec<Node<'a>>,
    /// The body as it was before simd-json rewrote its escaped strings in place, at
    /// the same offsets; kept only for a body small enough to have been copied
    /// anyway. Hand it back with [`recycle_original`].
    pub original: Option<Vec<u8>>,
}

/// [`parse_tape`], also keeping the body as sent: a kept event whose bytes there are
/// already in the stored form is copied from it instead of written out again.
pub fn parse_tape_keeping(bytes: &mut [u8]) -> Result<Parsed<'_>, Error> {
    if bytes.len() > SCRATCH_MAX_BYTES && bytes.len() <= KEEP_MAX_BYTES {
        return parse_large_keeping(bytes);
    }
    parse_tape_within(bytes, SCRATCH_MAX_BYTES)
}

/// A body past the scratch, parsed beside a copy of it as sent. As for a small body,
/// the depth is read off the tape and the bytes are scanned only when the parse
/// fails (from the copy: simd-json rewrote the body), so nesting too deep is still
/// the error reported before any other.
fn parse_large_keeping(bytes: &mut [u8]) -> Result<Parsed<'_>, Error> {
    let original = bytes.to_vec();
    let mut buffers = Buffers::new(bytes.len());
    match simd_json::to_tape_with_buffers(bytes, &mut buffers) {
        Ok(tape) if deeper_than(&tape.0, MAX_DEPTH) => Err(too_deep(MAX_DEPTH)),
        Ok(tape) => Ok(Parsed {
            tape: tape.0,
            original: Some(original),
        }),
        Err(e) => {
            check_depth(&original, MAX_DEPTH)?;
            Err(Error::InvalidJson(e.to_string()))
        }
    }
}

/// [`parse_tape`], reusing the kept scratch memory ([`Kept`]) for bodies up to
/// `scratch_max` bytes.
///
/// A small body is parsed first and its depth read off the tape, which is far cheaper
/// than a pass over its bytes; only a body that fails to parse is scanned, from a copy
/// (simd-json rewrites strings in place), so that nesting too deep is still the error
/// reported before any other. A large body is scanned first, not copied (but see
/// [`parse_large_keeping`]).
fn parse_tape_within(bytes: &mut [u8], scratch_max: usize) -> Result<Parsed<'_>, Error> {
    if bytes.len() > scratch_max {
        check_depth(bytes, MAX_DEPTH)?;
        let mut buffers = Buffers::new(bytes.len());
        return simd_json::to_tape_with_buffers(bytes, &mut buffers)
            .map(|tape| Parsed {
                tape: tape.0,
                original: None,
            })
            .map_err(|e| Error::InvalidJson(e.to_string()));
    }
    let mut working = WORKING
        .take()
        .filter(|w| w.len >= bytes.len())
        .unwrap_or_else(|| Working::new(bytes.len().next_power_of_two().max(USUAL_BODY_BYTES)));
    let mut original = ORIGINALS.take().unwrap_or_default();
    original.clear();
    original.extend_from_slice(bytes);
    let mut tape = Tape(TAPES.take().unwrap_or_default()).reset();
    let parsed = simd_json::fill_tape(bytes, &mut working.buffers, &mut tape);
    let result = match parsed {
        Ok(()) if deeper_than(&tape.0, MAX_DEPTH) => Err(too_deep(MAX_DEPTH)),
        Ok(()) => Ok(()),
        Err(e) => check_depth(&original, MAX_DEPTH).and(Err(Error::InvalidJson(e.to_string()))),
    };
    // The buffers go back now, the tape and the original when the caller is done
    // with them.
    let weight = working.bytes();
    WORKING.give(working, weight);
    match result {
        Ok(()) => Ok(Parsed {
            tape: tape.0,
            original: Some(original),
        }),
        Err(e) => {
            recycle(tape.0);
            recycle_original(original);
            Err(e)
        }
    }
}

/// Keep a body copy from [`parse_tape_keeping`] for a later parse.
pub fn recycle_original(mut original: Vec<u8>) {
    if original.capacity() > SCRATCH_MAX_BYTES {
        return;
    }
    original.clear();
    let weight = original.capacity();
    ORIGINALS.give(original, weight);
}

/// Whether a tape nests containers more than `max` deep.
fn deeper_than(tape: &[Node<'_>], max: usize) -> bool {
    // Where each open container ends; entries are dropped once passed.
    let mut ends = [0usize; MAX_DEPTH + 1];
    let max = max.min(MAX_DEPTH);
    let mut depth = 0;
    for (i, node) in tape.iter().enumerate() {
        if let Node::Object { count, .. } | Node::Array { count, .. } = node {
            while depth > 0 && ends[depth - 1] <= i {
                depth -= 1;
            }
            if depth == max {
                return true;
            }
            ends[depth] = i + 1 + count;
            depth += 1;
        }
    }
    false
}

fn too_deep(max: usize) -> Error {
    Error::InvalidJson(format!("nested deeper than {max} levels"))
}

/// Keep a tape's memory for a later [`parse_tape`].
pub fn recycle(tape: Vec<Node<'_>>) {
    if tape.capacity() > SCRATCH_MAX_NODES {
        return;
    }
    let tape: Tape<'static> = Tape(tape).reset();
    let weight = tape.0.capacity() * size_of::<Node<'static>>();
    TAPES.give(tape.0, weight);
}

/// The bytes of the parser's scratch memory kept between parses (`/metrics`,
/// `flagpost_memory_bytes{holder="parser_scratch"}`).
pub fn kept_bytes() -> usize {
    WORKING.bytes() + TAPES.bytes() + ORIGINALS.bytes()
}

/// Bodies up to this size are parsed with memory kept between parses (a few times
/// this size: simd-json's copies and indexes, and the tape), so a request does not
/// allocate and page in fresh buffers for them. A batch of 100 events is ~60 KiB.
const SCRATCH_MAX_BYTES: usize = 256 * 1024;
/// The body size kept buffers are first made for, and below which a kept value is
/// never thought far larger than usual.
const USUAL_BODY_BYTES: usize = SCRATCH_MAX_BYTES / 4;
/// Bodies past the scratch, up to this size, are still kept as sent by
/// [`parse_tape_keeping`]: the copy is one memcpy, where writing each event out
/// again a value at a time costs about as much as parsing it (an edge forwards
/// 1000-event bodies of about 500 KiB). It adds one body to the few a large decode
/// holds; PostHog's capture refuses bodies past 20 MB.
const KEEP_MAX_BYTES: usize = 32 * 1024 * 1024;
/// A tape kept for reuse holds at most this many nodes (24 bytes each): simd-json
/// reserves one per structural character of the body, about one in six bytes of an
/// event.
const SCRATCH_MAX_NODES: usize = SCRATCH_MAX_BYTES / 4;
/// Values of each kind kept: as many as parse at once in service, a body on each
/// runtime worker (two on the small VMs this runs on) and one in each large decode
/// (`App::heavy_decodes`, two). A parse finding none makes its own, and only this
/// many are kept when they come back.
const KEPT_EACH: usize = 4;
/// A value given back this many times larger than the usual one is freed, not kept.
const FAR_LARGER: usize = 4;

/// simd-json's buffers and the body length they were made for. A longer body would
/// grow them inside simd-json, out of sight of the count, so it gets buffers made
/// for it instead.
struct Working {
    buffers: Buffers,
    len: usize,
}

impl Working {
    fn new(len: usize) -> Working {
        Working {
            buffers: Buffers::new(len),
            len,
        }
    }

    /// Its copies of the body and of its strings, as made for `len` with simd-json's
    /// padding (32 and 64 bytes), and its index of structural characters by the
    /// length of the last parse: that index's capacity is private, so this part is
    /// a floor.
    fn bytes(&self) -> usize {
        2 * self.len + 96 + size_of_val(self.buffers.structural_indexes())
    }
}

/// A few values of one kind (simd-json's buffers, tapes, body copies) kept between
/// parses for whichever thread parses next, with their bytes counted. One of each
/// kept by every thread that ever parsed grew with the blocking pool instead: 17
/// threads kept 12.4 MiB at 5 M events.
struct Kept<T> {
    items: Mutex<Vec<(T, usize)>>,
    bytes: AtomicUsize,
    /// A moving average of the bytes of the values given back.
    usual: AtomicUsize,
    /// Values up to this many bytes are never thought far larger than usual.
    floor: usize,
}

static WORKING: Kept<Working> = Kept::new(2 * USUAL_BODY_BYTES);
static TAPES: Kept<Vec<Node<'static>>> =
    Kept::new(USUAL_BODY_BYTES / 4 * size_of::<Node<'static>>());
static ORIGINALS: Kept<Vec<u8>> = Kept::new(USUAL_BODY_BYTES);

impl<T> Kept<T> {
    const fn new(floor: usize) -> Kept<T> {
        Kept {
            items: Mutex::new(Vec::new()),
            bytes: AtomicUsize::new(0),
            usual: AtomicUsize::new(0),
            floor,
        }
    }

    fn take(&self) -> Option<T> {
        let mut items = self.lock();
        let (item, weight) = items.pop()?;
        self.bytes.fetch_sub(weight, Ordering::Relaxed);
        Some(item)
    }

    /// Keep `item` of `weight` bytes for a later parse, unless [`KEPT_EACH`] are kept
    /// already or it is [`FAR_LARGER`] than usual: a rare large batch's memory is
    /// freed rather than kept for the small ones after it, while a run of large
    /// batches soon makes their size the usual one.
    fn give(&self, item: T, weight: usize) {
        let usual = self.usual.load(Ordering::Relaxed);
        // A sixteenth of the way to this one; a concurrent update may be lost.
        self.usual
            .store(usual - usual / 16 + weight / 16, Ordering::Relaxed);
        if weight > FAR_LARGER * usual.max(self.floor) {
            return;
        }
        let mut items = self.lock();
        if items.len() < KEPT_EACH {
            items.push((item, weight));
            self.bytes.fetch_add(weight, Ordering::Relaxed);
        }
    }

    fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Vec<(T, usize)>> {
        self.items.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Reject nesting beyond `max` with one cheap pass over the bytes (brackets inside
/// strings do not count). Building a value from 100,000 nested arrays would otherwise
/// recurse that deep. String contents, most of a payload, are skipped eight bytes at
/// a time.
fn check_depth(bytes: &[u8], max: usize) -> Result<(), Error> {
    let mut depth = 0usize;
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'"' => {
                i += 1;
                // To the closing quote, stepping over escaped characters.
                loop {
                    match quote_or_backslash(bytes, i) {
                        Some(j) if bytes[j] == b'\\' => i = j + 2,
                        Some(j) => {
                            i = j + 1;
                            break;
                        }
                        None => return Ok(()),
                    }
                }
                continue;
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return Err(too_deep(max));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// The position of the first `"` or `\` at or after `from`. Strings are short, so a
/// word at a time beats a call into memchr for each.
fn quote_or_backslash(bytes: &[u8], from: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // The lowest set high bit marks the first zero byte of `w` (higher ones may be
    // false hits from the borrow, which the lowest never is).
    let zero = |w: u64| w.wrapping_sub(ONES) & !w & HIGH;
    let rest = bytes.get(from..)?;
    let mut chunks = rest.chunks_exact(8);
    let mut at = from;
    for chunk in &mut chunks {
        let mut a = [0u8; 8];
        a.copy_from_slice(chunk);
        let w = u64::from_le_bytes(a);
        let hits = zero(w ^ (ONES * u64::from(b'"'))) | zero(w ^ (ONES * u64::from(b'\\')));
        if hits != 0 {
            return Some(at + (hits.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| b == b'"' || b == b'\\')
        .map(|j| at + j)
}

#[cfg(test)]
#[path = "tests/json.rs"]
mod tests;
