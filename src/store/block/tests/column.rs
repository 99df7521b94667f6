//! One key's column reads what the event made whole says for that key, in every
//! layout that splits properties by key, for keys that need escapes, keys given twice,
//! properties kept whole and values that are the distinct id or a uuid; and the key
//! dictionary read from the stored bytes agrees with the decoded block.

use serde_json::{json, Value};
use uuid::Uuid;

use super::super::{build, Entry, Rows};
use super::*;

/// Keys the events below use, and some they do not.
const KEYS: &[&str] = &[
    "$browser",
    "plan",
    "we\"ird\\key",
    "tab\tkey",
    "ünï",
    "dup",
    "$device_id",
    "$distinct",
    "nobody has it",
    "",
    "plan ",
];

fn entry(i: u32, properties: &[u8]) -> Entry {
    Entry {
        timestamp: 1_000 + i64::from(i),
        created_at: 1_000,
        uuid: Uuid::from_u128(u128::from(i) + 1),
        person_id: None,
        event: "$pageview".into(),
        distinct_id: format!("user-{}", i % 3),
        properties: properties.to_vec(),
    }
}

/// Properties of every kind: split by key in shapes of their own, with the key twice,
/// with escapes, and some that a block keeps whole.
fn properties(i: u32) -> Vec<u8> {
    let id = format!("user-{}", i % 3);
    let uuid = Uuid::from_u128(0x0123_4567_89ab_cdef_u128 * u128::from(i + 1));
    match i % 7 {
        0 => serde_json::to_vec(&json!({"$browser": "Chrome", "plan": "pro"})).unwrap(),
        1 => serde_json::to_vec(
            &json!({"$browser": "Firefox", "$device_id": uuid.to_string(),
            "$distinct": id}),
        )
        .unwrap(),
        2 => serde_json::to_vec(&json!({"we\"ird\\key": i, "tab\tkey": [1, {"a": null}],
            "ünï": {"x": "y"}}))
        .unwrap(),
        3 => br#"{"dup":1,"plan":"free","dup":2}"#.to_vec(),
        // Escaped differently from how serde_json writes the same keys.
        4 => br#"{"pl\u0061n":"enterprise","\u00fcn\u00ef":true}"#.to_vec(),
        // Kept whole: spaces, or not an object.
        5 => br#"{"plan": "spaced"}"#.to_vec(),
        _ => b"[1,2]".to_vec(),
    }
}

/// The key's value in event `i` made whole, as JSON text; None without it.
fn whole_value(rows: &Rows, i: usize, key: &str) -> Option<Value> {
    rows.stored(i).unwrap().properties.get(key).cloned()
}

fn check(rows: &Rows, value: &[u8], ctx: &str) {
    for key in KEYS {
        let column = rows.column(key).expect("layouts 3 and 4 split by key");
        let mut any = false;
        for i in 0..rows.heads().len() {
            let mut text = Vec::new();
            let want = whole_value(rows, i, key);
            any |= want.is_some();
            match column.value(i, &mut text) {
                Cell::Value => {
                    let got: Value = serde_json::from_slice(&text).unwrap();
                    assert_eq!(Some(got), want, "{ctx} {key:?} event {i}");
                }
                Cell::Absent => assert_eq!(want, None, "{ctx} {key:?} event {i}"),
                Cell::Whole => {
                    let mut json = Vec::new();
                    rows.properties(i, &mut json);
                    assert!(
                        super::super::props::split(&json).is_none(),
                        "{ctx} {key:?} event {i}: only whole properties read whole"
                    );
                }
            }
        }
        // A block that can hold the key says so; one that says not has no event with it.
        assert!(column.may_hold() || !any, "{ctx} {key:?}");
        if let Some(from_bytes) = may_hold_key(value, key) {
            assert_eq!(from_bytes, column.may_hold(), "{ctx} {key:?}");
        }
    }
}

