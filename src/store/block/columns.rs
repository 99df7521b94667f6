//! The body of a version-2 event [`block`](super), before LZ4: the events'
//! fields column by column, so LZ4 finds the likenesses between events (times that
//! differ in a byte or two, names and distinct ids next to each other, properties
//! objects that share most keys one after another), and the uuids written as text in
//! the properties (`"$device_id"`, `"$session_id"`, ...) packed to their 16 bytes.
//!
//! Layout for `n` events: `n` times (i64 LE), `n` created_at (i64 LE), `n` uuids (16),
//! `n` person flags (1), the person uuid (16) of each event whose flag is 1, then `n`
//! u32 LE lengths of the names, of the distinct ids and of the packed properties, then
//! the names, the distinct ids and the packed properties back to back.

use uuid::Uuid;

#[cfg(test)]
use super::pack::pack;
use super::pack::{check_packed, le32, Cursor};
use super::props::{Layout, Props};
#[cfg(test)]
use super::Entry;
use super::Head;

/// Fixed bytes per event in the columns, before the person and the texts.
pub(super) const FIXED: usize = 8 + 8 + 16 + 1 + 4 + 4 + 4;

/// The body of sorted `entries`: properties packed back to back (version 2), or split
/// into keys and values ([`super::props`], version 3) when `by_key`, as builds before
/// version 4 wrote them (tests build old blocks with it).
#[cfg(test)]
pub(super) fn encode(entries: &[Entry], by_key: bool) -> Vec<u8> {
    let texts: usize = entries
        .iter()
        .map(|e| e.event.len() + e.distinct_id.len() + e.properties.len())
        .sum();
    let mut body = Vec::with_capacity(entries.len() * (FIXED + 16) + texts);
    match by_key {
        true => put_fixed(entries, &mut body),
        false => {
            for e in entries {
                body.extend_from_slice(&e.timestamp.to_le_bytes());
            }
            for e in entries {
                body.extend_from_slice(&e.created_at.to_le_bytes());
            }
            for e in entries {
                body.extend_from_slice(e.uuid.as_bytes());
            }
        }
    }
    for e in entries {
        body.push(u8::from(e.person_id.is_some()));
    }
    for person in entries.iter().filter_map(|e| e.person_id) {
        body.extend_from_slice(person.as_bytes());
    }
    let mut packed = Vec::new();
    let mut packed_lens = Vec::new();
    if !by_key {
        packed.reserve(entries.iter().map(|e| e.properties.len()).sum());
        for e in entries {
            let start = packed.len();
            pack(&e.properties, &mut packed);
            packed_lens.push((packed.len() - start) as u32);
        }
    }
    for e in entries {
        body.extend_from_slice(&(e.event.len() as u32).to_le_bytes());
    }
    for e in entries {
        body.extend_from_slice(&(e.distinct_id.len() as u32).to_le_bytes());
    }
    for len in &packed_lens {
        body.extend_from_slice(&len.to_le_bytes());
    }
    for e in entries {
        body.extend_from_slice(e.event.as_bytes());
    }
    for e in entries {
        body.extend_from_slice(e.distinct_id.as_bytes());
    }
    match by_key {
        true => super::props::encode(entries.iter().map(|e| &e.properties[..]), &mut body),
        false => body.extend_from_slice(&packed),
    }
    body
}

/// Version 3's times and uuids: each time as the difference from the one before
/// (sorted events: small numbers, mostly zero bytes), created_at as the difference
/// from the event's time, and the uuids byte by byte (every first byte, then every
/// second, ...: a version-7 uuid starts with its time, alike from event to event).
#[cfg(test)]
fn put_fixed(entries: &[Entry], body: &mut Vec<u8>) {
    let mut last = 0i64;
    for e in entries {
        body.extend_from_slice(&e.timestamp.wrapping_sub(last).to_le_bytes());
        last = e.timestamp;
    }
    for e in entries {
        body.extend_from_slice(&e.created_at.wrapping_sub(e.timestamp).to_le_bytes());
    }
    for i in 0..16 {
        body.extend(entries.iter().map(|e| e.uuid.as_bytes()[i]));
    }
}

