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

use super::pack::{le32, pack, unpack, Cursor};
use super::{Entry, Head};

/// Fixed bytes per event in the columns, before the person and the texts.
pub(super) const FIXED: usize = 8 + 8 + 16 + 1 + 4 + 4 + 4;

/// The body of sorted `entries`: properties packed back to back (version 2), or split
/// into keys and values ([`super::props`], version 3) when `by_key`.
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

/// The decoded texts (each event's name, distinct id and properties, back to back)
/// and the events' headers pointing into them; None if the body is damaged.
pub(super) fn decode(body: &[u8], n: usize, by_key: bool) -> Option<(Vec<u8>, Vec<Head>)> {
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
    let names_len = name_lens
        .clone()
        .try_fold(0usize, |a, l| a.checked_add(le32(l)?))?;
    let ids_len = id_lens
        .clone()
        .try_fold(0usize, |a, l| a.checked_add(le32(l)?))?;
    let mut names = Cursor {
        rest: c.take(names_len)?,
    };
    let mut ids = Cursor {
        rest: c.take(ids_len)?,
    };
    let mut props = c;
    // Version 3: every event's properties first, each then copied into place.
    let by_key = match by_key {
        true => Some(super::props::decode(&mut props, n)?),
        false => None,
    };
    let mut props_lens = props_lens.map(le32);
    let mut out = Vec::with_capacity(body.len() * 2);
    let mut heads = Vec::with_capacity(n);
    let columns = fixed.into_iter().zip(flags);
    for (i, (((time, created, uuid), &flag), (name_len, id_len))) in
        columns.zip(name_lens.zip(id_lens)).enumerate()
    {
        let person = match flag {
            1 => Some(Uuid::from_slice(persons.next()?).ok()?),
            _ => None,
        };
        let event = append(&mut out, names.take(le32(name_len)?)?)?;
        let distinct_id = append(&mut out, ids.take(le32(id_len)?)?)?;
        let start = u32::try_from(out.len()).ok()?;
        match &by_key {
            Some((all, ends)) => {
                let from = match i {
                    0 => 0,
                    _ => ends[i - 1],
                };
                out.extend_from_slice(all.get(from..*ends.get(i)?)?);
            }
            None => unpack(props.take(props_lens.next()??)?, &mut out)?,
        }
        let properties = (start, u32::try_from(out.len()).ok()?);
        heads.push(Head {
            timestamp: time,
            created_at: created,
            uuid: Uuid::from_bytes(uuid),
            person_id: person,
            event,
            distinct_id,
            properties,
        });
    }
    if !props.rest.is_empty() {
        return None;
    }
    Some((out, heads))
}

/// `bytes` added to `out`; where they are.
fn append(out: &mut Vec<u8>, bytes: &[u8]) -> Option<(u32, u32)> {
    let start = u32::try_from(out.len()).ok()?;
    out.extend_from_slice(bytes);
    Some((start, u32::try_from(out.len()).ok()?))
}
