//! Event blocks: many events of one project in one value, so the compactor writes one
//! sled key per block rather than one per event; the value's bytes go to the block
//! files ([`files`]) and the key holds where they are. A block holds events
//! sorted by time then uuid, spans at most [`MAX_SPAN_MS`] and is LZ4-compressed as a
//! whole. Each event has a small binary header (times, uuid, person, name, distinct
//! id) apart from its properties, so filters and paging never parse properties.
//!
//! Value: version, event count (u32 LE), oldest time (i64 LE), then LZ4(size-prefixed)
//! of the body. Version 3, written now, is version 2 with each event's properties
//! split into keys and values, the keys named once a block and the values laid out
//! key by key ([`props`]). Version 2, still read, lays the body out column by column
//! with the properties' quoted uuids packed ([`columns`]): about a fifth fewer bytes
//! than version 1 for web events. Version 1, still read, lays the events back to back:
//! time, created_at (i64 LE), uuid (16), person flag (1) and person uuid (16), then
//! three u32 LE lengths (name, distinct id, properties JSON) and those bytes.

use serde_json::{Map, Value};
use uuid::Uuid;

use super::event::StoredEvent;

mod columns;
pub mod files;
mod pack;
mod props;

pub use files::Files;

/// The version written; [`COLUMNS`] and [`ROWS`] are still read.
const VERSION: u8 = 3;
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
        .map(|(newest, value, _)| (newest, value))
        .collect()
}

