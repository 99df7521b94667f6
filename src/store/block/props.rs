//! The properties of a version-3 event [`block`](super), before LZ4: each event's
//! properties object split into its keys and values, the keys named once per block in
//! a dictionary, and the values laid out key by key (every event's `$browser`, then
//! every event's `$current_url`, ...), so LZ4 finds a key's repeated values next to
//! each other instead of one object's length apart. Values are packed as in version 2
//! ([`super::pack::pack`]).
//!
//! Layout for `n` events: the dictionary's size `k` (u32 LE), `k` key lengths (u32 LE)
//! and the keys as they were written (quoted, escapes kept); `n` shapes (u8: 0 split,
//! 1 kept whole); for each split event its number of keys (u32 LE); each split
//! event's key indexes (u32 LE) in its order; each value's packed length (u32 LE) and
//! the packed values, key by key and within a key in event order; then each whole
//! event's packed length (u32 LE) and the packed bytes. An object is split only if
//! joining its parts gives back exactly its bytes, so anything (JSON with spaces, not
//! an object, not JSON) is kept whole and reads back unchanged.

#[cfg(test)]
use std::collections::HashMap;

#[cfg(test)]
use super::pack::pack;
use super::pack::{check_packed, le32, Cursor};
use super::texts::{self, Text};

const SPLIT: u8 = 0;
const WHOLE: u8 = 1;

/// An object's keys and values as written: `{k1:v1,k2:v2}` with no spaces.
type Parts<'a> = Vec<(&'a [u8], &'a [u8])>;

/// Append the properties of `events` (in order) to `out`, as builds before version 4
/// did (tests build old blocks with it).
#[cfg(test)]
pub(super) fn encode<'a>(events: impl ExactSizeIterator<Item = &'a [u8]>, out: &mut Vec<u8>) {
    let n = events.len();
    let mut dictionary: Vec<&[u8]> = Vec::new();
    let mut index: HashMap<&[u8], u32> = HashMap::new();
    let mut shapes = Vec::with_capacity(n);
    let mut counts = Vec::new();
    let mut key_ids = Vec::new();
    // Values by key: (key index, event order) sorts them key by key.
    let mut values: Vec<(u32, u32, &[u8])> = Vec::new();
    let mut whole: Vec<&[u8]> = Vec::new();
    for (event, text) in events.enumerate() {
        let Some(parts) = split(text) else {
            shapes.push(WHOLE);
            whole.push(text);
            continue;
        };
        shapes.push(SPLIT);
        counts.push(parts.len() as u32);
        for (key, value) in parts {
            let id = *index.entry(key).or_insert_with(|| {
                dictionary.push(key);
                dictionary.len() as u32 - 1
            });
            key_ids.push(id);
            values.push((id, event as u32, value));
        }
    }
    values.sort_by_key(|&(id, event, _)| (id, event));
    put32(out, dictionary.len());
    for key in &dictionary {
        put32(out, key.len());
    }
    for key in &dictionary {
        out.extend_from_slice(key);
    }
    out.extend_from_slice(&shapes);
    for &c in &counts {
        put32(out, c as usize);
    }
    for &id in &key_ids {
        put32(out, id as usize);
    }
    put_packed(out, values.iter().map(|v| v.2));
    put_packed(out, whole.into_iter());
}

/// Each item's packed length, then the packed items.
#[cfg(test)]
fn put_packed<'a>(out: &mut Vec<u8>, items: impl Iterator<Item = &'a [u8]>) {
    let mut packed = Vec::new();
    let mut lens = Vec::new();
    for item in items {
        let start = packed.len();
        pack(item, &mut packed);
        lens.push(packed.len() - start);
    }
    for len in lens {
        put32(out, len);
    }
    out.extend_from_slice(&packed);
}

#[cfg(test)]
fn put32(out: &mut Vec<u8>, v: usize) {
    out.extend_from_slice(&(v as u32).to_le_bytes());
}

