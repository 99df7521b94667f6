//! One property of a block's events read without making their properties: the
//! console's filters by a property test one key of each event, and building each
//! event's whole JSON to read one value was most of their cost. Layouts 3 and 4 keep a
//! block's property keys once, in a dictionary, and each event's values by key
//! ([`super::props`], [`super::shapes`]), so a block whose dictionary lacks the key
//! holds no event with it ([`may_hold_key`] tells from the stored bytes, before the
//! rest of the block is parsed), and an event's value is one item of a column
//! ([`Column::value`]).
//!
//! A key is found as the JSON text serde_json writes for it or, for a key the block
//! wrote with escapes, by its decoded text, so a key matches whichever way it was
//! escaped. A key twice in one object reads as its last value, as serde_json's
//! parse of the whole object does.

use super::pack::Cursor;
use super::props::{Layout, Shape};
use super::{body, count, texts, Rows, MAX_DECODED_BYTES, PREFIX_LEN, VERSION};

/// What one event of a block says about a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cell {
    /// Its properties do not name the key.
    Absent,
    /// Its value's JSON text was written out.
    Value,
    /// Its properties are kept whole (not an object split by key): read the event.
    Whole,
}

/// One key's values in a decoded block.
pub struct Column<'r> {
    rows: &'r Rows,
    body: &'r [u8],
    layout: &'r Layout,
    /// The dictionary's entries naming the key: one, unless the block wrote it with
    /// different escapes.
    ids: Vec<u32>,
}

impl Rows {
    /// The values of property `key` in this block; None for layouts 1 and 2, which
    /// keep each event's properties whole (read the events then).
    pub fn column(&self, key: &str) -> Option<Column<'_>> {
        let (body, layout) = self.by_key()?;
        let quoted = serde_json::to_vec(key).ok()?;
        let mut ids = Vec::new();
        for (i, &(from, to)) in layout.keys.iter().enumerate() {
            let written = body.get(from as usize..to as usize).unwrap_or_default();
            if is_key(written, key, &quoted) {
                ids.push(i as u32);
            }
        }
        Some(Column {
            rows: self,
            body,
            layout,
            ids,
        })
    }
}

impl Column<'_> {
    /// Whether any event of the block may have the key: the dictionary names it, or
    /// some event's properties are kept whole.
    pub fn may_hold(&self) -> bool {
        !self.ids.is_empty()
            || self
                .layout
                .events
                .iter()
                .any(|s| matches!(s, Shape::Whole(_)))
    }

    /// Event `i`'s value for the key, its JSON text added to `out` when there is one.
    pub fn value(&self, i: usize, out: &mut Vec<u8>) -> Cell {
        let (from, to) = match self.layout.events.get(i) {
            Some(&Shape::Split(from, to)) => (from as usize, to as usize),
            _ => return Cell::Whole,
        };
        let parts = self.layout.parts.get(from..to).unwrap_or_default();
        let Some(&(_, text)) = parts.iter().rev().find(|(k, _)| self.ids.contains(k)) else {
            return Cell::Absent;
        };
        let distinct = self
            .rows
            .heads()
            .get(i)
            .map(|h| self.rows.bytes(h.distinct_id));
        let written = texts::write(
            text,
            self.body,
            &self.layout.uuids,
            distinct.unwrap_or_default(),
            out,
        );
        // The block was checked whole when decoded, so this does not fail; if it did,
        // the event read whole decides.
        match written {
            Some(()) => Cell::Value,
            None => Cell::Whole,
        }
    }
}

/// Whether `written`, a key as a block keeps it (quoted, escapes kept), is `key`,
/// whose serde_json text is `quoted`.
fn is_key(written: &[u8], key: &str, quoted: &[u8]) -> bool {
    written == quoted
        || (written.contains(&b'\\')
            && serde_json::from_slice::<String>(written).is_ok_and(|k| k == key))
}

