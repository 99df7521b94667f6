//! Version 4: any rows read back byte for byte, whatever their texts look like
//! (uuids in any case, texts one character away from a uuid, the marker bytes, bytes
//! that are not UTF-8), and a damaged body is refused without a panic.

use serde_json::{json, Map, Value};
use uuid::Uuid;

use super::super::{build, Block, Entry, Rows, VERSION};
use super::*;
use crate::support::lcg::Lcg;

/// The uuids the blocks are given: the extremes, random ones, and UUIDv7s made at,
/// near or far from the event's time.
trait Uuids {
    fn uuid(&mut self, time: i64) -> Uuid;
}

impl Uuids for Lcg {
    fn uuid(&mut self, time: i64) -> Uuid {
        match self.next(6) {
            0 => Uuid::nil(),
            1 => Uuid::max(),
            2 => Uuid::from_u64_pair(self.wide(), self.wide()),
            // Made at the event's time, or near it, or at any time at all.
            3 => v7(time as u64, self.wide()),
            4 => v7((time as u64).wrapping_add(self.next(2000)), self.wide()),
            _ => v7(self.wide(), self.wide()),
        }
    }
}

fn v7(millis: u64, random: u64) -> Uuid {
    let mut bytes = [0u8; 10];
    bytes[..8].copy_from_slice(&random.to_le_bytes());
    uuid::Builder::from_unix_timestamp_millis(millis & ((1 << 48) - 1), &bytes).into_uuid()
}

/// A text that is, or nearly is, something version 4 stores apart.
fn text(rng: &mut Lcg, distinct: &str) -> String {
    let id = Uuid::from_u64_pair(rng.wide(), rng.wide()).to_string();
    match rng.next(12) {
        0 => String::new(),
        1 => id,
        2 => id.to_uppercase(),
        // One character off: a letter past f, a hyphen moved, one digit more or less.
        3 => id.replacen(|c: char| c.is_ascii_hexdigit(), "g", 1),
        4 => id.replacen('-', "", 1) + "-",
        5 => id[1..].to_owned(),
        6 => id + "0",
        7 => "\u{1}\u{2}\u{3}\"\\".to_owned(),
        8 => distinct.to_owned(),
        9 => format!("\"{distinct}\""),
        10 => "ü$pageview\u{1}".to_owned(),
        _ => format!("user-{}", rng.next(1000)),
    }
}

fn value(rng: &mut Lcg, distinct: &str, depth: u32) -> Value {
    match rng.next(if depth > 1 { 4 } else { 6 }) {
        0 => Value::Null,
        1 => json!(rng.next(1 << 40) as i64 - (1 << 39)),
        2 | 3 => Value::String(text(rng, distinct)),
        4 => Value::Array(
            (0..rng.next(3))
                .map(|_| value(rng, distinct, depth + 1))
                .collect(),
        ),
        _ => Value::Object(object(rng, distinct, depth + 1)),
    }
}

fn object(rng: &mut Lcg, distinct: &str, depth: u32) -> Map<String, Value> {
    let keys = [
        "$device_id",
        "$session_id",
        "distinct_id",
        "$browser",
        "a\u{1}",
        "",
    ];
    let mut m = Map::new();
    for _ in 0..rng.next(8) {
        let key = match rng.next(4) {
            0 => text(rng, distinct),
            _ => keys[rng.next(keys.len() as u64) as usize].to_owned(),
        };
        m.insert(key, value(rng, distinct, depth));
    }
    m
}

/// Properties as the compactor writes them, and anything else a row could hold.
fn properties(rng: &mut Lcg, distinct: &str) -> Vec<u8> {
    match rng.next(8) {
        0 => Vec::new(),
        1 => (0..rng.next(40)).map(|_| rng.next(256) as u8).collect(),
        2 => [
            &b"\x01\x02\x03\xff{\"a\":\""[..],
            distinct.as_bytes(),
            b"\"}",
        ]
        .concat(),
        3 => format!("\"{distinct}\"").into_bytes(),
        4 => br#"{"a": 1, "b" : "c"}"#.to_vec(),
        _ => serde_json::to_vec(&object(rng, distinct, 0)).expect("JSON"),
    }
}

fn time(rng: &mut Lcg, base: i64) -> i64 {
    match rng.next(10) {
        0 => i64::MIN,
        1 => i64::MAX,
        2 => rng.wide() as i64,
        _ => base + rng.next(5000) as i64,
    }
}