/// Where the `n` events' properties are in a block's body, checked but not yet
/// unpacked, so one event's properties are made without the others'. Ranges are
/// offsets into the body the cursor reads. Versions 3 and 4 (`super::shapes`) both
/// read into one of these; version 3's values are all [`Text::Packed`].
#[derive(Debug)]
pub(super) struct Layout {
    /// The dictionary's keys.
    pub(super) keys: Vec<(u32, u32)>,
    /// Each event's shape: its parts (`parts[from..to]`), or its bytes whole.
    pub(super) events: Vec<Shape>,
    /// Each split event's keys and values, event by event, in its order.
    pub(super) parts: Vec<(u32, Text)>,
    /// The uuids the values name.
    pub(super) uuids: Vec<[u8; 16]>,
}

#[derive(Debug)]
pub(super) enum Shape {
    Split(u32, u32),
    Whole(Text),
}

impl Layout {
    /// The layout of what `c` holds at offset `at` of the body, for `n` events; None if
    /// damaged (anything [`super::pack::unpack`] would refuse included). Reads to the end of `c`.
    pub(super) fn parse(c: &mut Cursor, at: usize, n: usize) -> Option<Layout> {
        let total_len = c.rest.len();
        let offset = |c: &Cursor| u32::try_from(at + total_len - c.rest.len()).ok();
        let k = le32(c.take(4)?)?;
        let key_lens: Vec<usize> = c.column(k, 4)?.map(le32).collect::<Option<_>>()?;
        let mut keys = Vec::with_capacity(k);
        for len in key_lens {
            let start = offset(c)?;
            c.take(len)?;
            keys.push((start, offset(c)?));
        }
        let shapes = c.take(n)?;
        if shapes.iter().any(|&s| s > WHOLE) {
            return None;
        }
        let split_events = shapes.iter().filter(|&&s| s == SPLIT).count();
        let counts: Vec<usize> = c
            .column(split_events, 4)?
            .map(le32)
            .collect::<Option<_>>()?;
        let total = counts.iter().try_fold(0usize, |a, &b| a.checked_add(b))?;
        let ids: Vec<usize> = c.column(total, 4)?.map(le32).collect::<Option<_>>()?;
        if ids.iter().any(|&id| id >= k) {
            return None;
        }
        let values = take_packed(c, at + total_len, total)?;
        let whole = take_packed(c, at + total_len, n - split_events)?;
        if !c.rest.is_empty() {
            return None;
        }
        // Where each key's values start in `values`, which holds them key by key.
        let mut next = vec![0usize; k];
        for &id in &ids {
            next[id] += 1;
        }
        let mut start = 0;
        for slot in next.iter_mut() {
            let count = *slot;
            *slot = start;
            start += count;
        }
        let mut parts = Vec::with_capacity(total);
        for &id in &ids {
            let (from, to) = *values.get(next[id])?;
            parts.push((id as u32, Text::Packed(from, to)));
            next[id] += 1;
        }
        let mut events = Vec::with_capacity(n);
        let (mut counts, mut whole) = (counts.iter(), whole.into_iter());
        let mut from = 0u32;
        for &shape in shapes {
            events.push(match shape {
                WHOLE => {
                    let (from, to) = whole.next()?;
                    Shape::Whole(Text::Packed(from, to))
                }
                _ => {
                    let to = from.checked_add(u32::try_from(*counts.next()?).ok()?)?;
                    let split = Shape::Split(from, to);
                    from = to;
                    split
                }
            });
        }
        Some(Layout {
            keys,
            events,
            parts,
            uuids: Vec::new(),
        })
    }

    /// About the bytes it holds in memory.
    pub(super) fn weight(&self) -> usize {
        use std::mem::size_of;
        self.keys.capacity() * size_of::<(u32, u32)>()
            + self.events.capacity() * size_of::<Shape>()
            + self.parts.capacity() * size_of::<(u32, Text)>()
            + self.uuids.capacity() * 16
    }

    /// Event `i`'s properties as they were written, added to `out`; `body` is the body
    /// the layout was parsed from, `distinct` the event's distinct id. None only if `i`
    /// is out of range.
    pub(super) fn write(
        &self,
        body: &[u8],
        i: usize,
        distinct: &[u8],
        out: &mut Vec<u8>,
    ) -> Option<()> {
        let bytes = |(from, to): (u32, u32)| body.get(from as usize..to as usize);
        let value =
            |text: Text, out: &mut Vec<u8>| texts::write(text, body, &self.uuids, distinct, out);
        match *self.events.get(i)? {
            Shape::Whole(text) => value(text, out),
            Shape::Split(from, to) => {
                out.push(b'{');
                let parts = self.parts.get(from as usize..to as usize)?;
                for (n, &(key, text)) in parts.iter().enumerate() {
                    if n > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(bytes(*self.keys.get(key as usize)?)?);
                    out.push(b':');
                    value(text, out)?;
                }
                out.push(b'}');
                Some(())
            }
        }
    }
}