/// Whether any event of a stored block (its bytes, as [`super::Files::resolve`] gives
/// them) may have property `key`, read from the block's key dictionary without
/// parsing the rest: `Some(false)` only for a layout-4 block whose every event is
/// split by key and whose dictionary does not name it. None when that cannot be told
/// without decoding the block (other layouts, damage): decode it then, and a damaged
/// block is skipped there as everywhere.
pub fn may_hold_key(value: &[u8], key: &str) -> Option<bool> {
    if *value.first()? != VERSION {
        return None;
    }
    let n = count(value)? as usize;
    let compressed = value.get(PREFIX_LEN..)?;
    let size = u32::from_le_bytes(compressed.get(..4)?.try_into().ok()?) as usize;
    if size > MAX_DECODED_BYTES || n > size / body::LEAST {
        return None;
    }
    // The dictionary is in the first tenth or so of the body: decompress only as far
    // as the parse needs, going further while it runs out.
    let mut want = FIRST_PREFIX.min(size);
    loop {
        let prefix = Prefix::decode(compressed.get(4..)?, want, size)?;
        match dictionary_says(&prefix, n, key) {
            Some(answer) => return Some(answer),
            None if want >= size => return None,
            None => want = want.saturating_mul(4).min(size),
        }
    }
}

/// The body's bytes decompressed first for [`may_hold_key`]: the uncompressed bytes
/// before a block's dictionary (times, uuids, persons, names and distinct ids) are
/// about 70 an event.
const FIRST_PREFIX: usize = 8 * 1024;

/// The first bytes of an LZ4 block (as `lz4_flex` writes it), decompressed.
struct Prefix;

impl Prefix {
    /// At least `want` bytes of the block `input` decompresses to (fewer only at its
    /// end); None if it is damaged before then or would pass `size`, its whole size.
    fn decode(input: &[u8], want: usize, size: usize) -> Option<Vec<u8>> {
        let mut out: Vec<u8> = Vec::with_capacity(want + 64);
        let mut at = 0;
        while out.len() < want && at < input.len() {
            let token = input[at];
            at += 1;
            let literals = Prefix::length(input, &mut at, usize::from(token >> 4))?;
            if out.len() + literals > size {
                return None;
            }
            out.extend_from_slice(input.get(at..at.checked_add(literals)?)?);
            at += literals;
            if at >= input.len() {
                break;
            }
            let offset = usize::from(u16::from_le_bytes(input.get(at..at + 2)?.try_into().ok()?));
            at += 2;
            let length = Prefix::length(input, &mut at, usize::from(token & 15))? + 4;
            let from = out.len().checked_sub(offset).filter(|_| offset > 0)?;
            if out.len() + length > size {
                return None;
            }
            // A match may overlap what it writes, so it is copied byte by byte.
            for i in from..from + length {
                let byte = out[i];
                out.push(byte);
            }
        }
        Some(out)
    }

    /// A length whose first four bits are `nibble`, 15 meaning more bytes follow.
    fn length(input: &[u8], at: &mut usize, nibble: usize) -> Option<usize> {
        let mut length = nibble;
        if nibble == 15 {
            loop {
                let byte = *input.get(*at)?;
                *at += 1;
                length = length.checked_add(usize::from(byte))?;
                if byte != 255 {
                    break;
                }
            }
        }
        Some(length)
    }
}

/// [`may_hold_key`] on the first bytes of a body of `n` events; None if they end
/// before it can tell.
fn dictionary_says(body: &[u8], n: usize, key: &str) -> Option<bool> {
    let quoted = serde_json::to_vec(key).ok()?;
    match dictionary(body, n, |written| is_key(written, key, &quoted))? {
        Walk::Stopped => Some(true),
        Walk::Whole(any) => Some(any),
    }
}

/// How a walk of a body's dictionary ended.
enum Walk {
    /// The walk was told to stop at a key.
    Stopped,
    /// Every key was walked; whether some event's properties are kept whole.
    Whole(bool),
}

