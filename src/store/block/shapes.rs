//! The properties of a version-4 event [`block`](super), before LZ4: as in version 3
//! ([`super::props`]) each object is split into keys and values, the keys named once
//! a block and the values laid out key by key; version 4 also names each list of keys
//! (a shape: most of a block's events have one of a few) once, so an event's keys
//! take a byte, and lays the values out as a column of texts ([`super::texts`]), so a
//! uuid takes its 16 bytes and a repeated distinct id none.
//!
//! Layout for `n` events, every number a varint: the dictionary's size `k`, then
//! each key's length and bytes as written (quoted, escapes kept); the number of
//! shapes, then each shape's number of keys and their indexes; for each event 0 if
//! its properties are kept whole, else 1 + its shape's index; the column of values,
//! key by key and within a key in event order; the column of the whole events'
//! properties. An object is split only if its parts join back into exactly its bytes
//! ([`split`]), so anything reads back unchanged.

use std::collections::HashMap;

use super::pack::{put_varint, Cursor};
use super::props::{split, Layout, Shape};
use super::texts::{self, Text};
use super::Entry;

type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Append the properties of `entries` (in order) to `out`.
pub(super) fn put(entries: &[Entry], out: &mut Vec<u8>) {
    let mut dictionary: Vec<&[u8]> = Vec::new();
    // Randomly seeded foldhash: every key of every event is hashed here, and SipHash
    // was most of that cost.
    let mut index: Map<&[u8], u32> = Map::default();
    let mut shapes: Vec<Vec<u32>> = Vec::new();
    let mut shape_index: Map<Vec<u32>, u32> = Map::default();
    let mut keys = Vec::new();
    let mut refs = Vec::with_capacity(entries.len());
    // Values by key: (key index, event order) sorts them key by key.
    let mut values: Vec<(u32, u32, &[u8])> = Vec::new();
    let (mut whole, mut whole_ids) = (Vec::new(), Vec::new());
    for (event, e) in entries.iter().enumerate() {
        let Some(parts) = split(&e.properties) else {
            refs.push(0);
            whole.push(&e.properties[..]);
            whole_ids.push(e.distinct_id.as_bytes());
            continue;
        };
        keys.clear();
        for (key, value) in parts {
            let id = *index.entry(key).or_insert_with(|| {
                dictionary.push(key);
                dictionary.len() as u32 - 1
            });
            keys.push(id);
            values.push((id, event as u32, value));
        }
        let shape = match shape_index.get(&keys) {
            Some(&shape) => shape,
            None => {
                let shape = shapes.len() as u32;
                shape_index.insert(keys.clone(), shape);
                shapes.push(keys.clone());
                shape
            }
        };
        refs.push(u64::from(shape) + 1);
    }
    let values = by_key(&values, dictionary.len());
    put_varint(out, dictionary.len() as u64);
    for key in &dictionary {
        put_varint(out, key.len() as u64);
        out.extend_from_slice(key);
    }
    put_varint(out, shapes.len() as u64);
    for shape in &shapes {
        put_varint(out, shape.len() as u64);
        for &id in shape {
            put_varint(out, u64::from(id));
        }
    }
    for r in refs {
        put_varint(out, r);
    }
    let ids: Vec<&[u8]> = values
        .iter()
        .map(|&(_, event, _)| entries[event as usize].distinct_id.as_bytes())
        .collect();
    let items: Vec<&[u8]> = values.iter().map(|v| v.2).collect();
    texts::put(out, &items, Some(&ids[..]));
    texts::put(out, &whole, Some(&whole_ids[..]));
}

/// The values key by key, each key's in event order (a key twice in one object keeps
/// its values in order): a counting sort, the keys being the dictionary's indexes.
fn by_key<'a>(values: &[(u32, u32, &'a [u8])], keys: usize) -> Vec<(u32, u32, &'a [u8])> {
    let mut starts = vec![0usize; keys + 1];
    for &(id, _, _) in values {
        starts[id as usize + 1] += 1;
    }
    for i in 1..starts.len() {
        starts[i] += starts[i - 1];
    }
    let mut out = vec![(0, 0, &[][..]); values.len()];
    for &v in values {
        let at = &mut starts[v.0 as usize];
        out[*at] = v;
        *at += 1;
    }
    out
}

/// The layout of what `c` holds, for `n` events, the body ending at offset `end`;
/// None if damaged. Reads to the end of `c`.
pub(super) fn take(c: &mut Cursor, end: usize, n: usize) -> Option<Layout> {
    let offset = |c: &Cursor| u32::try_from(end - c.rest.len()).ok();
    // Each count below is bounded by the bytes left before anything is allocated.
    let k = bounded(c)?;
    let mut keys = Vec::with_capacity(k);
    for _ in 0..k {
        let len = c.small()?;
        let start = offset(c)?;
        c.take(len)?;
        keys.push((start, offset(c)?));
    }
    let s = bounded(c)?;
    let mut shapes = Vec::with_capacity(s);
    let mut shape_keys = Vec::new();
    for _ in 0..s {
        let len = bounded(c)?;
        let from = shape_keys.len();
        for _ in 0..len {
            let id = c.small()?;
            if id >= k {
                return None;
            }
            shape_keys.push(id);
        }
        shapes.push(from..shape_keys.len());
    }
    let mut refs = Vec::with_capacity(n.min(c.rest.len()));
    let mut total = 0usize;
    for _ in 0..n {
        let r = c.small()?;
        if r > s {
            return None;
        }
        if r > 0 {
            total = total.checked_add(shapes[r - 1].len())?;
        }
        refs.push(r);
    }
    if total > c.rest.len() {
        return None;
    }
    let whole_count = refs.iter().filter(|&&r| r == 0).count();
    let mut uuids = Vec::new();
    let values = texts::take(c, end, total, true, &mut uuids)?;
    let whole = texts::take(c, end, whole_count, true, &mut uuids)?;
    if !c.rest.is_empty() {
        return None;
    }
    // Where each key's values start in `values`, which holds them key by key.
    let mut next = vec![0usize; k];
    for r in refs.iter().filter(|&&r| r > 0) {
        for &id in &shape_keys[shapes[r - 1].clone()] {
            next[id] += 1;
        }
    }
    let mut start = 0;
    for slot in next.iter_mut() {
        let count = *slot;
        *slot = start;
        start += count;
    }
    let mut parts: Vec<(u32, Text)> = Vec::with_capacity(total);
    let mut events = Vec::with_capacity(n);
    let mut whole = whole.into_iter();
    for &r in &refs {
        if r == 0 {
            events.push(Shape::Whole(whole.next()?));
            continue;
        }
        let from = u32::try_from(parts.len()).ok()?;
        for &id in &shape_keys[shapes[r - 1].clone()] {
            parts.push((id as u32, *values.get(next[id])?));
            next[id] += 1;
        }
        events.push(Shape::Split(from, u32::try_from(parts.len()).ok()?));
    }
    Some(Layout {
        keys,
        events,
        parts,
        uuids,
    })
}

/// A count of things that each take at least a byte of what is left.
fn bounded(c: &mut Cursor) -> Option<usize> {
    let count = c.small()?;
    (count <= c.rest.len()).then_some(count)
}