/// [`build`], with each block's distinct ids (sorted, once each) for the event index.
pub fn build_indexed(mut entries: Vec<Entry>) -> Vec<(i64, Vec<u8>, Vec<String>)> {
    entries.sort_unstable_by_key(Entry::order);
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    let mut push = |part: &[Entry]| {
        let (newest, value) = encode(part);
        let mut ids: Vec<String> = part.iter().map(|e| e.distinct_id.clone()).collect();
        ids.sort_unstable();
        ids.dedup();
        out.push((newest, value, ids));
    };
    for i in 0..entries.len() {
        let len = entries[i].encoded_len();
        let full = i - start >= MAX_EVENTS
            || (i > start && bytes + len > MAX_BYTES)
            || entries[i]
                .timestamp
                .saturating_sub(entries[start].timestamp)
                > MAX_SPAN_MS;
        if full {
            push(&entries[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += len;
    }
    if start < entries.len() {
        push(&entries[start..]);
    }
    out
}

/// One block's value from sorted entries; returns its newest time too.
fn encode(entries: &[Entry]) -> (i64, Vec<u8>) {
    let body = columns::encode(entries, true);
    let oldest = entries.first().map_or(0, |e| e.timestamp);
    let newest = entries.last().map_or(0, |e| e.timestamp);
    let compressed = lz4_flex::compress_prepend_size(&body);
    let mut value = Vec::with_capacity(PREFIX_LEN + compressed.len());
    value.push(VERSION);
    value.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    value.extend_from_slice(&oldest.to_le_bytes());
    value.extend_from_slice(&compressed);
    (newest, value)
}

/// How many events a block value (or a [`files::Pointer`] to one) holds, without
/// decompressing it.
pub fn count(value: &[u8]) -> Option<u32> {
    if ![ROWS, COLUMNS, VERSION, files::TAG].contains(value.first()?) {
        return None;
    }
    Some(u32::from_le_bytes(value.get(1..5)?.try_into().ok()?))
}

/// A decoded block: its bytes and where each event's parts are.
#[derive(Debug)]
pub struct Block {
    body: Vec<u8>,
    heads: Vec<Head>,
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
        if value.first() == Some(&files::TAG) {
            return None;
        }
        let count = count(value)? as usize;
        let compressed = value.get(PREFIX_LEN..)?;
        let size = u32::from_le_bytes(compressed.get(..4)?.try_into().ok()?) as usize;
        // Every event needs at least its fixed fields.
        let least = match value[0] {
            ROWS => HEADER_LEN,
            _ => columns::FIXED,
        };
        if size > MAX_DECODED_BYTES || count > size / least {
            return None;
        }
        let body = lz4_flex::decompress_size_prepended(compressed).ok()?;
        let (body, heads) = match value[0] {
            ROWS => {
                let heads = decode_rows(&body, count)?;
                (body, heads)
            }
            version => columns::decode(&body, count, version == VERSION)?,
        };
        // Names and ids are checked once here, so reading them later cannot fail.
        for h in &heads {
            std::str::from_utf8(body.get(range(h.event))?).ok()?;
            std::str::from_utf8(body.get(range(h.distinct_id))?).ok()?;
            body.get(range(h.properties))?;
        }
        Some(Block { body, heads })
    }

    /// The events' headers, oldest first.
    pub fn heads(&self) -> &[Head] {
        &self.heads
    }

    pub fn event(&self, h: &Head) -> &str {
        self.text(h.event)
    }

    pub fn distinct_id(&self, h: &Head) -> &str {
        self.text(h.distinct_id)
    }

    /// The properties as stored: compact JSON text (the ClickHouse sink sends it as is).
    pub fn properties(&self, h: &Head) -> &[u8] {
        &self.body[range(h.properties)]
    }

    fn text(&self, r: (u32, u32)) -> &str {
        std::str::from_utf8(&self.body[range(r)]).unwrap_or_default()
    }

    /// The whole event; properties that do not parse read as none.
    pub fn stored(&self, h: &Head) -> StoredEvent {
        let properties = match serde_json::from_slice(&self.body[range(h.properties)]) {
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
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// One block's value: `n` events ([`entry`]) with uuids from `first`.
    pub fn value(first: u128, n: u128) -> Vec<u8> {
        let entries = (first..first + n)
            .map(|i| entry(1_000 + i as i64, i, "e"))
            .collect();
        let mut built = build(entries);
        assert_eq!(built.len(), 1);
        built.remove(0).1
    }

    pub fn entry(ts: i64, n: u128, name: &str) -> Entry {
        Entry {
            timestamp: ts,
            created_at: ts.wrapping_add(5),
            uuid: Uuid::from_u128(n),
            person_id: n.is_multiple_of(2).then(|| Uuid::from_u128(n << 64)),
            event: name.into(),
            distinct_id: format!("user-{}", n % 3),
            properties: serde_json::to_vec(&json!({"n": n as u64, "ü": [1, 2]})).unwrap(),
        }
    }

    /// A version-1 value, as builds before version 2 wrote them.
    pub fn encode_rows(entries: &[Entry]) -> Vec<u8> {
        let mut body = Vec::new();
        for e in entries {
            body.extend_from_slice(&e.timestamp.to_le_bytes());
            body.extend_from_slice(&e.created_at.to_le_bytes());
            body.extend_from_slice(e.uuid.as_bytes());
            body.push(u8::from(e.person_id.is_some()));
            body.extend_from_slice(e.person_id.unwrap_or_default().as_bytes());
            for part in [e.event.as_bytes(), e.distinct_id.as_bytes(), &e.properties] {
                body.extend_from_slice(&(part.len() as u32).to_le_bytes());
            }
            body.extend_from_slice(e.event.as_bytes());
            body.extend_from_slice(e.distinct_id.as_bytes());
            body.extend_from_slice(&e.properties);
        }
        let mut value = vec![ROWS];
        value.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        value.extend_from_slice(&entries.first().map_or(0, |e| e.timestamp).to_le_bytes());
        value.extend_from_slice(&lz4_flex::compress_prepend_size(&body));
        value
    }

    fn decoded(value: &[u8]) -> Vec<StoredEvent> {
        let b = Block::decode(value).unwrap();
        b.heads().iter().map(|h| b.stored(h)).collect()
    }

    #[test]
    fn round_trip_sorted() {
        let entries = vec![entry(30, 3, "c"), entry(10, 9, "a"), entry(10, 2, "b")];
        let blocks = build(entries.clone());
        assert_eq!(blocks.len(), 1);
        let (newest, value) = &blocks[0];
        assert_eq!(*newest, 30);
        assert_eq!(count(value), Some(3));
        let events = decoded(value);
        let order: Vec<(i64, u128)> = events
            .iter()
            .map(|e| (e.timestamp, e.uuid.as_u128()))
            .collect();
        assert_eq!(order, [(10, 2), (10, 9), (30, 3)]);
        let b = &events[0];
        assert_eq!(b.event, "b");
        assert_eq!(b.distinct_id, "user-2");
        assert_eq!(b.created_at, 15);
        assert_eq!(b.person_id, Some(Uuid::from_u128(2 << 64)));
        assert_eq!(events[2].person_id, None);
        assert_eq!(
            Value::Object(b.properties.clone()),
            json!({"n": 2, "ü": [1, 2]})
        );
        let block = Block::decode(value).unwrap();
        let h = &block.heads()[1];
        assert_eq!((block.event(h), block.distinct_id(h)), ("a", "user-0"));
    }

    #[test]
    fn cut_by_span_count_and_bytes() {
        let hour = MAX_SPAN_MS;
        let spans = build(vec![
            entry(0, 1, "e"),
            entry(hour, 2, "e"),
            entry(hour + 1, 3, "e"),
            entry(5 * hour, 4, "e"),
        ]);
        let counts: Vec<(i64, u32)> = spans.iter().map(|(t, v)| (*t, count(v).unwrap())).collect();
        assert_eq!(counts, [(hour, 2), (hour + 1, 1), (5 * hour, 1)]);

        // Tiny events: cut by count.
        let tiny = |i: u128| Entry {
            properties: Vec::new(),
            distinct_id: String::new(),
            event: String::new(),
            ..entry(i as i64, i, "")
        };
        const { assert!(MAX_EVENTS * HEADER_LEN <= MAX_BYTES) };
        let sizes: Vec<u32> = build((0..1500).map(tiny).collect())
            .iter()
            .map(|(_, v)| count(v).unwrap())
            .collect();
        assert_eq!(sizes, [256, 256, 256, 256, 256, 220]);
        // Ordinary events: cut by bytes.
        let many: Vec<Entry> = (0..2500)
            .map(|i| Entry {
                properties: vec![b'7'; 300],
                ..entry(i as i64, i, "e")
            })
            .collect();
        let per_block = MAX_BYTES / many[0].encoded_len();
        let sizes: Vec<u32> = build(many).iter().map(|(_, v)| count(v).unwrap()).collect();
        assert_eq!(sizes.iter().sum::<u32>(), 2500);
        assert!(sizes[..sizes.len() - 1]
            .iter()
            .all(|&n| n as usize == per_block));

        let big = |n: u128| Entry {
            properties: vec![b' '; MAX_BYTES * 2 / 3],
            ..entry(0, n, "e")
        };
        let sizes: Vec<u32> = build(vec![big(1), big(2), big(3)])
            .iter()
            .map(|(_, v)| count(v).unwrap())
            .collect();
        assert_eq!(sizes, [1, 1, 1]);
        assert!(build(Vec::new()).is_empty());

        let extremes = build(vec![entry(i64::MIN, 1, "e"), entry(i64::MAX, 2, "e")]);
        let newest: Vec<i64> = extremes.iter().map(|(t, _)| *t).collect();
        assert_eq!(newest, [i64::MIN, i64::MAX]);
    }

    #[test]
    fn version_one_blocks_read_the_same() {
        let id = "01a216c2-1c6c-7536-a8b3-bcbfd45bc4b1";
        let mut entries = vec![entry(10, 2, "b"), entry(30, 3, "c"), entry(10, 9, "a")];
        entries[1].properties = format!(r#"{{"$device_id":"{id}","x":"\u0001"}}"#).into_bytes();
        entries.sort_unstable_by_key(Entry::order);
        let old = encode_rows(&entries);
        let (_, new) = build(entries.clone()).remove(0);
        assert_eq!((old[0], new[0]), (ROWS, VERSION));
        assert_eq!(count(&old), Some(3));
        assert_eq!(decoded(&old), decoded(&new));
        let (old, new) = (Block::decode(&old).unwrap(), Block::decode(&new).unwrap());
        for (a, b) in old.heads().iter().zip(new.heads()) {
            assert_eq!(old.properties(a), new.properties(b));
            assert_eq!(old.event(a), new.event(b));
            assert_eq!(old.distinct_id(a), new.distinct_id(b));
            assert_eq!((a.uuid, a.person_id), (b.uuid, b.person_id));
        }
        let h = &new.heads()[2];
        assert_eq!(
            new.properties(h),
            format!(r#"{{"$device_id":"{id}","x":"\u0001"}}"#).as_bytes()
        );
    }

    /// A version-2 value, as builds before version 3 wrote them.
    pub fn encode_columns(entries: &[Entry]) -> Vec<u8> {
        let mut value = vec![COLUMNS];
        value.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        value.extend_from_slice(&entries.first().map_or(0, |e| e.timestamp).to_le_bytes());
        let body = columns::encode(entries, false);
        value.extend_from_slice(&lz4_flex::compress_prepend_size(&body));
        value
    }

    #[test]
    fn version_two_blocks_read_the_same() {
        let mut entries: Vec<Entry> = (0..40).map(|i| entry(i as i64, i, "e")).collect();
        entries[3].properties = b"not json".to_vec();
        entries[4].properties = br#"{"$browser":"Chrome","x":{"y":[1,"\""]}}"#.to_vec();
        entries.sort_unstable_by_key(Entry::order);
        let old = encode_columns(&entries);
        let (_, new) = build(entries.clone()).remove(0);
        assert_eq!((old[0], new[0]), (COLUMNS, VERSION));
        assert_eq!(decoded(&old), decoded(&new));
        let (old, new) = (Block::decode(&old).unwrap(), Block::decode(&new).unwrap());
        for ((a, b), e) in old.heads().iter().zip(new.heads()).zip(&entries) {
            assert_eq!(old.properties(a), &e.properties[..]);
            assert_eq!(new.properties(b), &e.properties[..]);
            assert_eq!(new.distinct_id(b), e.distinct_id);
        }
    }

    #[test]
    fn damage_is_refused() {
        for value in [
            build(vec![entry(1, 1, "e"), entry(2, 2, "f")]).remove(0).1,
            encode_columns(&[entry(1, 1, "e"), entry(2, 2, "f")]),
            encode_rows(&[entry(1, 1, "e"), entry(2, 2, "f")]),
        ] {
            refused(value);
        }
    }

    fn refused(value: Vec<u8>) {
        for n in 0..value.len() {
            assert!(Block::decode(&value[..n]).is_none(), "prefix {n}");
        }
        let mut longer = value.clone();
        longer.push(0);
        assert!(Block::decode(&longer).is_none());
        let mut wrong_count = value.clone();
        wrong_count[1] = 3;
        assert!(Block::decode(&wrong_count).is_none());
        let mut huge = value.clone();
        huge[PREFIX_LEN..PREFIX_LEN + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Block::decode(&huge).is_none());
        let mut version = value;
        version[0] = 9;
        assert!(Block::decode(&version).is_none());
        assert_eq!(count(&version), None);
    }
}