/// [`put_fixed`]'s columns read back: each event's time, created_at and uuid.
fn take_fixed(c: &mut Cursor, n: usize) -> Option<Vec<(i64, i64, [u8; 16])>> {
    let deltas = c.column(n, 8)?;
    let created = c.column(n, 8)?;
    let uuids = c.take(n.checked_mul(16)?)?;
    let mut last = 0i64;
    let mut out = Vec::with_capacity(n);
    for (i, (delta, created)) in deltas.zip(created).enumerate() {
        last = last.wrapping_add(le64(delta)?);
        let mut uuid = [0u8; 16];
        for (b, byte) in uuid.iter_mut().enumerate() {
            *byte = uuids[b * n + i];
        }
        out.push((last, last.wrapping_add(le64(created)?), uuid));
    }
    Some(out)
}

fn le64(b: &[u8]) -> Option<i64> {
    Some(i64::from_le_bytes(b.try_into().ok()?))
}

/// The events' headers, pointing into `body`, and where their properties are; None if
/// the body is damaged. Names and ids are not yet checked as UTF-8.
pub(super) fn parse(body: &[u8], n: usize, by_key: bool) -> Option<(Vec<Head>, Props)> {
    let mut c = Cursor { rest: body };
    let fixed = match by_key {
        true => take_fixed(&mut c, n)?,
        false => {
            let times = c.column(n, 8)?;
            let created = c.column(n, 8)?;
            let uuids = c.column(n, 16)?;
            let columns = times.zip(created).zip(uuids);
            columns
                .map(|((t, c), u)| Some((le64(t)?, le64(c)?, u.try_into().ok()?)))
                .collect::<Option<Vec<_>>>()?
        }
    };
    let flags = c.take(n)?;
    if flags.iter().any(|&f| f > 1) {
        return None;
    }
    let with_person = flags.iter().filter(|&&f| f == 1).count();
    let mut persons = c.column(with_person, 16)?;
    let name_lens = c.column(n, 4)?;
    let id_lens = c.column(n, 4)?;
    let props_lens = c.column(if by_key { 0 } else { n }, 4)?;
    let at = |c: &Cursor| body.len() - c.rest.len();
    // Each text's range: the texts of a column lie back to back from `from`.
    let ranges = |lens: std::slice::ChunksExact<u8>, from: usize| {
        let mut out = Vec::with_capacity(n);
        let mut end = from;
        for len in lens {
            let start = u32::try_from(end).ok()?;
            end = end.checked_add(le32(len)?)?;
            out.push((start, u32::try_from(end).ok()?));
        }
        Some((out, end - from))
    };
    let (names, names_len) = ranges(name_lens, at(&c))?;
    c.take(names_len)?;
    let (ids, ids_len) = ranges(id_lens, at(&c))?;
    c.take(ids_len)?;
    let (props, packed) = match by_key {
        true => {
            let start = at(&c);
            (Vec::new(), Props::ByKey(Layout::parse(&mut c, start, n)?))
        }
        false => {
            let start = at(&c);
            let (packed, len) = ranges(props_lens, start)?;
            let region = c.take(len)?;
            if !c.rest.is_empty() || !check_packed(region, start, &packed) {
                return None;
            }
            (packed, Props::Packed)
        }
    };
    let mut heads = Vec::with_capacity(n);
    for (i, ((time, created, uuid), &flag)) in fixed.into_iter().zip(flags).enumerate() {
        let person = match flag {
            1 => Some(Uuid::from_slice(persons.next()?).ok()?),
            _ => None,
        };
        heads.push(Head {
            timestamp: time,
            created_at: created,
            uuid: Uuid::from_bytes(uuid),
            person_id: person,
            event: names[i],
            distinct_id: ids[i],
            properties: props.get(i).copied().unwrap_or_default(),
        });
    }
    Some((heads, packed))
}