#[test]
fn a_column_reads_what_the_whole_event_says() {
    for (n, first) in [(6u32, 0u32), (5, 0), (40, 0), (3, 3), (1, 2)] {
        let entries: Vec<Entry> = (first..first + n)
            .map(|i| entry(i, &properties(i)))
            .collect();
        for (_, value) in build(entries) {
            let rows = Rows::decode(&value).unwrap();
            check(&rows, &value, &format!("{n} events from {first}"));
        }
    }
}

#[test]
fn a_block_split_whole_without_the_key_is_told_from_its_bytes() {
    let entries: Vec<Entry> = (0..20)
        .map(|i| entry(i, br#"{"$browser":"Safari"}"#))
        .collect();
    for (_, value) in build(entries) {
        assert_eq!(may_hold_key(&value, "plan"), Some(false));
        assert_eq!(may_hold_key(&value, "$browser"), Some(true));
        let rows = Rows::decode(&value).unwrap();
        assert!(!rows.column("plan").unwrap().may_hold());
        // Cut short anywhere: no panic, and never "not here" for a block that decodes.
        for end in 0..value.len() {
            if may_hold_key(&value[..end], "$browser") == Some(false) {
                assert!(Rows::decode(&value[..end]).is_none(), "cut at {end}");
            }
        }
    }
    // One event kept whole may hold any key.
    let mut entries: Vec<Entry> = (0..5)
        .map(|i| entry(i, br#"{"$browser":"Safari"}"#))
        .collect();
    entries.push(entry(9, br#"{"plan": "pro"}"#));
    for (_, value) in build(entries) {
        assert_eq!(may_hold_key(&value, "plan"), Some(true));
    }
}

#[test]
fn layout_three_reads_by_key_too() {
    let kept = include_bytes!("by_key.blk");
    let rows = Rows::decode(kept).unwrap();
    assert_eq!(may_hold_key(kept, "plan"), None, "told only by decoding it");
    let keys: Vec<String> = (0..rows.heads().len())
        .flat_map(|i| {
            rows.stored(i)
                .unwrap()
                .properties
                .keys()
                .cloned()
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(!keys.is_empty());
    for key in keys.iter().map(String::as_str).chain(["nobody has it"]) {
        let column = rows.column(key).unwrap();
        for i in 0..rows.heads().len() {
            let mut text = Vec::new();
            let got = match column.value(i, &mut text) {
                Cell::Value => Some(serde_json::from_slice::<Value>(&text).unwrap()),
                Cell::Absent => None,
                Cell::Whole => continue,
            };
            assert_eq!(got, whole_value(&rows, i, key), "{key:?} event {i}");
        }
    }
}

#[test]
fn a_prefix_decompresses_as_the_whole_does() {
    let texts: Vec<Vec<u8>> = vec![
        Vec::new(),
        b"a".to_vec(),
        b"abcabcabcabcabcabcabcabcabcabcabcabc".repeat(40),
        (0..5_000u32)
            .flat_map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes())
            .collect(),
        [b"x".repeat(300), b"yz".repeat(700), (0..=255u8).collect()].concat(),
    ];
    for text in texts {
        let compressed = lz4_flex::compress_prepend_size(&text);
        for want in [0, 1, 7, 64, 1_000, text.len(), text.len() + 10] {
            let prefix = Prefix::decode(&compressed[4..], want, text.len()).unwrap();
            assert!(prefix.len() >= want.min(text.len()), "want {want}");
            assert_eq!(prefix[..], text[..prefix.len()], "want {want}");
        }
        // Damaged anywhere: no panic.
        for cut in 0..compressed.len().min(300) {
            let _ = Prefix::decode(
                &compressed[4..4 + cut.saturating_sub(4)],
                text.len(),
                text.len(),
            );
            let mut bad = compressed.clone();
            bad[cut] ^= 0x5a;
            let _ = Prefix::decode(&bad[4..], text.len(), text.len());
        }
    }
}
