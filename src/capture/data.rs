//! An event's stored JSON (`Record::data`): the object as sent, in the form
//! `serde_json` writes it ([`write`]), with the implied `$identify` of `/engage` last.
//!
//! Most clients already send that form: no whitespace, no escapes, numbers as
//! serde_json writes them. When the body's bytes of an event are exactly what writing
//! it would give, they are copied whole instead of written again a string at a time;
//! checking that costs a walk of the event's nodes and one pass over its bytes.

use serde_json::{Map, Value};
use simd_json::{Node, StaticNode};

use super::parse::{Event, IDENTIFY};
use super::tape::{self, Object, Value as TapeValue};
use super::write::{self, Keys};

/// Append the event as the log stores it.
pub fn write(out: &mut Vec<u8>, event: Event<'_, '_>) {
    match as_sent(event) {
        Some(bytes) => out.extend_from_slice(bytes),
        None => written(out, event),
    }
}

/// The event's stored bytes as they are in the body, if they are there: an event
/// without keys, an implied `$identify`, or a body without a copy are written instead.
pub fn as_sent<'t>(event: Event<'t, '_>) -> Option<&'t [u8]> {
    as_sent_at(event).map(|(bytes, _)| bytes)
}

/// [`as_sent`], with the address a tape string of the event would have if it sat at
/// the start of the bytes: a key's position in them is its address less that one.
pub fn as_sent_at<'t>(event: Event<'t, '_>) -> Option<(&'t [u8], usize)> {
    let sent = event.sent?;
    let (first, _) = event.object.iter().next()?;
    if event.implied_identify() {
        return None;
    }
    // The object's brace and the first key's quote come right before the key.
    let start = offset(sent.base, first)?.checked_sub(2)?;
    let mut walk = Walk {
        raw: sent.original,
        base: sent.base,
        at: start,
    };
    walk.object(event.object)?;
    let bytes = sent.original.get(start..walk.at)?;
    // Without a backslash no string of the event was unescaped (so each is in the
    // body as the tape has it), and without a control character none needs escaping.
    plain(bytes).then_some((bytes, sent.base + start))
}

/// Where `s` starts in the buffer at `base`.
fn offset(base: usize, s: &str) -> Option<usize> {
    (s.as_ptr() as usize).checked_sub(base)
}

/// A walk over the body's bytes from `at`, checking that they are what [`write`]
/// would write for each node.
struct Walk<'t> {
    raw: &'t [u8],
    base: usize,
    at: usize,
}

impl Walk<'_> {
    fn byte(&mut self, b: u8) -> Option<()> {
        (*self.raw.get(self.at)? == b).then(|| self.at += 1)
    }

    fn literal(&mut self, text: &[u8]) -> Option<()> {
        let end = self.at.checked_add(text.len())?;
        (self.raw.get(self.at..end)? == text).then(|| self.at = end)
    }

    /// The string at the tape's own offset, between quotes right before and after it.
    fn string(&mut self, s: &str) -> Option<()> {
        let off = offset(self.base, s)?;
        if off != self.at.checked_add(1)? {
            return None;
        }
        self.byte(b'"')?;
        self.at = off.checked_add(s.len())?;
        self.byte(b'"')
    }

    fn number<T: serde::Serialize>(&mut self, n: &T) -> Option<()> {
        // Longer than any number serde_json writes.
        const ROOM: usize = 48;
        let mut buf = [0u8; ROOM];
        let mut rest: &mut [u8] = &mut buf;
        serde_json::to_writer(&mut rest, n).ok()?;
        let len = ROOM - rest.len();
        self.literal(buf.get(..len)?)
    }

    fn value(&mut self, v: TapeValue<'_, '_>) -> Option<()> {
        match v.node() {
            Node::String(s) => self.string(s),
            Node::Static(StaticNode::Null) => self.literal(b"null"),
            Node::Static(StaticNode::Bool(true)) => self.literal(b"true"),
            Node::Static(StaticNode::Bool(false)) => self.literal(b"false"),
            Node::Static(StaticNode::I64(n)) => self.number(n),
            Node::Static(StaticNode::U64(n)) => self.number(n),
            Node::Static(StaticNode::F64(f)) => self.number(f),
            Node::Array { .. } => {
                self.byte(b'[')?;
                for (i, element) in v.as_array()?.iter().enumerate() {
                    if i > 0 {
                        self.byte(b',')?;
                    }
                    self.value(element)?;
                }
                self.byte(b']')
            }
            Node::Object { .. } => self.object(v.as_object()?),
        }
    }

    /// An object, which must not repeat a key: serde_json would keep one entry.
    fn object(&mut self, o: Object<'_, '_>) -> Option<()> {
        self.byte(b'{')?;
        let mut keys = Keys::default();
        for (i, (key, v)) in o.iter().enumerate() {
            keys.check(o, i, key).ok()?;
            if i > 0 {
                self.byte(b',')?;
            }
            self.string(key)?;
            self.byte(b':')?;
            self.value(v)?;
        }
        self.byte(b'}')
    }
}

/// Whether no byte is a backslash or a control character below 0x20, eight bytes at
/// a time.
fn plain(bytes: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // Some byte of `w` is below `n` (n <= 0x80): subtracting borrows into its high
    // bit, unless the byte had that bit set already.
    let below = |w: u64, n: u64| w.wrapping_sub(ONES * n) & !w & HIGH;
    let backslash = ONES * u64::from(b'\\');
    let mut chunks = bytes.chunks_exact(8);
    let mut found = 0;
    for chunk in &mut chunks {
        let mut a = [0u8; 8];
        a.copy_from_slice(chunk);
        let w = u64::from_le_bytes(a);
        found |= below(w, 0x20) | below(w ^ backslash, 1);
    }
    found == 0 && chunks.remainder().iter().all(|&b| b >= 0x20 && b != b'\\')
}

