//! The forwarder's encoding, written straight from a block's columns into one buffer
//! ([`Lines`]), against the way it was made before: each event made apart from a
//! [`Block`] whose properties were joined first, then copied into the body one by
//! one. Same stored events in, the same `/batch/` JSON out, byte for byte, from
//! blocks of every version, with every kind of property value, escapes, unicode,
//! `$ignore_sent_at`, `$ip`, values repeating the distinct id, properties that are
//! not an object, and requests of recent and historical events mixed. Then how
//! requests are cut.

use std::io::Read;

use serde_json::json;
use uuid::Uuid;

use crate::edge::forward::batch::{body, halves, parts, Lines, MAX_EVENTS};
use crate::store::block::tests::{encode_by_key, encode_columns, encode_rows};
use crate::store::block::{build, Block, Entry, Rows};
use crate::support::clock::format_ms;

/// One event as the forwarder made it before: `{uuid, event, distinct_id,
/// timestamp, properties}` from a decoded [`Block`].
fn old_lines(block: &Block) -> Vec<(Uuid, i64, Vec<u8>)> {
    let text = |s: &str| serde_json::to_vec(s).unwrap();
    block
        .heads()
        .iter()
        .map(|h| {
            let properties = block.properties(h);
            let mut json = b"{\"uuid\":\"".to_vec();
            json.extend_from_slice(h.uuid.hyphenated().to_string().as_bytes());
            json.extend_from_slice(b"\",\"event\":");
            json.extend(text(block.event(h)));
            json.extend_from_slice(b",\"distinct_id\":");
            json.extend(text(block.distinct_id(h)));
            json.extend_from_slice(b",\"timestamp\":\"");
            json.extend_from_slice(format_ms(h.timestamp).as_bytes());
            json.extend_from_slice(b"\",\"properties\":");
            match properties.first() {
                Some(b'{') => json.extend_from_slice(properties),
                _ => json.extend_from_slice(b"{}"),
            }
            json.push(b'}');
            (h.uuid, h.timestamp, json)
        })
        .collect()
}

/// The request's JSON as it was made before, before gzip.
fn old_body(key: &str, historical: bool, sent_at: i64, events: &[&[u8]]) -> Vec<u8> {
    let mut json = b"{\"api_key\":".to_vec();
    json.extend(serde_json::to_vec(key).unwrap());
    json.extend_from_slice(b",\"historical_migration\":");
    json.extend_from_slice(if historical { b"true" } else { b"false" });
    json.extend_from_slice(b",\"sent_at\":\"");
    json.extend_from_slice(format_ms(sent_at).as_bytes());
    json.extend_from_slice(b"\",\"batch\":[");
    json.extend_from_slice(&events.join(&b","[..]));
    json.extend_from_slice(b"]}");
    json
}