/// The `n` events' properties, back to back, and where each ends; None if damaged.
/// Reads to the end of `c`.
#[cfg(test)]
pub(super) fn decode(c: &mut Cursor, n: usize) -> Option<(Vec<u8>, Vec<usize>)> {
    let body = c.rest;
    let layout = Layout::parse(c, 0, n)?;
    let mut out = Vec::with_capacity(body.len() * 2);
    let mut ends = Vec::with_capacity(n);
    for i in 0..n {
        layout.write(body, i, b"", &mut out)?;
        ends.push(out.len());
    }
    Some((out, ends))
}

/// `count` packed items (lengths, then bytes), checked as [`super::pack::unpack`] would: where each
/// is, as offsets of a body whose end is at `end`.
fn take_packed(c: &mut Cursor, end: usize, count: usize) -> Option<Vec<(u32, u32)>> {
    let lens = c.column(count, 4)?;
    let mut ranges = Vec::with_capacity(count);
    let mut at = end.checked_sub(c.rest.len())?;
    for len in lens {
        let len = le32(len)?;
        let to = at.checked_add(len)?;
        ranges.push((u32::try_from(at).ok()?, u32::try_from(to).ok()?));
        at = to;
    }
    let start = end - c.rest.len();
    let region = c.take(at - start)?;
    check_packed(region, start, &ranges).then_some(ranges)
}

/// An object written without spaces, as its keys and values; None for anything else,
/// or anything whose parts would not join back into exactly these bytes.
pub(super) fn split(text: &[u8]) -> Option<Parts<'_>> {
    let inner = text.strip_prefix(b"{")?.strip_suffix(b"}")?;
    let mut parts = Vec::new();
    let mut at = 0;
    while at < inner.len() {
        let key_end = string_end(inner, at)?;
        if inner.get(key_end) != Some(&b':') {
            return None;
        }
        let value_end = value_end(inner, key_end + 1)?;
        parts.push((&inner[at..key_end], &inner[key_end + 1..value_end]));
        at = match inner.get(value_end) {
            None => value_end,
            Some(b',') if value_end + 1 < inner.len() => value_end + 1,
            Some(_) => return None,
        };
    }
    // A duplicate key would still join back, but say so plainly: keys are unique.
    Some(parts)
}

/// The end (exclusive) of the JSON string starting at `at`.
fn string_end(b: &[u8], at: usize) -> Option<usize> {
    if b.get(at) != Some(&b'"') {
        return None;
    }
    let mut i = at + 1;
    loop {
        i += memchr::memchr2(b'"', b'\\', b.get(i..)?)?;
        match b[i] {
            b'\\' => i += 2,
            _ => return Some(i + 1),
        }
    }
}

/// The end (exclusive) of the value starting at `at`: a string, an object or array
/// (nested, strings inside skipped), or a scalar up to the next `,` or the end.
fn value_end(b: &[u8], at: usize) -> Option<usize> {
    match b.get(at)? {
        b'"' => string_end(b, at),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = at;
            while i < b.len() {
                match b[i] {
                    b'"' => {
                        i = string_end(b, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth = depth.checked_sub(1)?;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            None
        }
        _ => {
            let len = b[at..]
                .iter()
                .position(|&c| matches!(c, b',' | b'{' | b'}' | b'[' | b']' | b'"' | b':'))
                .unwrap_or(b.len() - at);
            (len > 0).then_some(at + len)
        }
    }
}

#[cfg(test)]
#[path = "tests/props.rs"]
mod tests;

/// Where the events' properties are in the body.
#[derive(Debug)]
pub(super) enum Props {
    /// Version 1: each head's `properties` is the JSON.
    Plain,
    /// Version 2: each head's `properties` is its packed JSON.
    Packed,
    /// Versions 3 and 4: split by key.
    ByKey(Layout),
}
