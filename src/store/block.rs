//! Event blocks: many events of one project in one value, so the compactor writes one
//! sled key per block rather than one per event; the value's bytes go to the block
//! files ([`files`]) and the key holds where they are. A block holds events
//! sorted by time then uuid, spans at most [`MAX_SPAN_MS`] and is LZ4-compressed as a
//! whole. Each event has a small binary header (times, uuid, person, name, distinct
//! id) apart from its properties, so filters and paging never parse properties.
//!
//! Reads that need a few events of a block read it as [`Rows`] (each event's
//! properties made only when asked for), kept a while in a [`cache`].
//!
//! Value: version, event count (u32 LE), oldest time (i64 LE), then LZ4(size-prefixed)
//! of the body. Version 4, written now ([`body`]), is version 3 with its numbers as
//! varints, the event's uuid written relative to its time, and texts (names,
//! distinct ids, property values) as columns that keep each uuid as its 16 bytes and a
//! value repeating the distinct id as nothing ([`texts`]). Version 3, still read, is
//! version 2 with each event's properties split into keys and values, the keys named
//! once a block and the values laid out key by key ([`props`]). Version 2, still read, lays the body out column by column
//! with the properties' quoted uuids packed ([`columns`]): about a fifth fewer bytes
//! than version 1 for web events. Version 1, still read, lays the events back to back:
//! time, created_at (i64 LE), uuid (16), person flag (1) and person uuid (16), then
//! three u32 LE lengths (name, distinct id, properties JSON) and those bytes.

use serde_json::{Map, Value};
use uuid::Uuid;

use super::event::StoredEvent;

mod body;
pub mod cache;
mod column;
mod columns;
pub mod files;
mod pack;
mod pointer;
mod props;
mod rows;
mod shapes;
mod texts;

pub use column::{may_hold_key, Cell, Column, PropertyKeys};
pub use files::Files;
pub use pointer::POINTER_LEN;
pub use rows::Rows;

/// The version written; [`BY_KEY`], [`COLUMNS`] and [`ROWS`] are still read.
const VERSION: u8 = 4;
/// The third version: columns, properties split by key.
const BY_KEY: u8 = 3;
/// The second version: columns, properties packed whole.
const COLUMNS: u8 = 2;
/// The first version: events back to back.
const ROWS: u8 = 1;
/// version, count, oldest time.
const PREFIX_LEN: usize = 1 + 4 + 8;
/// Version 1: time, created_at, uuid, person flag, person, three lengths.
const HEADER_LEN: usize = 8 + 8 + 16 + 1 + 16 + 4 + 4 + 4;

/// A block never spans more than this, so a query for events before `t` need only
/// look at blocks whose newest event is before `t` plus this span.
pub const MAX_SPAN_MS: i64 = 60 * 60 * 1000;
/// Events per block, for events so small that [`MAX_BYTES`] would allow more.
pub const MAX_EVENTS: usize = 256;
/// Uncompressed bytes per block (about 50 pageviews, 5-10 KB once compressed): a
/// query or the sink reads and decompresses a block whole to use any of its events.
pub const MAX_BYTES: usize = 32 * 1024;
/// A stored block never decompresses to more than this; anything claiming more is
/// damaged, and refusing it avoids a huge allocation.
const MAX_DECODED_BYTES: usize = 256 * 1024 * 1024;

/// One event on its way into a block: the header fields and the properties as JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub timestamp: i64,
    pub created_at: i64,
    pub uuid: Uuid,
    pub person_id: Option<Uuid>,
    pub event: String,
    pub distinct_id: String,
    pub properties: Vec<u8>,
}

impl Entry {
    pub fn from_stored(e: &StoredEvent) -> Entry {
        Entry {
            timestamp: e.timestamp,
            created_at: e.created_at,
            uuid: e.uuid,
            person_id: e.person_id,
            event: e.event.clone(),
            distinct_id: e.distinct_id.clone(),
            properties: serde_json::to_vec(&e.properties).unwrap_or_else(|_| b"{}".to_vec()),
        }
    }