fn gunzip(gz: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// Stored events of every shape the forwarder meets; times from before 1970 to past
/// the year 9999, some before `NOW - DAY` (historical).
fn entries() -> Vec<Entry> {
    const NOW: i64 = 1_764_403_200_000;
    let device = "0192d6a3-5a7e-7f3b-9c1d-2e4f6a8b0c1d";
    let kinds = [
        json!({"$os": "Mac OS X", "$browser_version": 124, "$device_id": device,
               "$current_url": "https://app.example.com/project/3/insights?tab=overview",
               "token": "phc_k", "distinct_id": "user-000001", "$ip": "203.0.113.9",
               "$sent_at": "2026-11-29T07:59:59.000Z", "$ignore_sent_at": true}),
        json!({"s": "quote \" backslash \\ newline \n tab \t nul \u{0} bell \u{7}",
               "unicode": "ü 日本語 😀 \u{2028}", "n": -12, "f": 1.5, "e": 1e300,
               "big": u64::MAX, "t": true, "no": false, "null": null,
               "nested": {"a": [1, {"b": [null, "x"]}], "empty": {}}, "arr": [],
               "$set": {"email": "a@b.c"}, "$set_once": {"first": 1}}),
        json!({}),
        json!({"$device_id": device, "$session_id": device, "$window_id": device}),
    ];
    let mut out = Vec::new();
    for i in 0..60u128 {
        let mut properties = serde_json::to_vec(&kinds[i as usize % kinds.len()]).unwrap();
        match i {
            7 => properties = b"not json".to_vec(),
            8 => properties = b"\x01\x02\xff".to_vec(),
            9 => properties = b"[1,2]".to_vec(),
            10 => properties = br#"{"kept" : "with spaces"}"#.to_vec(),
            _ => {}
        }
        let timestamp = match i {
            0 => -1_500,
            1 => 253_402_300_800_123,
            _ if i % 5 == 0 => NOW - 2 * 86_400_000 - i as i64,
            _ => NOW - i as i64 * 1_000,
        };
        let (event, distinct_id) = match i % 4 {
            0 => ("$pageview".to_string(), format!("user-{:06}", i % 3)),
            1 => (
                "say \"hi\" \\ ü 😀".to_string(),
                "id with \"quotes\"\n".to_string(),
            ),
            2 => ("$identify".to_string(), device.to_string()),
            _ => ("e".to_string(), "user-000001".to_string()),
        };
        out.push(Entry {
            timestamp,
            created_at: timestamp + 5,
            uuid: Uuid::from_u128(0x0192_0000_0000_7000_8000_0000_0000_0000 + i * 7919),
            person_id: (i % 2 == 0).then(|| Uuid::from_u128(i << 64)),
            event,
            distinct_id,
            properties,
        });
    }
    out.sort_unstable_by_key(|e| (e.timestamp, e.uuid.as_u128()));
    out
}

/// The events' values in every block version still read.
fn values() -> Vec<(&'static str, Vec<u8>)> {
    let entries = entries();
    let mut current: Vec<(&'static str, Vec<u8>)> = build(entries.clone())
        .into_iter()
        .map(|(_, v)| ("version 4", v))
        .collect();
    assert!(current.len() > 1, "the events span more than one block");
    current.push(("version 3", encode_by_key(&entries)));
    current.push(("version 2", encode_columns(&entries)));
    current.push(("version 1", encode_rows(&entries)));
    current
}

#[test]
fn events_are_written_from_the_columns_byte_for_byte_as_before() {
    let (mut lines, mut old) = (Lines::new(), Vec::new());
    for (version, value) in values() {
        let before = lines.len();
        lines.push_rows(&Rows::decode(&value).unwrap());
        old.extend(old_lines(&Block::decode(&value).unwrap()));
        assert_eq!(lines.len(), old.len(), "{version}");
        assert!(lines.len() > before, "{version}");
    }
    assert_eq!(old.len(), 60 * 4);
    for (i, (uuid, timestamp, json)) in old.iter().enumerate() {
        let line = lines.line(i);
        assert_eq!((line.uuid, line.timestamp), (*uuid, *timestamp));
        assert_eq!(lines.json(i), &json[..], "event {i}");
        assert_eq!(line.size(), json.len());
    }
    // Each one PostHog can read, with its properties as stored.
    let v: serde_json::Value = serde_json::from_slice(lines.json(0)).unwrap();
    assert_eq!(v["timestamp"], "1969-12-31T23:59:58.500Z");
    let texts: Vec<&[u8]> = (0..lines.len()).map(|i| lines.json(i)).collect();
    let odd = texts
        .iter()
        .find(|t| t.windows(8).any(|w| w == b"nul \\u00"))
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(odd).unwrap();
    assert_eq!(v["properties"]["unicode"], "ü 日本語 😀 \u{2028}");
    assert_eq!(v["properties"]["big"], u64::MAX);
}

#[test]
fn bodies_decode_to_the_json_made_before_for_every_cut_of_events() {
    let mut lines = Lines::new();
    let mut old = Vec::new();
    for (_, value) in values() {
        lines.push_rows(&Rows::decode(&value).unwrap());
        old.extend(old_lines(&Block::decode(&value).unwrap()));
    }
    let sent_at = 1_764_403_200_123;
    let check = |events: &[usize], historical: bool| {
        let texts: Vec<&[u8]> = events.iter().map(|i| &old[*i].2[..]).collect();
        let want = old_body("phc_\"k\"", historical, sent_at, &texts);
        let got = gunzip(&body("phc_\"k\"", historical, sent_at, &lines, events));
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want),
            "{events:?}"
        );
    };
    let cutoff = 1_764_403_200_000 - 86_400_000;
    let cut = parts(&lines, cutoff, usize::MAX);
    assert_eq!(cut.len(), 2, "recent and historical apart");
    for (events, historical) in &cut {
        assert!(events.windows(2).any(|w| w[1] != w[0] + 1), "with gaps");
        check(events, *historical);
    }
    let all: Vec<usize> = (0..lines.len()).collect();
    check(&all, false);
    check(&all[17..18], true);
    check(&all[3..91], false);
    check(&[0, 1, 2, 50, 51, 239], false);
    check(&[], false);
    // Bisected halves, as a 400 sends them.
    let [a, b] = halves(0..cut[0].0.len());
    check(&cut[0].0[a], false);
    check(&cut[0].0[b], false);
}

fn sized(timestamps: &[i64], size: usize) -> Lines {
    let mut lines = Lines::new();
    for t in timestamps {
        lines.push(Uuid::nil(), *t, &vec![b'x'; size]);
    }
    lines
}

#[test]
fn requests_split_recent_from_historical_and_by_count_and_size() {
    // 0, 2 and 4 are old; the rest recent.
    let lines = sized(&[5, 50, 5, 50, 5, 50], 9);
    assert_eq!(
        parts(&lines, 10, 1000),
        vec![(vec![1, 3, 5], false), (vec![0, 2, 4], true)]
    );
    // 10 bytes a line: two fit in 25 bytes.
    assert_eq!(
        parts(&lines, 0, 25),
        vec![
            (vec![0, 1], false),
            (vec![2, 3], false),
            (vec![4, 5], false)
        ]
    );
    // A line larger than the limit goes alone.
    let mut big = sized(&[50], 9);
    big.push(Uuid::nil(), 50, &[b'x'; 100]);
    big.push(Uuid::nil(), 50, &[b'x'; 9]);
    assert_eq!(
        parts(&big, 0, 25),
        vec![(vec![0], false), (vec![1], false), (vec![2], false)]
    );
    let many = sized(&vec![50; MAX_EVENTS * 2 + 1], 1);
    let cut = parts(&many, 0, usize::MAX);
    assert_eq!(
        cut.iter().map(|(p, _)| p.len()).collect::<Vec<_>>(),
        [MAX_EVENTS, MAX_EVENTS, 1]
    );
    assert!(parts(&Lines::new(), 0, 10).is_empty());
}

#[test]
fn halves_cover_the_run() {
    assert_eq!(halves(0..5), [0..2, 2..5]);
    assert_eq!(halves(3..5), [3..4, 4..5]);
}
