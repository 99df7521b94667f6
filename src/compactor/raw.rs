//! Event JSON as text. Capture logs each event as serde_json writes it, so the compactor
//! can split that text into members and splice its additions in, instead of building a
//! `serde_json::Value` and writing it out again. Splicing gives the same bytes as the
//! round trip only when the text is exactly what serde_json writes for the value it
//! holds ("canonical": no spaces, serde_json's escapes, numbers as serde_json prints
//! them, no repeated keys); [`Event::parse`] checks that in the same pass that splits
//! the text, and refuses anything else, which then takes the round trip.

/// Deeper than any real event; the round trip handles (and limits) the rest.
const MAX_DEPTH: usize = 64;
/// Objects with more keys than this take the round trip: the repeated-key check is
/// quadratic in the worst case, so it is bounded.
const MAX_KEYS: usize = 256;

/// One member of an object, as text: the key without its quotes (still escaped) and
/// the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member<'a> {
    pub key: &'a str,
    pub value: &'a str,
}

/// A canonical event object split into its members, and its `properties` into theirs
/// when that is an object.
#[derive(Debug)]
pub struct Event<'a> {
    pub members: Vec<Member<'a>>,
    pub properties: Option<Vec<Member<'a>>>,
}

impl<'a> Event<'a> {
    /// None unless `text` is a canonical JSON object.
    pub fn parse(text: &'a [u8]) -> Option<Event<'a>> {
        let text = simdutf8::basic::from_utf8(text).ok()?;
        let mut c = Checker {
            s: text,
            b: text.as_bytes(),
            i: 0,
        };
        let mut members = Vec::with_capacity(8);
        let mut properties = None;
        c.object(0, &mut members, &mut properties)?;
        if c.i != c.b.len() {
            return None;
        }
        Some(Event {
            members,
            properties,
        })
    }

    pub fn get(&self, key: &str) -> Option<&'a str> {
        get(&self.members, key)
    }
}

/// The value of `key` (a key that needs no escaping) among `members`.
pub fn get<'a>(members: &[Member<'a>], key: &str) -> Option<&'a str> {
    members.iter().find(|m| m.key == key).map(|m| m.value)
}

/// A recursive-descent check of canonical JSON over `b` (the bytes of `s`).
struct Checker<'a> {
    s: &'a str,
    b: &'a [u8],
    i: usize,
}

