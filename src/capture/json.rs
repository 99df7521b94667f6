//! JSON parsing for ingestion, with simd-json, guarded against input that would
//! overflow the stack when turned into (or dropped as) a recursive value.

use std::cell::RefCell;

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

/// [`parse_tape`], reusing this thread's scratch memory for bodies up to `scratch_max`
/// bytes.
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
    let mut scratch = SCRATCH.with(|s| s.borrow_mut().take()).unwrap_or_default();
    scratch.original.clear();
    scratch.original.extend_from_slice(bytes);
    let mut tape = std::mem::replace(&mut scratch.tape, Tape(Vec::new())).reset();
    let parsed = simd_json::fill_tape(bytes, &mut scratch.buffers, &mut tape);
    let result = match parsed {
        Ok(()) if deeper_than(&tape.0, MAX_DEPTH) => Err(too_deep(MAX_DEPTH)),
        Ok(()) => Ok(()),
        Err(e) => {
            check_depth(&scratch.original, MAX_DEPTH).and(Err(Error::InvalidJson(e.to_string())))
        }
    };
    let original = if result.is_ok() {
        Some(std::mem::take(&mut scratch.original))
    } else {
        if scratch.original.capacity() > scratch_max {
            scratch.original = Vec::new();
        }
        None
    };
    // The scratch goes back now, the tape and the original when the caller is done
    // with them.
    SCRATCH.with(|s| *s.borrow_mut() = Some(scratch));
    match result {
        Ok(()) => Ok(Parsed {
            tape: tape.0,
            original,
        }),
        Err(e) => {
            recycle(tape.0);
            Err(e)
        }
    }
}

/// Keep a body copy from [`parse_tape_keeping`] for the next parse on this thread.
pub fn recycle_original(mut original: Vec<u8>) {
    if original.capacity() > SCRATCH_MAX_BYTES {
        return;
    }
    original.clear();
    SCRATCH.with(|s| {
        if let Some(scratch) = s.borrow_mut().as_mut() {
            if scratch.original.capacity() < original.capacity() {
                scratch.original = original;
            }
        }
    });
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

/// Keep a tape's memory for the next [`parse_tape`] on this thread.
pub fn recycle(tape: Vec<Node<'_>>) {
    if tape.capacity() > SCRATCH_MAX_NODES {
        return;
    }
    let tape = Tape(tape).reset();
    SCRATCH.with(|s| {
        if let Some(scratch) = s.borrow_mut().as_mut() {
            if scratch.tape.0.capacity() < tape.0.capacity() {
                scratch.tape = tape;
            }
        }
    });
}

/// Bodies up to this size are parsed with memory each thread keeps (a few times
/// this size: simd-json's copies and indexes, and the tape), so a request does not
/// allocate and page in fresh buffers for them. A batch of 100 events is ~60 KiB.
const SCRATCH_MAX_BYTES: usize = 256 * 1024;
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

/// simd-json's working memory, a tape and a copy of the body, lent to one parse at a
/// time.
struct Scratch {
    buffers: Buffers,
    tape: Tape<'static>,
    original: Vec<u8>,
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch {
            buffers: Buffers::new(SCRATCH_MAX_BYTES / 4),
            tape: Tape(Vec::new()),
            original: Vec::new(),
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Option<Scratch>> = const { RefCell::new(None) };
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
