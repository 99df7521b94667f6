//! The text path ([`splice`]) against the `Value` round trip: the same records applied
//! to two databases, one through [`record`] and one through [`round_trip`], must store
//! the same properties, persons, groups and group types.

use std::net::IpAddr;

use serde_json::{json, Value};
use sled::transaction::Transactional;

use super::*;
use crate::compactor::cache::Tables;
use crate::store::Trees;

const NOW: i64 = 1_700_000_000_000;

struct Case {
    data: Vec<u8>,
    ip: Option<IpAddr>,
    anonymize: bool,
    geo: Option<usize>,
}

fn case(event: Value) -> Case {
    Case {
        data: serde_json::to_vec(&event).unwrap(),
        ip: Some("81.2.69.160".parse().unwrap()),
        anonymize: false,
        geo: Some(0),
    }
}

/// The `i`th record of a chunk, carrying `c`'s event.
fn record_of(i: usize, c: &Case) -> Record {
    let event: Value = serde_json::from_slice(&c.data).unwrap_or(Value::Null);
    Record {
        project: 1,
        received_at: NOW + i as i64,
        timestamp: NOW + i as i64,
        sent_at: None,
        uuid: Uuid::from_u128(i as u128),
        historical: false,
        ip: c.ip,
        event: event["event"].as_str().unwrap_or("e").into(),
        distinct_id: event["distinct_id"].as_str().unwrap_or("d").into(),
        data: c.data.clone(),
    }
}

/// Run `apply` as one chunk does: one transaction over the person and group trees,
/// one cache, written at the end.
fn in_chunk<T>(
    t: &Trees,
    apply: impl Fn(&Tx<'_>, &mut Cache) -> sled::transaction::ConflictableTransactionResult<T, ()>,
) -> T {
    let tables = Tables::new(t);
    let journal = tables.begin();
    let out = (&t.groups, &t.group_types, &t.meta).transaction(|(groups, group_types, meta)| {
        journal.restart();
        let tx = tables.tx(groups, group_types);
        let mut cache = Cache::default();
        let out = apply(&tx, &mut cache)?;
        cache.write(&tx)?;
        if let Some((key, value)) = journal.stage().unwrap() {
            meta.insert(key, &value[..])?;
        }
        Ok(out)
    });
    journal.finish(out.is_ok());
    out.unwrap()
}

/// The GeoIP properties a case uses, for its address.
fn geo(index: usize, ip: Option<IpAddr>) -> Geo {
    let geo = geos().swap_remove(index);
    match ip {
        Some(ip) => geo.with_ip(ip),
        None => geo,
    }
}

fn geos() -> Vec<Geo> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/GeoIP2-City-Test.mmdb");
    let db = crate::geoip::Database::open(&path).unwrap();
    let found = db.lookup("81.2.69.160".parse().unwrap());
    assert!(found.len() >= 5, "the test database locates the address");
    vec![
        Geo::new(found),
        Geo::new(vec![
            ("$geoip_city_name", json!("Zürich \"centre\"")),
            ("$geoip_latitude", json!(47.3769)),
            ("$geoip_accuracy", json!(5)),
        ]),
        Geo::new(Vec::new()),
        // A key without the usual prefix.
        Geo::new(vec![
            ("$geoip_city_name", json!("Paris")),
            ("plan", json!("geo")),
        ]),
    ]
}