fn entries(seed: u64) -> Vec<Entry> {
    let mut rng = Lcg(seed);
    let base = 1_764_000_000_000 + rng.next(1 << 30) as i64;
    (0..rng.next(70))
        .map(|_| {
            let timestamp = time(&mut rng, base);
            let distinct_id = text(&mut rng, "");
            Entry {
                timestamp,
                created_at: match rng.next(3) {
                    0 => time(&mut rng, base),
                    _ => timestamp.wrapping_add(rng.next(90_000) as i64),
                },
                uuid: rng.uuid(timestamp),
                person_id: (rng.next(4) > 0).then(|| rng.uuid(base)),
                event: text(&mut rng, &distinct_id),
                properties: properties(&mut rng, &distinct_id),
                distinct_id,
            }
        })
        .collect()
}

/// Each of `entries` read back from `value`, both ways, exactly.
fn read_back(value: &[u8], mut entries: Vec<Entry>) {
    entries.sort_by_key(Entry::order);
    let rows = Rows::decode(value).expect("a block decodes");
    let block = Block::decode(value).expect("a block decodes");
    assert_eq!(rows.heads().len(), entries.len());
    for (i, e) in entries.iter().enumerate() {
        let (r, h) = (&rows.heads()[i], &block.heads()[i]);
        for head in [r, h] {
            assert_eq!(
                (head.timestamp, head.created_at, head.uuid, head.person_id),
                (e.timestamp, e.created_at, e.uuid, e.person_id)
            );
        }
        assert_eq!(
            (rows.event(r), rows.distinct_id(r)),
            (&e.event[..], &e.distinct_id[..])
        );
        assert_eq!(
            (block.event(h), block.distinct_id(h)),
            (&e.event[..], &e.distinct_id[..])
        );
        let mut props = Vec::new();
        rows.properties(i, &mut props);
        assert_eq!(
            props,
            e.properties,
            "{}",
            String::from_utf8_lossy(&e.properties)
        );
        assert_eq!(block.properties(h), &e.properties[..]);
    }
}

#[test]
fn any_rows_read_back_byte_for_byte() {
    for seed in 0..400 {
        let entries = entries(seed);
        let mut read = 0;
        for (_, value) in build(entries.clone()) {
            assert_eq!(value[0], VERSION);
            read += Rows::decode(&value).expect("decodes").heads().len();
        }
        assert_eq!(read, entries.len());
        // One block of them all, past the cuts build makes.
        let mut sorted = entries.clone();
        sorted.sort_by_key(Entry::order);
        read_back(&super::super::encode(&sorted).1, entries);
    }
}

#[test]
fn an_empty_block_reads_as_no_events() {
    let (_, value, _) = super::super::encode(&[]);
    read_back(&value, Vec::new());
}

#[test]
fn uuids_are_kept_as_their_bytes() {
    let id = "01a216c2-1c6c-7536-a8b3-bcbfd45bc4b1";
    let quoted = format!("\"{id}\"");
    let upper = quoted.to_uppercase();
    let items: Vec<&[u8]> = vec![quoted.as_bytes(), b"\"d\"", upper.as_bytes(), id.as_bytes()];
    let distinct: Vec<&[u8]> = vec![b"x", b"d", b"x", b"x"];
    let mut out = Vec::new();
    texts::put(&mut out, &items, Some(&distinct[..]));
    // Kinds, two uuids of 16 bytes, one length and the uppercase text as it was.
    assert_eq!(out[..4], [2, 3, 0, 1]);
    assert_eq!(out.len(), 4 + 32 + 1 + upper.len());
    let mut uuids = Vec::new();
    let mut c = Cursor { rest: &out };
    let got = texts::take(&mut c, out.len(), 4, true, &mut uuids).expect("parses");
    assert!(c.rest.is_empty());
    for ((text, item), id) in got.into_iter().zip(&items).zip(&distinct) {
        let mut back = Vec::new();
        texts::write(text, &out, &uuids, id, &mut back).expect("in range");
        assert_eq!(&back, item);
    }
    // A column of names or distinct ids cannot say "the distinct id".
    let mut c = Cursor { rest: &out };
    assert_eq!(texts::take(&mut c, out.len(), 4, false, &mut uuids), None);
}

#[test]
fn damage_is_refused_without_panic() {
    let mut rows = (0..)
        .map(entries)
        .find(|e| e.len() > 20)
        .expect("some seed");
    rows.sort_by_key(Entry::order);
    let n = rows.len();
    let body = encode(&rows);
    assert!(parse(&body, n).is_some());
    for cut in 0..body.len() {
        assert!(parse(&body[..cut], n).is_none(), "cut at {cut}");
    }
    let mut rng = Lcg(3);
    for _ in 0..3000 {
        let mut bad = body.clone();
        let at = rng.next(bad.len() as u64) as usize;
        bad[at] = rng.next(256) as u8;
        // Anything may come out, but never a panic, a hang or a huge allocation.
        let _ = parse(&bad, n);
        let _ = parse(&bad, n + rng.next(3) as usize);
    }
}
