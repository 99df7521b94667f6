//! What is stored for an event: groups, IP handling, GeoIP enrichment, blocks, and
//! retention deleting whole blocks by their newest event.

use super::*;

#[test]
fn group_rules() {
    let mut f = fixture(Compaction::default());
    let mut records = vec![record(
        1,
        0,
        json!({"event": "e", "distinct_id": "d", "properties": {"$groups": {"org": "o1"}}}),
    )];
    for (i, kind) in ["t0", "t1", "t2", "t3", "t4", "t5"].iter().enumerate() {
        let e = json!({"event": "$groupidentify", "distinct_id": "d",
                       "properties": {"$group_type": kind, "$group_key": 7, "$group_set": {"i": i}}});
        records.push(record(1, 1 + i as i64, e));
    }
    f.push(&records);
    f.drain();
    // $groups named a type but created no group.
    assert_eq!(query::group(&f.trees, 1, 0, "o1").unwrap(), None);
    let types = query::group_types(&f.trees, 1).unwrap();
    let names: Vec<&str> = types.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["org", "t0", "t1", "t2", "t3"], "five types at most");
    let g = query::group(&f.trees, 1, 1, "7").unwrap().unwrap();
    assert_eq!(g.properties["i"], 0);
    assert_eq!(query::group_type_index(&f.trees, 1, "t4").unwrap(), None);
}

#[test]
fn anonymized_projects_lose_ip() {
    let mut f = fixture(Compaction::default());
    f.push(&[record(
        2,
        0,
        json!({"event": "e", "distinct_id": "d", "properties": {"$ip": "1.2.3.4"}}),
    )]);
    f.drain();
    assert!(!f.events(2)[0].properties.contains_key("$ip"));
}

#[test]
fn retention_deletes_old_events_only() {
    let mut f = fixture(Compaction {
        retention_days: 1,
        ..Compaction::default()
    });
    let old = Record {
        timestamp: NOW - 2 * DAY_MS,
        ..record(1, 0, json!({"event": "old", "distinct_id": "d"}))
    };
    let new = record(1, 1, json!({"event": "new", "distinct_id": "d"}));
    let other = Record {
        timestamp: NOW - 3 * DAY_MS,
        ..record(2, 2, json!({"event": "old2", "distinct_id": "d"}))
    };
    f.push(&[old, new, other]);
    f.drain();
    assert_eq!(f.compactor.enforce_retention(NOW).unwrap(), 2);
    let names: Vec<String> = f.events(1).into_iter().map(|e| e.event).collect();
    assert_eq!(names, ["new"]);
    assert!(f.events(2).is_empty());
    assert_eq!(f.trees.events.len(), 1, "one block left");
}

#[test]
fn retention_deletes_whole_blocks_by_their_newest_event() {
    let mut f = fixture(Compaction {
        retention_days: 1,
        ..Compaction::default()
    });
    let minute = 60_000;
    let at = |i: i64, ts: i64| Record {
        timestamp: ts,
        ..record(1, i, json!({"event": format!("e{i}"), "distinct_id": "d"}))
    };
    // One chunk, one block, entirely before the cutoff (NOW).
    f.push(&[at(0, NOW - 40 * minute), at(1, NOW - 10 * minute)]);
    f.drain();
    // One block straddling the cutoff: kept whole.
    f.push(&[at(2, NOW - 20 * minute), at(3, NOW + 20 * minute)]);
    f.drain();
    assert_eq!(f.trees.events.len(), 2);
    assert_eq!(f.compactor.enforce_retention(NOW + DAY_MS).unwrap(), 2);
    let names: Vec<String> = f.events(1).into_iter().map(|e| e.event).collect();
    assert_eq!(names, ["e3", "e2"]);
    assert_eq!(f.compactor.enforce_retention(NOW + DAY_MS).unwrap(), 0);
}

#[test]
fn a_chunk_becomes_blocks_in_one_key_each() {
    let mut f = fixture(Compaction::default());
    let records: Vec<Record> = (0..300)
        .map(|i| {
            record(
                1,
                i,
                json!({"event": "e", "distinct_id": format!("d{}", i % 7)}),
            )
        })
        .collect();
    f.push(&records);
    f.drain();
    // Small events: cut only by count.
    assert_eq!(f.trees.events.len(), 2, "300 events, two blocks");
    assert_eq!(f.events(1).len(), 300);
    assert_eq!(
        f.trees.meta.get(NEXT_BLOCK_KEY).unwrap().unwrap().as_ref(),
        &2u64.to_be_bytes()
    );
}