struct Outcome {
    /// Per record: whether it has a person, and its stored properties.
    entries: Vec<(bool, String)>,
    /// Every person (without its random id) by distinct id, then groups and group types.
    persons: Vec<(Vec<u8>, Value)>,
    groups: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Apply `cases` in one transaction, as one chunk, through `text` or the round trip.
fn run(cases: &[Case], text: bool) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let t = Trees::open(&db, dir.path()).unwrap();
    let geos: Vec<Option<Geo>> = cases.iter().map(|c| c.geo.map(|g| geo(g, c.ip))).collect();
    let records: Vec<Record> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| record_of(i, c))
        .collect();
    let entries = in_chunk(&t, |tx, cache| {
        let mut out = Vec::new();
        // One buffer for the chunk's events, as the compactor keeps.
        let mut scratch = Vec::new();
        for (i, c) in cases.iter().enumerate() {
            let r = &records[i];
            let settings = ProjectSettings {
                anonymize_ips: c.anonymize,
            };
            let geo = geos[i].as_ref();
            let (person, properties) = if text {
                let e = record(tx, cache, r, settings, geo, &mut scratch)?;
                (e.person_id, e.properties)
            } else {
                round_trip(tx, cache, r, settings, geo)?
            };
            out.push((person.is_some(), String::from_utf8(properties).unwrap()));
        }
        Ok(out)
    });
    let mut persons = Vec::new();
    for kv in t.distinct_ids.iter() {
        let (k, id) = kv.unwrap();
        let mut key = k[..8].to_vec();
        key.extend_from_slice(&id);
        let mut p: Value = serde_json::from_slice(&t.persons.get(&key).unwrap().unwrap()).unwrap();
        p.as_object_mut().unwrap().remove("id");
        persons.push((k.to_vec(), p));
    }
    let groups = t
        .groups
        .iter()
        .chain(t.group_types.iter())
        .map(|kv| {
            let (k, v) = kv.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .collect();
    Outcome {
        entries,
        persons,
        groups,
    }
}

fn assert_same(cases: &[Case]) {
    let (text, value) = (run(cases, true), run(cases, false));
    for (i, (a, b)) in text.entries.iter().zip(&value.entries).enumerate() {
        assert_eq!(
            a,
            b,
            "record {i}: {}",
            String::from_utf8_lossy(&cases[i].data)
        );
    }
    assert_eq!(text.entries.len(), value.entries.len());
    assert_eq!(text.persons, value.persons);
    assert_eq!(text.groups, value.groups);
}

fn corpus() -> Vec<Case> {
    let mut cases = vec![
        case(
            json!({"event": "$pageview", "distinct_id": "u1", "properties": {
            "$current_url": "https://x/a?b=\"c\"", "$browser_version": 124, "$time": 1718000000.123,
            "n": [1, -2, 3.5e-7, null, true, {"k": "é😀\u{1}\n"}], "a\"b": {"\\": []}, "$lib": "web"}}),
        ),
        case(
            json!({"event": "$pageview", "distinct_id": "u1", "properties": {
            "$set": {"plan": "pro", "n": 1}, "$set_once": {"first": "x"}}}),
        ),
        // The same again: nothing changes for the person.
        case(
            json!({"event": "$pageview", "distinct_id": "u1", "properties": {
            "$set": {"plan": "pro", "n": 1}, "$set_once": {"first": "y"}}}),
        ),
        // Top-level operations, as posthog-python sends them, and both $unset forms.
        case(
            json!({"event": "e", "distinct_id": "u1", "$set": {"plan": "free"},
            "$set_once": {"first": "z", "other": 2}, "$unset": ["n"], "properties": {"$unset": {"first": true}}}),
        ),
        case(
            json!({"event": "e", "distinct_id": "u1", "$unset": ["plan"], "properties": {"x": 1}}),
        ),
        case(
            json!({"event": "$pageview", "distinct_id": "anon-1", "properties": {"$set_once": {"ref": "x"}}}),
        ),
        case(
            json!({"event": "$identify", "distinct_id": "u1", "properties": {
            "$anon_distinct_id": "anon-1", "$set": {"email": "u1@x"}}}),
        ),
        case(
            json!({"event": "$identify", "distinct_id": "u2", "properties": {"$anon_distinct_id": 42}}),
        ),
        case(
            json!({"event": "$create_alias", "distinct_id": "device-1", "properties": {"alias": "u2"}}),
        ),
        case(
            json!({"event": "$merge_dangerously", "distinct_id": "u2", "properties": {"alias": "u1"}}),
        ),
        case(
            json!({"event": "$groupidentify", "distinct_id": "u1", "properties": {
            "$group_type": "company", "$group_key": "acme", "$group_set": {"name": "Acme", "size": 5}}}),
        ),
        case(
            json!({"event": "$groupidentify", "distinct_id": "u1", "properties": {
            "$group_type": "project", "$group_key": 7, "$group_set": {"name": "P"}}}),
        ),
        case(
            json!({"event": "$pageview", "distinct_id": "u3", "properties": {
            "$group_0": "old", "$groups": {"company": "acme", "project": 7, "bad": {}, "team": ""}, "z": 1}}),
        ),
        case(
            json!({"event": "$pageview", "distinct_id": "u3", "properties": {"$groups": "not an object"}}),
        ),
        case(
            json!({"event": "$pageview", "distinct_id": "u4", "properties": {"$geoip_disable": true, "$set": {"a": 1}}}),
        ),
        case(
            json!({"event": "$pageview", "distinct_id": "u4", "properties": {"$geoip_disable": "true"}}),
        ),
        // The client's own values win.
        case(
            json!({"event": "$pageview", "distinct_id": "u5", "properties": {
            "$geoip_city_name": "Mine", "$set": {"$geoip_country_code": "XX"},
            "$set_once": {"$initial_geoip_city_name": "First"}}}),
        ),
        case(
            json!({"event": "$pageview", "distinct_id": "u5", "properties": {"$set": "not an object", "$set_once": [1]}}),
        ),
        case(
            json!({"event": "$pageview", "distinct_id": "u5", "properties": {
            "$set": {"x": "\"$geoip_city_name", "$geoip_latitude": 1}, "$set_once": {}}}),
        ),
        case(
            json!({"event": "$pageview", "distinct_id": "u5", "properties": {
            "$set": {"plan": "paid"}, "$set_once": {"plan": "first", "y": "$initial_geoip_"}}}),
        ),
        case(json!({"event": "$pageview", "distinct_id": "u6"})),
        case(
            json!({"event": "$pageview", "distinct_id": "u6", "properties": "not an object", "$set": {"a": 1}}),
        ),
        case(
            json!({"event": "$pageview", "distinct_id": "u7", "properties": {
            "$process_person_profile": false, "$set": {"a": 1}}}),
        ),
        case(
            json!({"event": "$pageview", "distinct_id": "u8", "properties": {"$ip": "10.0.0.1", "a": 1}}),
        ),
        case(
            json!({"event": "$pageview", "distinct_id": "u8", "properties": {"\n": "\\", "$ip\"": 1}}),
        ),
    ];
    // The same operations again, after others, and ones that undo each other: an event
    // repeating the operations just applied to its person is skipped, and must store
    // the same.
    let a = json!({"event": "e", "distinct_id": "u10", "properties": {"$set": {"a": 1, "b": 2}}});
    let b = json!({"event": "e", "distinct_id": "u10", "properties": {"$set": {"b": 3}}});
    let both = json!({"event": "e", "distinct_id": "u10", "$set": {"a": 2},
        "properties": {"$set": {"a": 1}}});
    let undo = json!({"event": "e", "distinct_id": "u10",
        "properties": {"$set": {"k": 1}, "$unset": ["a", "k"]}});
    for event in [
        &a, &a, &b, &a, &a, &both, &both, &a, &undo, &undo, &a, &undo,
    ] {
        cases.push(case(event.clone()));
    }
    let geo_variants = cases.len();
    for i in 0..geo_variants {
        for (geo, anonymize, ip) in [
            (Some(1), false, true),
            (None, false, true),
            (Some(2), false, false),
            (Some(0), true, true),
            (Some(3), false, true),
        ] {
            cases.push(Case {
                data: cases[i].data.clone(),
                ip: ip.then(|| "2001:db8::1".parse().unwrap()),
                anonymize,
                geo,
            });
        }
    }
    // $ip in the middle, removed when anonymising: the last member takes its place.
    cases.push(Case {
        anonymize: true,
        ..case(json!({"event": "e", "distinct_id": "u9", "properties": {"a": 1, "$ip": "1.2.3.4", "b": 2, "c": 3}}))
    });
    cases
}

#[test]
fn text_path_stores_what_the_round_trip_stores() {
    let cases = corpus();
    for c in &cases {
        assert!(raw::Event::parse(&c.data).is_some(), "takes the text path");
    }
    assert_same(&cases);
}

#[test]
fn other_json_takes_the_round_trip() {
    let odd: [&[u8]; 8] = [
        br#"{ "event": "e", "distinct_id": "u", "properties": {"a": 1} }"#,
        br#"{"event":"e","distinct_id":"u","properties":{"a":"\/"}}"#,
        br#"{"event":"e","distinct_id":"u","properties":{"a":1,"a":2,"$set":{"x":1}}}"#,
        br#"{"event":"e","distinct_id":"u","properties":{"a":1E2,"b":-0,"c":123456789012345678901234}}"#,
        br#"{"event":"e","distinct_id":"u","properties":{"$set":{"x":1,"x":2}}}"#,
        br#"[{"event":"e"}]"#,
        br#"{"event":"e","distinct_id":"u","properties":{"a":1}"#,
        b"{\"event\":\"e\",\"properties\":{\"a\":\"\xff\"}}",
    ];
    let cases: Vec<Case> = odd
        .iter()
        .map(|d| Case {
            data: d.to_vec(),
            ..case(json!({}))
        })
        .collect();
    for c in &cases {
        assert!(raw::Event::parse(&c.data).is_none());
    }
    assert_same(&cases);
}

/// A small deterministic generator of events made of the keys and shapes the
/// compactor reads, to compare the two paths beyond the hand-written corpus (and, in
/// the compactor's tests, the memo against no memo).
pub(in crate::compactor) struct Gen(pub u64);

impl Gen {
    pub fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    fn key(&mut self) -> String {
        const KEYS: [&str; 18] = [
            "$set",
            "$set_once",
            "$unset",
            "$ip",
            "$groups",
            "$geoip_city_name",
            "$geoip_disable",
            "$process_person_profile",
            "$anon_distinct_id",
            "alias",
            "a",
            "b",
            "$group_0",
            "$initial_geoip_city_name",
            "é\"",
            "$group_key",
            "$group_type",
            "$group_set",
        ];
        KEYS[self.next(18) as usize].to_string()
    }

    fn value(&mut self, depth: u32) -> Value {
        match self.next(if depth > 2 { 6 } else { 8 }) {
            0 => Value::Null,
            1 => json!(self.next(2) == 0),
            2 => json!(self.next(1000) as i64 - 500),
            3 => json!(self.next(1000) as f64 / 7.0),
            4 | 5 => json!(["x", "u1", "acme", "", "a"][self.next(5) as usize]),
            6 => Value::Array((0..self.next(3)).map(|_| self.value(depth + 1)).collect()),
            _ => Value::Object(
                (0..self.next(5))
                    .map(|_| (self.key(), self.value(depth + 1)))
                    .collect(),
            ),
        }
    }
}

#[test]
fn generated_events_store_the_same() {
    let mut g = Gen(0x2545_f491_4f6c_dd1d);
    let names = [
        "$pageview",
        "$identify",
        "$create_alias",
        "$groupidentify",
        "e",
    ];
    let cases: Vec<Case> = (0..400)
        .map(|_| {
            let mut event = serde_json::Map::new();
            event.insert("event".into(), json!(names[g.next(5) as usize]));
            event.insert("distinct_id".into(), json!(format!("u{}", g.next(6))));
            if g.next(5) > 0 {
                event.insert("properties".into(), g.value(0));
            }
            for _ in 0..g.next(3) {
                event.insert(g.key(), g.value(1));
            }
            Case {
                data: serde_json::to_vec(&event).unwrap(),
                ip: (g.next(4) > 0).then(|| "81.2.69.160".parse().unwrap()),
                anonymize: g.next(4) == 0,
                geo: [None, Some(0), Some(1), Some(2), Some(3)][g.next(5) as usize],
            }
        })
        .collect();
    assert_same(&cases);
}

/// An event of a known person that changes none of its properties writes nothing but
/// its event: the person is neither re-encoded nor written.
#[test]
fn unchanged_persons_are_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let t = Trees::open(&db, dir.path()).unwrap();
    let g = geo(0, Some("81.2.69.160".parse().unwrap()));
    let chunk = |events: &[Value]| {
        in_chunk(&t, |tx, cache| {
            for (i, event) in events.iter().enumerate() {
                let r = record_of(i, &case(event.clone()));
                record(
                    tx,
                    cache,
                    &r,
                    ProjectSettings::default(),
                    Some(&g),
                    &mut Vec::new(),
                )?;
            }
            Ok(cache.changed())
        })
    };
    let set =
        json!({"event": "$pageview", "distinct_id": "u", "properties": {"$set": {"plan": "pro"}}});
    assert_eq!(chunk(std::slice::from_ref(&set)), 1, "a new person");
    let pageview =
        json!({"event": "$pageview", "distinct_id": "u", "properties": {"$current_url": "/"}});
    assert_eq!(chunk(&[pageview.clone(), set, pageview]), 0);
    let change =
        json!({"event": "$pageview", "distinct_id": "u", "properties": {"$set": {"plan": "free"}}});
    assert_eq!(chunk(&[change]), 1);
}
