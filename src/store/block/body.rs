//! The body of a version-4 event [`block`](super), before LZ4. Version 3 left LZ4 the
//! numbers in fixed widths (eight bytes for a time difference of a few bytes, four
//! for each length) and the uuids in the properties as 17 bytes each, their shared
//! first bytes a value's length apart; in web events with random uuids that was most
//! of a block. Here every number is a varint, the event's uuid is written relative
//! to its time (a version-7 uuid starts with the time it was made, usually the
//! event's own), and the texts are columns that keep uuids as their bytes
//! ([`super::texts`]).
//!
//! Layout for `n` events: each time minus the one before (the first minus 0), signed
//! varints; a byte saying how created_at is written ([`OWN`] or [`CHAIN`]) and `n`
//! signed varints; the uuids byte by byte ([`super::pack::put_uuids`]), their first six
//! bytes (a version-7 uuid's milliseconds) less the event's time, modulo 2^48; `n`
//! person flags (u8) and the person (16 bytes) of each event whose flag is 1; the
//! names and the distinct ids as columns of texts; the properties ([`super::shapes`]).

use uuid::Uuid;

use super::pack::{put_signed, put_uuids, Cursor};
use super::props::Props;
use super::{shapes, texts, Entry, Head};

/// The fewest bytes an event takes in a body: its time, created_at, uuid, person
/// flag, the kinds of its name and distinct id and its properties' shape.
pub(super) const LEAST: usize = 1 + 1 + 16 + 1 + 1 + 1 + 1;
/// created_at less the event's own time: small when events arrive as they happen.
const OWN: u8 = 0;
/// created_at less the event before's (the first's less its own time): small when a
/// batch of old events arrives at once, as an SDK's queue flushed late does.
const CHAIN: u8 = 1;
/// The 48 bits of milliseconds a version-7 uuid starts with.
const MILLIS: u64 = (1 << 48) - 1;

/// The body of sorted `entries`.
pub(super) fn encode(entries: &[Entry]) -> Vec<u8> {
    let texts: usize = entries
        .iter()
        .map(|e| e.event.len() + e.distinct_id.len() + e.properties.len())
        .sum();
    let mut body = Vec::with_capacity(entries.len() * (LEAST + 24) + texts);
    let mut last = 0i64;
    for e in entries {
        put_signed(&mut body, e.timestamp.wrapping_sub(last));
        last = e.timestamp;
    }
    put_created(entries, &mut body);
    let ids: Vec<[u8; 16]> = entries
        .iter()
        .map(|e| shift(e.uuid.into_bytes(), e.timestamp, false))
        .collect();
    put_uuids(&mut body, &ids);
    for e in entries {
        body.push(u8::from(e.person_id.is_some()));
    }
    for person in entries.iter().filter_map(|e| e.person_id) {
        body.extend_from_slice(person.as_bytes());
    }
    let names: Vec<&[u8]> = entries.iter().map(|e| e.event.as_bytes()).collect();
    texts::put(&mut body, &names, None);
    let ids: Vec<&[u8]> = entries.iter().map(|e| e.distinct_id.as_bytes()).collect();
    texts::put(&mut body, &ids, None);
    shapes::put(entries, &mut body);
    body
}

/// created_at as [`OWN`] or [`CHAIN`] says, whichever is shorter for these events.
fn put_created(entries: &[Entry], body: &mut Vec<u8>) {
    let (mut own, mut chain) = (Vec::new(), Vec::new());
    let mut last = None;
    for e in entries {
        put_signed(&mut own, e.created_at.wrapping_sub(e.timestamp));
        let before = last.unwrap_or(e.timestamp);
        put_signed(&mut chain, e.created_at.wrapping_sub(before));
        last = Some(e.created_at);
    }
    let (mode, bytes) = match chain.len() < own.len() {
        true => (CHAIN, chain),
        false => (OWN, own),
    };
    body.push(mode);
    body.extend_from_slice(&bytes);
}

/// A uuid's first six bytes less `time` (or, `back`, plus it), modulo 2^48: a
/// version-7 uuid made at the event's time starts with six zero bytes. Any uuid
/// comes back as it was.
fn shift(mut id: [u8; 16], time: i64, back: bool) -> [u8; 16] {
    let mut millis = [0u8; 8];
    millis[2..].copy_from_slice(&id[..6]);
    let millis = u64::from_be_bytes(millis);
    let moved = match back {
        true => millis.wrapping_add(time as u64),
        false => millis.wrapping_sub(time as u64),
    };
    id[..6].copy_from_slice(&(moved & MILLIS).to_be_bytes()[2..]);
    id
}

/// The events' headers and where their properties are; the names and distinct ids
/// are made into the returned bytes, which the caller appends to `body` (the heads
/// point there). None if the body is damaged. Names and ids are not yet checked as
/// UTF-8.
pub(super) fn parse(body: &[u8], n: usize) -> Option<(Vec<Head>, Props, Vec<u8>)> {
    let mut c = Cursor { rest: body };
    let mut times = Vec::with_capacity(n);
    let mut last = 0i64;
    for _ in 0..n {
        last = last.wrapping_add(c.signed()?);
        times.push(last);
    }
    let mode = *c.take(1)?.first()?;
    if mode > CHAIN {
        return None;
    }
    let mut created = Vec::with_capacity(n);
    let mut before: Option<i64> = None;
    for &time in &times {
        let from = match mode {
            CHAIN => before.unwrap_or(time),
            _ => time,
        };
        let at = from.wrapping_add(c.signed()?);
        created.push(at);
        before = Some(at);
    }
    let mut ids = Vec::with_capacity(n);
    c.uuids(n, &mut ids)?;
    let flags = c.take(n)?;
    if flags.iter().any(|&f| f > 1) {
        return None;
    }
    let with_person = flags.iter().filter(|&&f| f == 1).count();
    let mut persons = c.column(with_person, 16)?;
    let mut uuids = Vec::new();
    let names = texts::take(&mut c, body.len(), n, false, &mut uuids)?;
    let distinct_ids = texts::take(&mut c, body.len(), n, false, &mut uuids)?;
    let layout = shapes::take(&mut c, body.len(), n)?;
    let mut made = Vec::new();
    let mut put = |text| {
        let start = u32::try_from(body.len() + made.len()).ok()?;
        texts::write(text, body, &uuids, b"", &mut made)?;
        Some((start, u32::try_from(body.len() + made.len()).ok()?))
    };
    let mut heads = Vec::with_capacity(n);
    for i in 0..n {
        let person = match flags[i] {
            1 => Some(Uuid::from_slice(persons.next()?).ok()?),
            _ => None,
        };
        heads.push(Head {
            timestamp: times[i],
            created_at: created[i],
            uuid: Uuid::from_bytes(shift(ids[i], times[i], true)),
            person_id: person,
            event: put(names[i])?,
            distinct_id: put(distinct_ids[i])?,
            properties: (0, 0),
        });
    }
    Some((heads, Props::ByKey(layout), made))
}

#[cfg(test)]
#[path = "tests/body.rs"]
mod tests;
