//! Columns of texts in a version-4 event [`block`](super): the names, the distinct
//! ids, and the properties' values. Most of what LZ4 cannot shrink in web events is
//! uuids written as text (`$device_id`, `$session_id`, anonymous distinct ids): 36
//! hex digits for about 74 random bits. So each item of a column says what it is:
//! a uuid, kept as its 16 bytes in a column of uuids laid out byte by byte (uuids
//! made at about the same time share their first bytes); the event's own distinct
//! id, quoted (posthog-js repeats it in the properties), kept as nothing; or any
//! other text, packed ([`super::pack::pack`]) behind its length.
//!
//! Layout for `m` items: `m` kinds (u8), the uuids ([`put_uuids`]), a varint length
//! for each text item, then the packed texts back to back. An item is a uuid or the
//! distinct id only when writing that back gives exactly its bytes (lowercase,
//! hyphenated, quotes included or not as its kind says), so any text round-trips.

use super::pack::Cursor;
use super::pack::{bare_uuid, check_packed, pack, put_uuids, put_varint, quoted_uuid, unpack};

/// Packed text behind its length.
const TEXT: u8 = 0;
/// A uuid without quotes (a name, a distinct id).
const UUID: u8 = 1;
/// A uuid between quotes (a property's value).
const QUOTED_UUID: u8 = 2;
/// The event's distinct id between quotes.
const DISTINCT: u8 = 3;

/// An item of a parsed column: where its bytes are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Text {
    /// Packed bytes at this range of the body.
    Packed(u32, u32),
    /// The block's uuid at this index, bare or between quotes.
    Uuid(u32),
    QuotedUuid(u32),
    /// The event's distinct id, between quotes.
    Distinct,
}

/// Append the column of `items` to `out`. `distinct` is each item's event's distinct
/// id, for a column of property values; names and distinct ids themselves pass None
/// and never use [`DISTINCT`].
pub(super) fn put(out: &mut Vec<u8>, items: &[&[u8]], distinct: Option<&[&[u8]]>) {
    let mut kinds = Vec::with_capacity(items.len());
    let mut uuids = Vec::new();
    let mut lens = Vec::new();
    let mut packed = Vec::new();
    for (i, &item) in items.iter().enumerate() {
        let own = distinct.and_then(|d| d.get(i)).copied();
        if own.is_some_and(|id| is_quoted(item, id)) {
            kinds.push(DISTINCT);
        } else if let Some(id) = quoted_uuid(item) {
            kinds.push(QUOTED_UUID);
            uuids.push(id.into_bytes());
        } else if let Some(id) = bare_uuid(item) {
            kinds.push(UUID);
            uuids.push(id.into_bytes());
        } else {
            kinds.push(TEXT);
            let start = packed.len();
            pack(item, &mut packed);
            lens.push(packed.len() - start);
        }
    }
    out.extend_from_slice(&kinds);
    put_uuids(out, &uuids);
    for len in lens {
        put_varint(out, len as u64);
    }
    out.extend_from_slice(&packed);
}

/// Whether `item` is `"`, `id`, `"`.
fn is_quoted(item: &[u8], id: &[u8]) -> bool {
    item.len() == id.len() + 2
        && item[0] == b'"'
        && item[item.len() - 1] == b'"'
        && &item[1..item.len() - 1] == id
}

/// The column of `m` items [`put`] wrote, off the front of `c`, whose last byte is at
/// offset `end` of the body: each item's [`Text`], its uuids added to `uuids`. None
/// if damaged (anything [`unpack`] would refuse included), or if `distinct` is false
/// and an item says it is the distinct id.
pub(super) fn take(
    c: &mut Cursor,
    end: usize,
    m: usize,
    distinct: bool,
    uuids: &mut Vec<[u8; 16]>,
) -> Option<Vec<Text>> {
    let kinds = c.take(m)?;
    let first = uuids.len();
    let mut texts = 0;
    for &kind in kinds {
        match kind {
            TEXT => texts += 1,
            UUID | QUOTED_UUID => {}
            DISTINCT if distinct => {}
            _ => return None,
        }
    }
    let count = m - texts - kinds.iter().filter(|&&k| k == DISTINCT).count();
    c.uuids(count, uuids)?;
    let mut lens = Vec::with_capacity(texts);
    for _ in 0..texts {
        lens.push(c.small()?);
    }
    let start = end.checked_sub(c.rest.len())?;
    let mut ranges = Vec::with_capacity(texts);
    let mut at = start;
    for len in lens {
        let to = at.checked_add(len)?;
        ranges.push((u32::try_from(at).ok()?, u32::try_from(to).ok()?));
        at = to;
    }
    let region = c.take(at - start)?;
    if !check_packed(region, start, &ranges) {
        return None;
    }
    let (mut ranges, mut next) = (ranges.into_iter(), first);
    let mut uuid = |quoted: bool| {
        let i = u32::try_from(next).ok()?;
        next += 1;
        Some(if quoted {
            Text::QuotedUuid(i)
        } else {
            Text::Uuid(i)
        })
    };
    kinds
        .iter()
        .map(|&kind| match kind {
            TEXT => ranges.next().map(|(from, to)| Text::Packed(from, to)),
            UUID => uuid(false),
            QUOTED_UUID => uuid(true),
            _ => Some(Text::Distinct),
        })
        .collect()
}

/// Step `c` over a column of `m` names or distinct ids that [`put`] wrote, as [`take`]
/// reads it but without checking or keeping its items; None if it is cut short.
pub(super) fn skip(c: &mut Cursor, m: usize) -> Option<()> {
    let kinds = c.take(m)?;
    let mut uuids = 0usize;
    let mut texts = 0usize;
    for &kind in kinds {
        match kind {
            TEXT => texts += 1,
            UUID | QUOTED_UUID => uuids += 1,
            _ => return None,
        }
    }
    c.take(uuids.checked_mul(16)?)?;
    let mut len = 0usize;
    for _ in 0..texts {
        len = len.checked_add(c.small()?)?;
    }
    c.take(len).map(|_| ())
}

/// `text` as it was written, added to `out`. `body` and `uuids` are what its column
/// was taken from; `distinct` is its event's distinct id. None if out of range.
pub(super) fn write(
    text: Text,
    body: &[u8],
    uuids: &[[u8; 16]],
    distinct: &[u8],
    out: &mut Vec<u8>,
) -> Option<()> {
    match text {
        Text::Packed(from, to) => unpack(body.get(from as usize..to as usize)?, out)?,
        Text::Uuid(i) => put_uuid(uuids.get(i as usize)?, out),
        Text::QuotedUuid(i) => {
            out.push(b'"');
            put_uuid(uuids.get(i as usize)?, out);
            out.push(b'"');
        }
        Text::Distinct => {
            out.push(b'"');
            out.extend_from_slice(distinct);
            out.push(b'"');
        }
    }
    Some(())
}

fn put_uuid(bytes: &[u8; 16], out: &mut Vec<u8>) {
    let mut hex = [0u8; 36];
    let text = uuid::Uuid::from_bytes(*bytes).hyphenated();
    out.extend_from_slice(text.encode_lower(&mut hex).as_bytes());
}