/// Walk the property dictionary of a version-4 body of `n` events (or its first
/// bytes): each key as written goes to `key`, which stops the walk by answering true;
/// then the events' shapes, to tell whether any is kept whole. None if the bytes end
/// (or are damaged) before then.
fn dictionary<'b>(body: &'b [u8], n: usize, mut key: impl FnMut(&'b [u8]) -> bool) -> Option<Walk> {
    let mut c = Cursor { rest: body };
    // Times, created_at (a byte saying how, then one varint each), uuids, persons.
    for _ in 0..n {
        c.varint()?;
    }
    c.take(1)?;
    for _ in 0..n {
        c.varint()?;
    }
    c.take(n.checked_mul(16)?)?;
    let with_person = c.take(n)?.iter().filter(|&&f| f == 1).count();
    c.take(with_person * 16)?;
    // Names and distinct ids, then the properties' dictionary.
    texts::skip(&mut c, n)?;
    texts::skip(&mut c, n)?;
    let k = c.small()?;
    for _ in 0..k {
        let len = c.small()?;
        if key(c.take(len)?) {
            return Some(Walk::Stopped);
        }
    }
    // The shapes, then each event's: 0 is kept whole.
    let shapes = c.small()?;
    for _ in 0..shapes {
        let keys = c.small()?;
        for _ in 0..keys {
            c.varint()?;
        }
    }
    for _ in 0..n {
        if c.small()? == 0 {
            return Some(Walk::Whole(true));
        }
    }
    Some(Walk::Whole(false))
}

/// The property keys a block's events name, as the event index keeps them: a read
/// of a key then goes only to the blocks that name it or that may hold any key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PropertyKeys {
    /// The keys as text (escapes decoded), sorted, once each.
    pub keys: Vec<String>,
    /// Some event's properties are kept whole (not split by key, or a layout that
    /// keeps them all whole), so the block may hold any key.
    pub any: bool,
}

impl PropertyKeys {
    /// What a block that cannot be told may hold: any key.
    pub fn any() -> PropertyKeys {
        PropertyKeys {
            keys: Vec::new(),
            any: true,
        }
    }

    fn of<'k>(written: impl Iterator<Item = &'k [u8]>, any: bool) -> PropertyKeys {
        // A key that does not decode is never the one asked for (see `is_key`).
        let mut keys: Vec<String> = written.filter_map(decoded).collect();
        keys.sort_unstable();
        keys.dedup();
        PropertyKeys { keys, any }
    }
}

/// A key as a block keeps it (quoted, escapes kept), as text: the one key `is_key`
/// finds it for, if any.
fn decoded(written: &[u8]) -> Option<String> {
    if written.contains(&b'\\') {
        return serde_json::from_slice(written).ok();
    }
    let inner = written.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    let key = std::str::from_utf8(inner).ok()?;
    // Without escapes it is found only as serde_json writes the key.
    (serde_json::to_vec(key).ok()? == written).then(|| key.to_owned())
}

/// The property keys of a version-4 body of `n` events, before LZ4 (the compactor's
/// block, as it writes it).
pub(super) fn body_keys(body: &[u8], n: usize) -> PropertyKeys {
    let mut written = Vec::new();
    match dictionary(body, n, |k| {
        written.push(k);
        false
    }) {
        Some(Walk::Whole(any)) => PropertyKeys::of(written.into_iter(), any),
        // Not a body it can read: a read of any key goes to it.
        _ => PropertyKeys::any(),
    }
}

impl Rows {
    /// The property keys its events name ([`PropertyKeys`]).
    pub fn property_keys(&self) -> PropertyKeys {
        let Some((body, layout)) = self.by_key() else {
            return PropertyKeys::any();
        };
        let written = (layout.keys.iter())
            .map(|&(from, to)| body.get(from as usize..to as usize).unwrap_or_default());
        let any = (layout.events.iter()).any(|s| matches!(s, Shape::Whole(_)));
        PropertyKeys::of(written, any)
    }
}

#[cfg(test)]
#[path = "tests/column.rs"]
mod tests;