#[test]
fn geoip_enriches_events_and_persons() {
    let mut f = fixture(Compaction::default());
    let london = Record {
        ip: Some("81.2.69.160".parse().unwrap()),
        ..record(
            1,
            0,
            json!({"event": "e", "distinct_id": "d", "properties": {"$set": {"plan": "pro"}}}),
        )
    };
    let later = Record {
        ip: Some("2.125.160.216".parse().unwrap()),
        ..record(1, 1, json!({"event": "e", "distinct_id": "d"}))
    };
    let disabled = Record {
        ip: Some("2.125.160.216".parse().unwrap()),
        ..record(
            1,
            2,
            json!({"event": "off", "distinct_id": "d2", "properties": {"$geoip_disable": true}}),
        )
    };
    let private = Record {
        ip: Some("10.0.0.1".parse().unwrap()),
        ..record(1, 3, json!({"event": "lan", "distinct_id": "d3"}))
    };
    f.push(&[london, later, disabled, private]);
    f.drain();
    let events = f.events(1);
    let by = |name: &str, id: &str| {
        events
            .iter()
            .find(|e| e.event == name && e.distinct_id == id)
            .unwrap()
            .clone()
    };
    let first = by("e", "d");
    assert_eq!(
        first.properties["$geoip_city_name"], "Boxford",
        "newest first: the Boxford event"
    );
    assert_eq!(first.properties["$geoip_postal_code"], "OX1");
    let london = events
        .iter()
        .find(|e| e.properties.get("$geoip_city_name") == Some(&json!("London")))
        .unwrap();
    assert_eq!(london.properties["$geoip_country_code"], "GB");
    assert!(by("off", "d2")
        .properties
        .keys()
        .all(|k| !k.starts_with("$geoip_city")));
    assert!(by("lan", "d3")
        .properties
        .keys()
        .all(|k| !k.starts_with("$geoip")));
    // The person has the latest location with $set and the first with $set_once.
    let p = query::person_by_distinct_id(&f.trees, 1, "d")
        .unwrap()
        .unwrap();
    assert_eq!(p.properties["$geoip_city_name"], "Boxford");
    assert_eq!(p.properties["$initial_geoip_city_name"], "London");
    assert_eq!(p.properties["plan"], "pro");
    let p2 = query::person_by_distinct_id(&f.trees, 1, "d2")
        .unwrap()
        .unwrap();
    assert!(p2.properties.is_empty());
}

#[test]
fn a_chunk_counts_its_events_into_the_rollups_and_duplicates_do_not() {
    use crate::store::rollup;
    let mut f = fixture(Compaction {
        retention_days: 1,
        ..Compaction::default()
    });
    let hour = rollup::hour_of(NOW);
    let mut records: Vec<Record> = (0..200)
        .map(|i| {
            record(
                1,
                i,
                json!({"event": "e", "distinct_id": format!("d{}", i % 7)}),
            )
        })
        .collect();
    let call = json!({"event": "$feature_flag_called", "distinct_id": "d1",
                      "properties": {"$feature_flag": "f", "$feature_flag_response": "test"}});
    records.push(record(1, 300, call));
    let old = Record {
        timestamp: NOW - 3 * DAY_MS,
        ..record(1, 301, json!({"event": "e", "distinct_id": "d0"}))
    };
    records.push(old);
    f.push(&records);
    f.drain();
    // A retry of stored events is not counted again.
    f.push(&records[..50]);
    f.drain();
    let hours = rollup::events(&f.trees.rollups, 1, "e", i64::MIN, i64::MAX).unwrap();
    let counts: Vec<(i64, u64, u64)> = hours
        .iter()
        .map(|(h, n, s)| (*h, *n, s.estimate()))
        .collect();
    assert_eq!(
        counts,
        [(rollup::hour_of(NOW - 3 * DAY_MS), 1, 1), (hour, 200, 7)]
    );
    let exposures = rollup::exposures(&f.trees.rollups, 1, hour, hour + rollup::HOUR_MS);
    assert_eq!(
        exposures.unwrap()["f"],
        BTreeMap::from([("test".into(), 1)])
    );
    // Retention forgets the old hour with its events.
    f.compactor.enforce_retention(NOW).unwrap();
    let hours = rollup::events(&f.trees.rollups, 1, "e", i64::MIN, i64::MAX).unwrap();
    assert_eq!(
        hours.iter().map(|h| (h.0, h.1)).collect::<Vec<_>>(),
        [(hour, 200)]
    );
}

#[test]
fn rollups_held_in_memory_are_read_at_once_written_once_and_counted_again_after_a_crash() {
    use crate::store::rollup;
    let mut f = fixture(Compaction::default());
    let records: Vec<Record> = (0..300)
        .map(|i| {
            let event = json!({"event": "e", "distinct_id": format!("d{}", i % 7)});
            record(1, i, event)
        })
        .collect();
    let count = |trees: &Trees| -> (u64, u64) {
        let hours = rollup::events(&trees.rollups, 1, "e", i64::MIN, i64::MAX).unwrap();
        let n = hours.iter().map(|h| h.1).sum();
        let stored: u64 = trees
            .rollups
            .tree
            .iter()
            .map(|e| u64::from_le_bytes(e.unwrap().1[1..9].try_into().unwrap()))
            .sum();
        (n, stored)
    };
    f.push(&records[..100]);
    f.drain();
    // Counted at once, though only in memory so far; where they start is recorded.
    assert_eq!(count(&f.trees), (100, 0));
    let from = f.trees.meta.get(rollup::hot::FROM_KEY).unwrap();
    assert_eq!(from.as_deref(), Some(&0u64.to_be_bytes()[..]));
    // Written once, when due: in the tree, the marker gone.
    super::super::worker::write_rollups(&f.compactor, None);
    assert_eq!(count(&f.trees), (100, 100));
    assert!(f.trees.meta.get(rollup::hot::FROM_KEY).unwrap().is_none());
    f.push(&records[100..]);
    f.drain();
    assert_eq!(count(&f.trees), (300, 100));
    // A crash with 200 events counted only in memory (their blocks durable): the next
    // open counts them again from the stored blocks, once.
    f.db.flush().unwrap();
    let Fixture {
        _dir: dir,
        db,
        trees,
        compactor,
        log,
    } = f;
    drop((compactor, log, trees, db));
    let db = crate::store::reopen_for_tests(dir.path());
    let trees = Trees::open(&db, dir.path()).unwrap();
    assert_eq!(count(&trees), (300, 300));
    assert!(trees.meta.get(rollup::hot::FROM_KEY).unwrap().is_none());
    let hours = rollup::events(&trees.rollups, 1, "e", i64::MIN, i64::MAX).unwrap();
    assert_eq!(hours[0].2.estimate(), 7);
}