    fn encoded_len(&self) -> usize {
        HEADER_LEN + self.event.len() + self.distinct_id.len() + self.properties.len()
    }

    fn order(&self) -> (i64, u128) {
        (self.timestamp, self.uuid.as_u128())
    }
}

/// Sort `entries` by time then uuid and cut them into blocks: each spans at most
/// [`MAX_SPAN_MS`] and holds at most [`MAX_EVENTS`] events and about [`MAX_BYTES`].
/// Returns each block's newest time and its value.
pub fn build(entries: Vec<Entry>) -> Vec<(i64, Vec<u8>)> {
    build_indexed(entries)
        .into_iter()
        .map(|b| (b.newest, b.value))
        .collect()
}

/// A block made by [`build_indexed`]: its value and what the event index keeps of it.
#[derive(Debug)]
pub struct Built {
    pub newest: i64,
    pub oldest: i64,
    pub value: Vec<u8>,
    /// Its events' distinct ids, sorted, once each.
    pub distinct_ids: Vec<String>,
    /// Its events' names, sorted, once each.
    pub events: Vec<String>,
    /// Its events' property keys.
    pub properties: PropertyKeys,
}

/// [`build`], with each block's times, distinct ids, event names and property keys
/// for the event index.
pub fn build_indexed(mut entries: Vec<Entry>) -> Vec<Built> {
    let mut out = build_open(&mut entries);
    if !entries.is_empty() {
        out.push(built(&entries));
    }
    out
}

/// [`build_indexed`] but for the last block: `entries` are sorted and cut, every block
/// that another entry follows is made, and the last one's entries are left in
/// `entries`, open to more (a chunk's next part) before it is made. Entries given in
/// order, part after part, are cut as they would be given at once.
pub fn build_open(entries: &mut Vec<Entry>) -> Vec<Built> {
    entries.sort_unstable_by_key(Entry::order);
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for i in 0..entries.len() {
        let len = entries[i].encoded_len();
        let full = i - start >= MAX_EVENTS
            || (i > start && bytes + len > MAX_BYTES)
            || entries[i]
                .timestamp
                .saturating_sub(entries[start].timestamp)
                > MAX_SPAN_MS;
        if full {
            out.push(built(&entries[start..i]));
            start = i;
            bytes = 0;
        }
        bytes += len;
    }
    entries.drain(..start);
    out
}

/// One block of sorted entries, with what the event index keeps of it.
fn built(part: &[Entry]) -> Built {
    let (newest, value, properties) = encode(part);
    // Each text copied once, after its repeats are gone.
    let once = |mut texts: Vec<&str>| {
        texts.sort_unstable();
        texts.dedup();
        texts.into_iter().map(str::to_owned).collect()
    };
    Built {
        newest,
        oldest: part.first().map_or(newest, |e| e.timestamp),
        value,
        distinct_ids: once(part.iter().map(|e| e.distinct_id.as_str()).collect()),
        events: once(part.iter().map(|e| e.event.as_str()).collect()),
        properties,
    }
}

/// One block's value from sorted entries; returns its newest time and its property
/// keys too (read from the body's dictionary).
fn encode(entries: &[Entry]) -> (i64, Vec<u8>, PropertyKeys) {
    let body = body::encode(entries);
    let properties = column::body_keys(&body, entries.len());
    let oldest = entries.first().map_or(0, |e| e.timestamp);
    let newest = entries.last().map_or(0, |e| e.timestamp);
    let compressed = lz4_flex::compress_prepend_size(&body);
    let mut value = Vec::with_capacity(PREFIX_LEN + compressed.len());
    value.push(VERSION);
    value.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    value.extend_from_slice(&oldest.to_le_bytes());
    value.extend_from_slice(&compressed);
    (newest, value, properties)
}

