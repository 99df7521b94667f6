//! Blocks: what is built decodes back, in each version, and helpers other tests use.

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
    let whole: Vec<StoredEvent> = b.heads().iter().map(|h| b.stored(h)).collect();
    // Read one event at a time, the same events come out, each made alone.
    let rows = Rows::decode(value).unwrap();
    assert_eq!(rows.heads().len(), whole.len());
    for (i, (h, e)) in b.heads().iter().zip(&whole).enumerate().rev() {
        let mut props = Vec::new();
        rows.properties(i, &mut props);
        assert_eq!(props, b.properties(h));
        assert_eq!(rows.stored(i).as_ref(), Some(e));
        let r = &rows.heads()[i];
        assert_eq!(
            (rows.event(r), rows.distinct_id(r)),
            (b.event(h), b.distinct_id(h))
        );
    }
    assert_eq!(rows.stored(whole.len()), None);
    whole
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

/// A version-3 value, as builds before version 4 wrote them.
pub fn encode_by_key(entries: &[Entry]) -> Vec<u8> {
    let mut value = vec![BY_KEY];
    value.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    value.extend_from_slice(&entries.first().map_or(0, |e| e.timestamp).to_le_bytes());
    let body = columns::encode(entries, true);
    value.extend_from_slice(&lz4_flex::compress_prepend_size(&body));
    value
}

/// Events of several shapes, as `version_three_blocks_read_the_same` and its fixture
/// hold them.
fn shaped(n: u128) -> Vec<Entry> {
    let id = "01a216c2-1c6c-7536-a8b3-bcbfd45bc4b1";
    let mut entries: Vec<Entry> = (0..n).map(|i| entry(i as i64 * 7, i, "e")).collect();
    entries[3].properties = b"not json".to_vec();
    entries[4].properties = br#"{"$browser":"Chrome","x":{"y":[1,"\""]}}"#.to_vec();
    entries[5].properties = format!(r#"{{"$device_id":"{id}","distinct_id":"user-2"}}"#).into();
    entries[6].properties = b"\x01\x02\xff".to_vec();
    entries[7].distinct_id = id.into();
    entries.sort_unstable_by_key(Entry::order);
    entries
}

#[test]
fn version_three_blocks_read_the_same() {
    let entries = shaped(40);
    let old = encode_by_key(&entries);
    let (_, new) = build(entries.clone()).remove(0);
    assert_eq!((old[0], new[0]), (BY_KEY, VERSION));
    assert!(new.len() < old.len(), "{} against {}", new.len(), old.len());
    assert_eq!(decoded(&old), decoded(&new));
    let (old, new) = (Block::decode(&old).unwrap(), Block::decode(&new).unwrap());
    for ((a, b), e) in old.heads().iter().zip(new.heads()).zip(&entries) {
        assert_eq!(old.properties(a), &e.properties[..]);
        assert_eq!(new.properties(b), &e.properties[..]);
        assert_eq!(old.distinct_id(a), e.distinct_id);
        assert_eq!(new.distinct_id(b), e.distinct_id);
    }
}

/// A version-3 block written by the build before version 4, kept as it was written:
/// it still reads as the events it was made of, whatever becomes of the encoders.
#[test]
fn a_kept_version_three_block_reads_the_same() {
    let kept = include_bytes!("../block/tests/by_key.blk");
    assert_eq!(kept[0], BY_KEY);
    let entries = shaped(40);
    let rows = Rows::decode(kept).unwrap();
    assert_eq!(rows.heads().len(), entries.len());
    for (i, (h, e)) in rows.heads().iter().zip(&entries).enumerate() {
        let mut props = Vec::new();
        rows.properties(i, &mut props);
        assert_eq!(props, e.properties);
        assert_eq!(
            (rows.event(h), rows.distinct_id(h)),
            (&e.event[..], &e.distinct_id[..])
        );
        assert_eq!((h.timestamp, h.created_at), (e.timestamp, e.created_at));
        assert_eq!((h.uuid, h.person_id), (e.uuid, e.person_id));
    }
    assert_eq!(decoded(kept).len(), entries.len());
}

#[test]
fn damage_is_refused() {
    for value in [
        build(vec![entry(1, 1, "e"), entry(2, 2, "f")]).remove(0).1,
        encode_by_key(&[entry(1, 1, "e"), entry(2, 2, "f")]),
        encode_columns(&[entry(1, 1, "e"), entry(2, 2, "f")]),
        encode_rows(&[entry(1, 1, "e"), entry(2, 2, "f")]),
    ] {
        refused(value);
    }
}

fn refused(value: Vec<u8>) {
    for n in 0..value.len() {
        assert!(Block::decode(&value[..n]).is_none(), "prefix {n}");
        assert!(Rows::decode(&value[..n]).is_none(), "prefix {n}");
    }
    // A damaged packed value (a uuid marker cut short) refuses the block, whichever way
    // it is read, though the other events' properties are not made.
    let body = lz4_flex::decompress_size_prepended(&value[PREFIX_LEN..]).unwrap();
    if value[0] != ROWS {
        let at = body.len() - 1;
        let mut cut = body.clone();
        cut[at] = 0x01;
        let mut bad = value[..PREFIX_LEN].to_vec();
        bad.extend_from_slice(&lz4_flex::compress_prepend_size(&cut));
        assert!(Block::decode(&bad).is_none());
        assert!(Rows::decode(&bad).is_none());
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