impl<'a> Checker<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.i += 1)
    }

    fn value(&mut self, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'{' => self.object(depth, &mut Vec::new(), &mut None),
            b'[' => self.array(depth),
            b'"' => self.string(),
            b't' => self.literal("true"),
            b'f' => self.literal("false"),
            b'n' => self.literal("null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// An object at `self.i`; its members go to `out`. At the top level (depth 0) a
    /// `properties` object is split into `properties` as well.
    fn object(
        &mut self,
        depth: usize,
        out: &mut Vec<Member<'a>>,
        properties: &mut Option<Vec<Member<'a>>>,
    ) -> Option<()> {
        self.eat(b'{')?;
        if self.eat(b'}').is_some() {
            return Some(());
        }
        let mut seen = KeyFilter::default();
        loop {
            let start = self.i;
            self.string()?;
            let key = &self.s[start + 1..self.i - 1];
            if out.len() >= MAX_KEYS
                || (seen.maybe_contains(key) && out.iter().any(|m| m.key == key))
            {
                return None;
            }
            seen.insert(key);
            self.eat(b':')?;
            let at = self.i;
            if depth == 0 && key == "properties" && self.peek() == Some(b'{') {
                let mut props = Vec::with_capacity(32);
                self.object(depth + 1, &mut props, &mut None)?;
                *properties = Some(props);
            } else {
                self.value(depth + 1)?;
            }
            out.push(Member {
                key,
                value: &self.s[at..self.i],
            });
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    fn array(&mut self, depth: usize) -> Option<()> {
        self.eat(b'[')?;
        if self.eat(b']').is_some() {
            return Some(());
        }
        loop {
            self.value(depth + 1)?;
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A string with only the escapes serde_json writes: `\"`, `\\`, the short forms
    /// of control characters and `\u00xx` (lower-case hex) for the others.
    fn string(&mut self) -> Option<()> {
        self.eat(b'"')?;
        loop {
            self.i += special(&self.b[self.i..])?;
            match self.b[self.i] {
                b'"' => {
                    self.i += 1;
                    return Some(());
                }
                b'\\' => {
                    let esc = self.b.get(self.i + 1..)?;
                    match *esc.first()? {
                        b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 2,
                        b'u' => {
                            let hex = esc.get(1..5)?;
                            let lower = |c: u8| c.is_ascii_digit() || (b'a'..=b'f').contains(&c);
                            if hex[..2] != *b"00" || !hex.iter().all(|&c| lower(c)) {
                                return None;
                            }
                            let code = u8::from_str_radix(std::str::from_utf8(&hex[2..]).ok()?, 16)
                                .ok()?;
                            // Those have a short form, which serde_json uses.
                            if code >= 0x20 || matches!(code, 0x08 | 0x09 | 0x0a | 0x0c | 0x0d) {
                                return None;
                            }
                            self.i += 6;
                        }
                        _ => return None,
                    }
                }
                // A raw control character is not JSON.
                _ => return None,
            }
        }
    }

    fn literal(&mut self, word: &str) -> Option<()> {
        if self.b[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            Some(())
        } else {
            None
        }
    }

    /// Short integers are canonical as they are; anything else (floats, long
    /// integers, `-0`) is canonical only if serde_json writes it back the same.
    fn number(&mut self) -> Option<()> {
        let start = self.i;
        let end = self.b[start..]
            .iter()
            .position(|&c| !matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
            .map_or(self.b.len(), |j| start + j);
        self.i = end;
        let token = &self.s[start..end];
        let digits = token.strip_prefix('-').unwrap_or(token);
        let short_int = !digits.is_empty()
            && digits.len() <= 18
            && digits.bytes().all(|c| c.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'))
            && token != "-0";
        if short_int {
            return Some(());
        }
        let value: serde_json::Value = serde_json::from_str(token).ok()?;
        (value.is_number() && serde_json::to_string(&value).ok()? == token).then_some(())
    }
}

/// The index of the first `"`, `\\` or control character in `b`. Strings are most of an
/// event's bytes, so they are scanned eight bytes at a time.
fn special(b: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let is_special = |c: u8| c == b'"' || c == b'\\' || c < 0x20;
    let mut i = 0;
    while let Some(chunk) = b.get(i..i + 8) {
        let w = u64::from_le_bytes(chunk.try_into().ok()?);
        let (quote, backslash) = (w ^ (ONES * 0x22), w ^ (ONES * 0x5c));
        // High bits mark the bytes that may be a quote, a backslash or below 0x20
        // (never missing one); those eight bytes are then looked at one by one.
        let zero = |x: u64| x.wrapping_sub(ONES) & !x;
        let low = w.wrapping_sub(ONES * 0x20) & !w;
        if (zero(quote) | zero(backslash) | low) & HIGH != 0 {
            if let Some(j) = chunk.iter().position(|&c| is_special(c)) {
                return Some(i + j);
            }
        }
        i += 8;
    }
    b[i..].iter().position(|&c| is_special(c)).map(|j| i + j)
}

/// A 1024-bit filter of the keys of one object: an exact search for a key need only
/// run when the filter may contain it.
#[derive(Default, Clone)]
pub struct KeyFilter([u64; 16]);

impl KeyFilter {
    fn bit(key: &str) -> (usize, u64) {
        let b = key.as_bytes();
        let (head, tail) = if b.len() >= 8 {
            let mut head = [0u8; 8];
            let mut tail = [0u8; 8];
            head.copy_from_slice(&b[..8]);
            tail.copy_from_slice(&b[b.len() - 8..]);
            (u64::from_le_bytes(head), u64::from_le_bytes(tail))
        } else {
            (b.iter().fold(0u64, |h, &c| (h << 8) | u64::from(c)), 0)
        };
        let h = (head ^ tail.rotate_left(29) ^ (b.len() as u64).rotate_left(51))
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let n = (h >> 54) as usize;
        (n / 64, 1 << (n % 64))
    }

    pub fn maybe_contains(&self, key: &str) -> bool {
        let (w, m) = Self::bit(key);
        self.0[w] & m != 0
    }

    pub fn insert(&mut self, key: &str) {
        let (w, m) = Self::bit(key);
        self.0[w] |= m;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn canonical(text: &str) -> bool {
        Event::parse(text.as_bytes()).is_some()
    }

    #[test]
    fn splits_the_event_and_its_properties() {
        let text = r#"{"event":"e","properties":{"a":[1,{"b":null}],"c\"d":"x\\y"},"n":-5}"#;
        let e = Event::parse(text.as_bytes()).unwrap();
        let keys: Vec<&str> = e.members.iter().map(|m| m.key).collect();
        assert_eq!(keys, ["event", "properties", "n"]);
        assert_eq!(e.get("event"), Some(r#""e""#));
        assert_eq!(e.get("n"), Some("-5"));
        let p = e.properties.unwrap();
        assert_eq!(
            p,
            [
                Member {
                    key: "a",
                    value: r#"[1,{"b":null}]"#
                },
                Member {
                    key: r#"c\"d"#,
                    value: r#""x\\y""#
                }
            ]
        );
        let no_props = Event::parse(br#"{"properties":"x"}"#).unwrap();
        assert!(no_props.properties.is_none());
    }

    #[test]
    fn accepts_exactly_what_serde_json_writes() {
        let values = [
            json!({"a": 1.5, "b": 1e300, "c": -0.0, "d": u64::MAX, "e": i64::MIN, "f": 0.1}),
            json!({"s": "\u{0}\u{1f}\u{7f}\n\t\r\u{8}\u{c}\"\\/é😀", "e": {}, "a": [[], {}]}),
            json!({"big": 1.2345678901234568e29, "t": true, "f": false, "n": null, "z": 0}),
        ];
        for v in values {
            let text = serde_json::to_string(&v).unwrap();
            assert!(canonical(&text), "{text}");
        }
        let refused = [
            r#"{ "a":1}"#,
            r#"{"a" :1}"#,
            r#"{"a":1 }"#,
            r#"{"a":[1, 2]}"#,
            r#"{"a":"\/"}"#,
            r#"{"a":"\u00e9"}"#,
            r#"{"a":"\u000A"}"#,
            r#"{"a":"\u000a"}"#,
            r#"{"a":"\u001F"}"#,
            r#"{"a":"\ud83d\ude00"}"#,
            r#"{"a":1,"a":2}"#,
            r#"{"x":{"a":1,"b":2,"a":3}}"#,
            r#"{"a":-0}"#,
            r#"{"a":01}"#,
            r#"{"a":1E2}"#,
            r#"{"a":1e2}"#,
            r#"{"a":1.50}"#,
            r#"{"a":123456789012345678901234567890}"#,
            r#"{"a":+1}"#,
            r#"{"a":tru}"#,
            r#"{"a":1}x"#,
            r#"{"a":1"#,
            "{\"a\":\"\u{1}\"}",
        ];
        for text in refused {
            assert!(!canonical(text), "{text}");
            // Where serde_json parses it, it indeed writes something else.
            if let Ok(v) = serde_json::from_str::<Value>(text) {
                assert_ne!(serde_json::to_string(&v).unwrap(), text);
            }
        }
        // Canonical, but not an object.
        assert!(!canonical("[1]"));
        assert!(!canonical("{\"a\":\"\u{ff}\"}x"));
        assert!(Event::parse(b"{\"a\":\"\xff\"}").is_none());
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(80), "]".repeat(80));
        assert!(!canonical(&deep));
    }

    #[test]
    fn finds_the_first_special_byte() {
        for len in 0..40 {
            for at in 0..=len {
                for c in [b'"', b'\\', 0u8, 0x1f] {
                    let mut b: Vec<u8> = (0..len).map(|i| b"a\x7f\xc3!#]"[i % 6]).collect();
                    if at < len {
                        b[at] = c;
                        assert_eq!(special(&b), Some(at), "{b:?}");
                    } else {
                        assert_eq!(special(&b), None, "{b:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn many_keys_and_near_repeats() {
        let mut m = serde_json::Map::new();
        for i in 0..MAX_KEYS {
            m.insert(format!("$key_{i}"), json!(i));
        }
        let text = serde_json::to_string(&Value::Object(m.clone())).unwrap();
        assert!(canonical(&text));
        m.insert("one more".into(), json!(0));
        let text = serde_json::to_string(&Value::Object(m)).unwrap();
        assert!(!canonical(&text));
    }
}