/// How many events a block value (or a [`files::Pointer`] to one) holds, without
/// decompressing it.
pub fn count(value: &[u8]) -> Option<u32> {
    if ![ROWS, COLUMNS, BY_KEY, VERSION, files::TAG].contains(value.first()?) {
        return None;
    }
    Some(u32::from_le_bytes(value.get(1..5)?.try_into().ok()?))
}

/// The time of a block value's oldest event, without decompressing it.
pub fn oldest(value: &[u8]) -> Option<i64> {
    count(value)?;
    Some(i64::from_le_bytes(
        value.get(5..PREFIX_LEN)?.try_into().ok()?,
    ))
}

/// A decoded block with every event's properties made: [`Rows`] whose properties are
/// laid out whole, so each one is a slice of the body (what the sink sends as is).
#[derive(Debug)]
pub struct Block {
    rows: Rows,
}

/// An event's header, pointing into the block's bytes.
#[derive(Debug, Clone)]
pub struct Head {
    pub timestamp: i64,
    pub created_at: i64,
    pub uuid: Uuid,
    pub person_id: Option<Uuid>,
    event: (u32, u32),
    distinct_id: (u32, u32),
    properties: (u32, u32),
}

impl Block {
    /// None if the value is damaged in any way: one bad block must not break reads.
    pub fn decode(value: &[u8]) -> Option<Block> {
        Rows::decode(value)?.into_block()
    }

    /// The events' headers, oldest first.
    pub fn heads(&self) -> &[Head] {
        self.rows.heads()
    }

    pub fn event(&self, h: &Head) -> &str {
        self.rows.event(h)
    }

    pub fn distinct_id(&self, h: &Head) -> &str {
        self.rows.distinct_id(h)
    }

    /// The properties as stored: compact JSON text (the ClickHouse sink sends it as is).
    pub fn properties(&self, h: &Head) -> &[u8] {
        self.rows.bytes(h.properties)
    }

    /// The whole event; properties that do not parse read as none.
    pub fn stored(&self, h: &Head) -> StoredEvent {
        let properties = match serde_json::from_slice(self.properties(h)) {
            Ok(Value::Object(p)) => p,
            _ => Map::new(),
        };
        StoredEvent {
            uuid: h.uuid,
            event: self.event(h).to_owned(),
            distinct_id: self.distinct_id(h).to_owned(),
            properties,
            timestamp: h.timestamp,
            created_at: h.created_at,
            person_id: h.person_id,
        }
    }
}

/// A version-1 body's headers, pointing into it.
fn decode_rows(body: &[u8], count: usize) -> Option<Vec<Head>> {
    let mut heads = Vec::with_capacity(count);
    let mut at = 0usize;
    for _ in 0..count {
        let h = body.get(at..at + HEADER_LEN)?;
        let le64 = |r: std::ops::Range<usize>| h[r].try_into().ok().map(i64::from_le_bytes);
        let le32 = |i: usize| h[i..i + 4].try_into().ok().map(u32::from_le_bytes);
        let uuid = Uuid::from_slice(&h[16..32]).ok()?;
        let person = Uuid::from_slice(&h[33..49]).ok()?;
        let lens = [le32(49)?, le32(53)?, le32(57)?];
        let mut start = (at + HEADER_LEN) as u32;
        let mut part = |len: u32| {
            let range = (start, start.checked_add(len)?);
            start = range.1;
            Some(range)
        };
        let head = Head {
            timestamp: le64(0..8)?,
            created_at: le64(8..16)?,
            uuid,
            person_id: (h[32] != 0).then_some(person),
            event: part(lens[0])?,
            distinct_id: part(lens[1])?,
            properties: part(lens[2])?,
        };
        at = start as usize;
        if at > body.len() {
            return None;
        }
        heads.push(head);
    }
    if at != body.len() {
        return None;
    }
    Some(heads)
}

fn range((start, end): (u32, u32)) -> std::ops::Range<usize> {
    start as usize..end as usize
}

#[cfg(test)]
#[path = "tests/block.rs"]
pub(crate) mod tests;
