//! Writing a tape value back out as JSON, byte for byte what `serde_json::to_vec` of
//! the same value deserialised into a `serde_json::Value` would give (the form the
//! log has always stored): no whitespace, keys in the order sent, serde_json's string
//! escapes and number forms. An object with a repeated key is the one case that
//! differs (serde_json keeps one entry), so it is reported and the caller writes the
//! value through serde_json instead.

use simd_json::{Node, StaticNode};

use super::tape::{Object, Value};

/// An object on the way has a key twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepeatedKey;

/// Append `v` to `out`. On [`RepeatedKey`], `out` holds a partial value.
pub fn value(out: &mut Vec<u8>, v: Value<'_, '_>) -> Result<(), RepeatedKey> {
    match v.node() {
        Node::String(s) => string(out, s),
        Node::Static(StaticNode::Null) => out.extend_from_slice(b"null"),
        Node::Static(StaticNode::Bool(true)) => out.extend_from_slice(b"true"),
        Node::Static(StaticNode::Bool(false)) => out.extend_from_slice(b"false"),
        Node::Static(StaticNode::I64(n)) => number(out, n),
        Node::Static(StaticNode::U64(n)) => number(out, n),
        Node::Static(StaticNode::F64(f)) => number(out, f),
        Node::Array { .. } => {
            out.push(b'[');
            for (i, element) in v.as_array().iter().flat_map(|a| a.iter()).enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                value(out, element)?;
            }
            out.push(b']');
        }
        Node::Object { .. } => {
            out.push(b'{');
            if let Some(o) = v.as_object() {
                entries(out, o)?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

/// Objects with more keys than this check for repeats with a hash set: the sketch
/// below fills up, and comparing each key with all before it would be quadratic in
/// the keys a client sends.
const SKETCH_MAX_KEYS: usize = 64;

/// An object's entries without the braces, so a caller can append one of its own.
pub fn entries(out: &mut Vec<u8>, o: Object<'_, '_>) -> Result<(), RepeatedKey> {
    let mut keys = Keys::default();
    for (i, (key, v)) in o.iter().enumerate() {
        keys.check(o, i, key)?;
        if i > 0 {
            out.push(b',');
        }
        string(out, key);
        out.push(b':');
        value(out, v)?;
    }
    Ok(())
}

/// The keys of one object seen so far, to find one sent twice.
#[derive(Default)]
pub(super) struct Keys<'a> {
    /// A 128-bit sketch of the keys seen: a key whose bit is unset is new, so only
    /// the rare collision compares it with the keys before it. Two words, not a
    /// `u128`, whose shifts by a variable amount cost several instructions each.
    seen: [u64; 2],
    many: Option<std::collections::HashSet<&'a str>>,
}

impl<'a> Keys<'a> {
    /// `key`, the `i`th of `o`'s keys, given in order: an error if an earlier one
    /// is the same.
    pub(super) fn check(
        &mut self,
        o: Object<'_, 'a>,
        i: usize,
        key: &'a str,
    ) -> Result<(), RepeatedKey> {
        if i == SKETCH_MAX_KEYS {
            self.many = Some(o.iter().take(i).map(|(k, _)| k).collect());
        }
        match self.many.as_mut() {
            Some(set) => {
                if !set.insert(key) {
                    return Err(RepeatedKey);
                }
            }
            None => {
                let h = key_hash(key);
                let word = &mut self.seen[(h >> 6) as usize & 1];
                let bit = 1u64 << (h & 63);
                if *word & bit != 0 && o.iter().take(i).any(|(k, _)| k == key) {
                    return Err(RepeatedKey);
                }
                *word |= bit;
            }
        }
        Ok(())
    }
}

/// A cheap hash of a key: its length and three of its bytes.
fn key_hash(key: &str) -> u32 {
    let b = key.as_bytes();
    let (first, middle, last) = match b {
        [] => (0, 0, 0),
        [..] => (b[0], b[b.len() / 2], b[b.len() - 1]),
    };
    let h = (b.len() as u32)
        .wrapping_mul(0x9E37_79B9)
        .wrapping_add(u32::from(first) * 31 + u32::from(middle) * 7 + u32::from(last));
    h ^ (h >> 7)
}

fn number<T: serde::Serialize>(out: &mut Vec<u8>, n: &T) {
    // Writing a number into a Vec cannot fail; serde_json gives its exact form.
    let _ = serde_json::to_writer(&mut *out, n);
}

/// A JSON string: copied as is when nothing in it needs escaping (nearly always),
/// else escaped by serde_json.
pub fn string(out: &mut Vec<u8>, s: &str) {
    if needs_escape(s.as_bytes()) {
        let _ = serde_json::to_writer(&mut *out, s);
    } else {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

/// Whether any byte is `"`, `\`, or a control character below 0x20, eight bytes at
/// a time.
fn needs_escape(bytes: &[u8]) -> bool {
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        if word_needs_escape(u64::from_le_bytes(w)) {
            return true;
        }
    }
    chunks
        .remainder()
        .iter()
        .any(|&b| b < 0x20 || b == b'"' || b == b'\\')
}

fn word_needs_escape(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // Some byte of `w` is below `n` (n <= 0x80): subtracting borrows into its high
    // bit, unless the byte had that bit set already.
    let below = |w: u64, n: u64| w.wrapping_sub(ONES * n) & !w & HIGH;
    let zero = |w: u64| below(w, 1);
    below(w, 0x20) | zero(w ^ (ONES * u64::from(b'"'))) | zero(w ^ (ONES * u64::from(b'\\'))) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the log stored before: serde_json's bytes for the serde_json value.
    fn via_serde(json: &str) -> Vec<u8> {
        let v: serde_json::Value =
            simd_json::serde::from_slice(&mut json.as_bytes().to_vec()).unwrap();
        serde_json::to_vec(&v).unwrap()
    }

    fn via_tape(json: &str) -> Result<Vec<u8>, RepeatedKey> {
        let mut bytes = json.as_bytes().to_vec();
        let tape = simd_json::to_tape(&mut bytes).unwrap();
        let mut out = Vec::new();
        value(&mut out, Value::root(&tape.0).unwrap())?;
        Ok(out)
    }

    #[test]
    fn same_bytes_as_serde_json() {
        for json in [
            r#"{"a" : 1, "b":[true,false,null,{}],"c":{"d":[]}}"#,
            r#"[1,-1,0,-0,1.0,-0.0,2.5,1e300,-1e-300,1E5,123456789012345678901234567890]"#,
            r#"[18446744073709551615,-9223372036854775808,9007199254740993,0.1,3.14159]"#,
            r#"{"s":"plain","e":"\"q\" \\ \/ \b\f\n\r\t \u0001\u001f \u00e9 \ud83d\ude00"}"#,
            r#"{"é":"日本語","ctl":"\u0000\u007f","k\"ey":"v"}"#,
            r#""a long string with an escape only at the very end, past the words\n""#,
            r#""exactly8""#,
            r#""1234567\"""#,
            "\"\"",
            "{}",
            "[]",
        ] {
            assert_eq!(via_tape(json).unwrap(), via_serde(json), "{json}");
        }
    }

    #[test]
    fn repeated_keys_are_reported_at_any_depth() {
        assert_eq!(via_tape(r#"{"a":1,"a":2}"#), Err(RepeatedKey));
        assert_eq!(via_tape(r#"{"p":{"x":1,"y":2,"x":3}}"#), Err(RepeatedKey));
        assert_eq!(
            via_tape(r#"[{"k":1},{"k":{"z":1,"z":1}}]"#),
            Err(RepeatedKey)
        );
        // Many distinct keys, so sketch collisions happen, are not repeats.
        let many: Vec<String> = (0..300).map(|n| format!("\"key{n}\":{n}")).collect();
        let json = format!("{{{}}}", many.join(","));
        assert_eq!(via_tape(&json).unwrap(), via_serde(&json));
        // A repeat found on either side of the switch to a hash set.
        for (first, again) in [(3, 40), (3, 100), (70, 200), (SKETCH_MAX_KEYS, 299)] {
            let mut keys = many.clone();
            keys[again] = keys[first].clone();
            let json = format!("{{{}}}", keys.join(","));
            assert_eq!(via_tape(&json), Err(RepeatedKey), "{first} {again}");
        }
    }

    /// Comparing each key with every earlier one took seconds for an object of
    /// 40,000 keys (a 430 KB body) and hours for one that fills the body limit.
    #[test]
    fn many_keys_take_linear_time() {
        let many: Vec<String> = (0..200_000).map(|n| format!("\"k{n}\":0")).collect();
        let json = format!("{{{}}}", many.join(","));
        let started = std::time::Instant::now();
        assert_eq!(via_tape(&json).unwrap(), via_serde(&json));
        let took = started.elapsed();
        assert!(took < std::time::Duration::from_secs(20), "{took:?}");
    }

    #[test]
    fn escape_detection() {
        assert!(!needs_escape(b""));
        for b in 0u8..=255 {
            let expect = b < 0x20 || b == b'"' || b == b'\\';
            for len in 1..20 {
                for at in 0..len {
                    let mut s = vec![b'a'; len];
                    s[at] = b;
                    assert_eq!(needs_escape(&s), expect, "byte {b} at {at} of {len}");
                }
            }
        }
    }
}