/// The event written out from the tape.
fn written(out: &mut Vec<u8>, event: Event<'_, '_>) {
    let start = out.len();
    out.push(b'{');
    if write::entries(out, event.object).is_ok() {
        if event.implied_identify() {
            if !event.object.is_empty() {
                out.push(b',');
            }
            out.extend_from_slice(br#""event":"$identify""#);
        }
        out.push(b'}');
        return;
    }
    // A repeated key somewhere: serde_json keeps one entry of it.
    let mut map = match tape::to_serde(TapeValue::from(event.object)) {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    if event.implied_identify() {
        map.insert("event".into(), Value::String(IDENTIFY.into()));
    }
    out.truncate(start);
    // Writing a map of strings into a Vec cannot fail.
    let _ = serde_json::to_writer(out, &map);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::parse;

    /// Each event of `body`: copied from the body or not, and what writing it gives.
    fn events(body: &str, engage: bool) -> Vec<(bool, Vec<u8>, Vec<u8>)> {
        let mut bytes = body.as_bytes().to_vec();
        let payload = parse(&mut bytes, engage).unwrap();
        payload
            .events()
            .map(|e| {
                let mut out = Vec::new();
                write(&mut out, e);
                let mut reference = Vec::new();
                written(&mut reference, e);
                (as_sent(e).is_some(), out, reference)
            })
            .collect()
    }

    /// Whether `body`'s one event is copied as sent; either way it is stored as
    /// writing it would store it.
    fn copied(body: &str) -> bool {
        let [(copied, out, reference)] = &events(body, false)[..] else {
            panic!("one event: {body}");
        };
        assert_eq!(out, reference, "{body}");
        *copied
    }

    #[test]
    fn compact_events_are_copied() {
        for body in [
            r#"{"event":"e","distinct_id":"d","properties":{"a":[1,-2,2.5,true,false,null,{},[]],"b":{"c":"é 日本 😀"}}}"#,
            r#"{"event":"e","n":18446744073709551615,"m":-9223372036854775808,"f":0.1,"g":1.0,"h":1e+300}"#,
            r#"{"api_key":"k","batch":[{"event":"a","distinct_id":"d"},{"event":"b","x":[]}]}"#,
            r#"[{"event":"a"},{"event":"b","p":{"q":null}}]"#,
        ] {
            let all = events(body, false);
            assert!(!all.is_empty());
            for (copied, out, reference) in all {
                assert!(copied, "{body} {}", String::from_utf8_lossy(&reference));
                assert_eq!(out, reference, "{body}");
                // What was copied is one event, braces included.
                assert_eq!((out.first(), out.last()), (Some(&b'{'), Some(&b'}')));
            }
        }
    }

    #[test]
    fn events_in_another_form_are_written() {
        for body in [
            // Whitespace, anywhere.
            r#"{ "event":"e"}"#,
            r#"{"event" :"e"}"#,
            r#"{"event":"e","p":[1, 2]}"#,
            r#"{"event":"e","p":{"a":1} }"#,
            // Escapes, even ones serde_json writes the same way.
            r#"{"event":"a\/b"}"#,
            r#"{"event":"\u00e9"}"#,
            r#"{"event":"ab\"","x":"y"}"#,
            r#"{"event":"a\nb"}"#,
            r#"{"k\"":"v","event":"e"}"#,
            // Numbers serde_json writes otherwise.
            r#"{"event":"e","n":-0}"#,
            r#"{"event":"e","n":1E5}"#,
            r#"{"event":"e","n":2.50}"#,
            r#"{"event":"e","n":1e300}"#,
            r#"{"event":"e","n":123456789012345678901234567890}"#,
            // A repeated key, at the top or nested.
            r#"{"event":"e","event":"f"}"#,
            r#"{"event":"e","p":{"x":1,"x":2}}"#,
            // No keys.
            "{}",
        ] {
            assert!(!copied(body), "{body}");
        }
    }

    #[test]
    fn an_implied_identify_is_written() {
        let body = r#"{"$set":{"a":1},"distinct_id":"d"}"#;
        let [(engage_copied, out, _)] = &events(body, true)[..] else {
            panic!("one event");
        };
        assert!(!engage_copied);
        assert_eq!(
            out,
            br#"{"$set":{"a":1},"distinct_id":"d","event":"$identify"}"#
        );
        // Not on /engage, or with a name, it is copied.
        assert!(copied(body));
        assert!(events(r#"{"event":"x","distinct_id":"d"}"#, true)[0].0);
    }

    #[test]
    fn a_body_past_the_scratch_is_copied_and_one_too_large_to_copy_is_written() {
        let many: Vec<String> = (0..20_000).map(|n| format!(r#""k{n}":{n}"#)).collect();
        let body = format!("{{{}}}", many.join(","));
        assert!(body.len() > 256 * 1024);
        assert!(copied(&body));
        // Past the 32 MiB kept as sent.
        let body = format!(r#"{{"event":"e","p":"{}"}}"#, "x".repeat(32 << 20));
        assert!(!copied(&body));
    }

    #[test]
    fn plain_bytes() {
        assert!(plain(b""));
        for b in 0u8..=255 {
            let expect = b >= 0x20 && b != b'\\';
            for len in 1..20 {
                for at in 0..len {
                    let mut s = vec![b'a'; len];
                    s[at] = b;
                    assert_eq!(plain(&s), expect, "byte {b} at {at} of {len}");
                }
            }
        }
    }
}
