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
mod tests {
    use super::*;

    #[test]
    fn depth_limit() {
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(parse_value(&mut ok.into_bytes()).is_ok());
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let err = parse_value(&mut deep.into_bytes()).unwrap_err();
        assert_eq!(
            err,
            Error::InvalidJson("nested deeper than 128 levels".into())
        );
        // Brackets inside strings, including after escaped quotes, do not count.
        let s = format!(r#"{{"a":"\"{}"}}"#, "[".repeat(1000));
        assert!(parse_value(&mut s.into_bytes()).is_ok());
        // An escaped backslash does not escape the quote after it.
        let s = format!(r#"{{"a":"\\\\","b":"x\"{}"}}"#, "[".repeat(1000));
        assert!(parse_value(&mut s.into_bytes()).is_ok());
        // An escape at the very end of the input does not read past it.
        assert!(check_depth(b"\"\\", 1).is_ok());
        assert!(check_depth(b"\"abc", 1).is_ok());
        assert!(check_depth(b"[[", 1).is_err());
    }

    /// Both ways of parsing to a tape give what scanning first, then parsing, gives:
    /// the depth error wins over any other.
    #[test]
    fn tape_depth_as_scanned() {
        let deep = |n: usize, tail: &str| format!("{}{tail}{}", "[".repeat(n), "]".repeat(n));
        let inputs = [
            deep(MAX_DEPTH, "1"),
            deep(MAX_DEPTH + 1, "1"),
            deep(MAX_DEPTH + 1, "nope"),
            deep(MAX_DEPTH, "nope"),
            deep(100_000, ""),
            format!(r#"{{"a":{}}}"#, deep(MAX_DEPTH - 1, r#"{"b":""[[[["}"#)),
            format!(r#"{{"a":{}}}"#, deep(MAX_DEPTH, r#"{"b":""[[[["}"#)),
            format!(r#"{{"a":"\"{}"#, "[".repeat(300)),
            format!(r#"[{}, "x" "y"]"#, deep(MAX_DEPTH, "")),
            r#"{"a":[{"b":[]},{"c":{}}],"d":[[[]]]}"#.to_string(),
            "[1,2".to_string(),
            String::new(),
        ];
        let mut inputs: Vec<Vec<u8>> = inputs.into_iter().map(String::into_bytes).collect();
        // Invalid UTF-8, deep and not.
        inputs.push([r#"{"a":"#.repeat(200).as_bytes(), b"\xff"].concat());
        inputs.push([r#"{"a":"#.repeat(2).as_bytes(), b"\"\xff\"}}"].concat());
        for input in inputs {
            let scanned = check_depth(&input, MAX_DEPTH).and_then(|()| {
                simd_json::to_tape(&mut input.clone())
                    .map(|_| ())
                    .map_err(|e| Error::InvalidJson(e.to_string()))
            });
            let shown = String::from_utf8_lossy(&input[..input.len().min(80)]).into_owned();
            for scratch_max in [0, usize::MAX] {
                let got = parse_tape_within(&mut input.clone(), scratch_max).map(|_| ());
                assert_eq!(got, scanned, "{scratch_max}: {shown}");
            }
            let got = parse_large_keeping(&mut input.clone()).map(|_| ());
            assert_eq!(got, scanned, "kept: {shown}");
        }
        let sibling = format!("[{},{}]", deep(MAX_DEPTH - 1, ""), deep(MAX_DEPTH - 1, ""));
        assert!(parse_tape(&mut sibling.into_bytes()).is_ok());
    }

    #[test]
    fn kept_values_are_few_and_counted() {
        let kept = Kept::<Vec<u8>>::new(1000);
        for _ in 0..10 {
            kept.give(vec![0u8; 100], 100);
        }
        assert_eq!(kept.lock().len(), KEPT_EACH);
        assert_eq!(kept.bytes(), KEPT_EACH * 100);
        assert_eq!(kept.take().map(|v| v.len()), Some(100));
        assert_eq!(kept.bytes(), (KEPT_EACH - 1) * 100);
        while kept.take().is_some() {}
        assert_eq!(kept.bytes(), 0);
    }

    #[test]
    fn a_far_larger_value_is_freed_until_it_is_the_usual() {
        let kept = Kept::<Vec<u8>>::new(100);
        for _ in 0..20 {
            kept.give(Vec::new(), 100);
        }
        while kept.take().is_some() {}
        // Four times the usual (or the floor) is kept, more is not.
        kept.give(Vec::new(), 400);
        assert_eq!(kept.bytes(), 400);
        kept.give(Vec::new(), 10_000);
        assert_eq!(kept.bytes(), 400, "a rare large value is freed");
        // A run of them becomes the usual, and they are kept again.
        let gives = (1..=16).find(|_| {
            kept.give(Vec::new(), 10_000);
            kept.bytes() > 400
        });
        assert!(gives.is_some_and(|n| n > 1), "{gives:?}");
        assert_eq!(kept.bytes(), 10_400);
    }

    /// Parses on many threads at once share the few kept buffers, whatever sizes the
    /// bodies before them had, and give the tapes a fresh parse gives; what is kept
    /// stays within its bound and its count.
    #[test]
    fn kept_buffers_are_shared_across_threads() {
        let body = |events: usize, seed: usize| {
            let one = format!(
                r#"{{"event":"e{seed}","properties":{{"n":{seed},"s":"a\"b","l":[1,2,{{}}]}}}}"#
            );
            format!("[{}]", vec![one; events].join(","))
        };
        std::thread::scope(|s| {
            for t in 0..8 {
                s.spawn(move || {
                    for i in 0..40 {
                        // Mostly small bodies, now and then one far larger.
                        let events = if (i + t) % 13 == 0 {
                            3000
                        } else {
                            1 + (i * 7 + t) % 40
                        };
                        let text = body(events, i * 8 + t);
                        let mut reference = text.clone().into_bytes();
                        let want = simd_json::to_tape(&mut reference).unwrap().0;
                        let mut bytes = text.clone().into_bytes();
                        let parsed = parse_tape_keeping(&mut bytes).unwrap();
                        assert_eq!(parsed.tape, want);
                        assert_eq!(parsed.original.as_deref(), Some(text.as_bytes()));
                        recycle(parsed.tape);
                        recycle_original(parsed.original.unwrap());
                    }
                });
            }
        });
        fn check<T>(kept: &Kept<T>, max: usize) {
            let items = kept.lock();
            assert!(items.len() <= KEPT_EACH);
            assert_eq!(kept.bytes(), items.iter().map(|(_, w)| w).sum::<usize>());
            assert!(items.iter().all(|(_, w)| *w <= max));
        }
        check(&WORKING, 2 * SCRATCH_MAX_BYTES + 96 + SCRATCH_MAX_BYTES * 4);
        check(&TAPES, SCRATCH_MAX_NODES * size_of::<Node<'static>>());
        check(&ORIGINALS, SCRATCH_MAX_BYTES);
    }

    #[test]
    fn finds_quotes_and_backslashes() {
        for b in 0u8..=255 {
            for len in 0..20 {
                for at in 0..len {
                    let mut s = vec![b'a'; len];
                    s[at] = b;
                    let want = (b == b'"' || b == b'\\').then_some(at);
                    assert_eq!(quote_or_backslash(&s, 0), want, "{b} at {at} of {len}");
                    if at > 0 {
                        assert_eq!(quote_or_backslash(&s, 1), want, "{b} at {at} of {len}");
                    }
                }
            }
        }
        // Both, in either order: the first wins.
        assert_eq!(quote_or_backslash(b"abcdefgh\\ij\"", 0), Some(8));
        assert_eq!(quote_or_backslash(b"abcdefgh\"ij\\", 0), Some(8));
        assert_eq!(quote_or_backslash(b"ab", 3), None);
        assert_eq!(quote_or_backslash(b"ab", 2), None);
    }

    #[test]
    fn parses_and_rejects() {
        let v = parse_value(&mut br#"{"a":[1,2.5,"x",null,true]}"#.to_vec()).unwrap();
        assert_eq!(v, serde_json::json!({"a":[1,2.5,"x",null,true]}));
        assert!(matches!(
            parse_value(&mut b"{\"a\":".to_vec()),
            Err(Error::InvalidJson(_))
        ));
        assert!(matches!(
            parse_value(&mut b"\xff\xfe".to_vec()),
            Err(Error::InvalidJson(_))
        ));
        // Integers beyond 64 bits become floats instead of failing.
        let big = parse_value(&mut b"123456789012345678901234567890".to_vec()).unwrap();
        assert!(big.as_f64().unwrap() > 1e29);
    }
}
