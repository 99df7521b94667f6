use std::collections::BTreeMap;

use serde_json::{json, Map, Value};
use uuid::Uuid;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use super::chunk::Source;
use super::retention::DAY_MS;
use super::*;
use crate::config::Compaction;
use crate::log::Record;
use crate::store::keys::{CHECKPOINT_KEY, NEXT_BLOCK_KEY};
use crate::store::query::{self, EventFilter};

const NOW: i64 = 1_700_000_000_000;

struct Fixture {
    _dir: tempfile::TempDir,
    /// For the log tree of earlier versions.
    db: sled::Db,
    trees: Trees,
    log: log::Appender,
    compactor: Compactor,
}

/// Small segments, so the tests cross segment boundaries.
const SEGMENT: u64 = 4096;

fn open_log(dir: &std::path::Path, checkpoint: Option<u64>) -> (log::Appender, log::Reader) {
    log::open_for_tests(&dir.join(log::DIR_NAME), 1, checkpoint, SEGMENT)
}

fn fixture(settings: Compaction) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let trees = Trees::open(&db).unwrap();
    let (log, reader) = open_log(dir.path(), None);
    let projects = Projects::parse(
        br#"{"projects":[{"id":1,"api_key":"phc_a"},{"id":2,"api_key":"phc_b","anonymize_ips":true}]}"#,
    )
    .unwrap();
    let test_db =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/GeoIP2-City-Test.mmdb");
    let geoip = Arc::new(crate::geoip::Database::open(&test_db).unwrap());
    let compactor = Compactor::new(
        trees.clone(),
        reader,
        Arc::new(ArcSwap::from_pointee(projects)),
        settings,
        geoip,
    );
    Fixture {
        _dir: dir,
        db,
        trees,
        log,
        compactor,
    }
}

fn record(project: u64, i: i64, event: Value) -> Record {
    let name = event["event"].as_str().unwrap().to_string();
    let distinct_id = event["distinct_id"].as_str().unwrap().to_string();
    Record {
        project,
        received_at: NOW + i,
        timestamp: NOW + i,
        sent_at: None,
        uuid: Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0000 + i as u128),
        historical: false,
        ip: Some("127.0.0.1".parse().unwrap()),
        event: name,
        distinct_id,
        data: serde_json::to_vec(&event).unwrap(),
    }
}

/// Log entries of up to three records each.
fn entries(records: &[Record]) -> impl Iterator<Item = Vec<u8>> + '_ {
    records.chunks(3).map(|group| {
        let encoded: Vec<Vec<u8>> = group.iter().map(Record::encode).collect();
        crate::log::record::encode_frame(encoded.iter().map(Vec::as_slice))
    })
}

impl Fixture {
    /// Append to the log as the writer does, up to three records per entry.
    fn push(&mut self, records: &[Record]) {
        for frame in entries(records) {
            self.log.push(&frame).unwrap();
        }
        self.log.commit().unwrap();
    }

    /// Append to the log tree that versions before the log's files wrote.
    fn push_legacy(&self, records: &[Record]) {
        for frame in entries(records) {
            let seq = self.db.generate_id().unwrap();
            self.trees.wal.insert(seq.to_be_bytes(), frame).unwrap();
        }
    }

    /// Nothing waits in the log, in its files or its tree.
    fn log_empty(&self) -> bool {
        self.trees.wal.is_empty() && self.log.shared().depth() == 0
    }

    /// A new log and compactor on the same database, as after a restart.
    fn restart(&mut self) {
        let checkpoint = self
            .trees
            .meta
            .get(CHECKPOINT_KEY)
            .unwrap()
            .and_then(|v| keys::seq(&v));
        let (log, reader) = open_log(self._dir.path(), checkpoint);
        self.log = log;
        let geoip = self.compactor.geoip.clone();
        let projects = self.compactor.projects.clone();
        self.compactor = Compactor::new(
            self.trees.clone(),
            reader,
            projects,
            Compaction::default(),
            geoip,
        );
    }

    fn drain(&mut self) {
        for _ in 0..1000 {
            if self.compactor.step().unwrap().is_idle() {
                return;
            }
        }
        panic!("compactor never went idle");
    }

    fn events(&self, project: u64) -> Vec<crate::store::StoredEvent> {
        query::events_page(&self.trees, project, EventFilter::default(), None, 100_000)
            .unwrap()
            .0
    }

    /// Everything a user can observe, in a comparable form.
    fn state(&self, project: u64) -> BTreeMap<String, Value> {
        let mut out = BTreeMap::new();
        for e in self.events(project) {
            let person = e
                .person_id
                .and_then(|id| query::person(&self.trees, project, id).unwrap());
            let mut ids = person
                .as_ref()
                .map(|p| p.distinct_ids.clone())
                .unwrap_or_default();
            ids.sort();
            out.insert(
                e.uuid.to_string(),
                json!({"event": e.event, "props": e.properties,
                       "person_ids": ids,
                       "person_props": person.map(|p| p.properties)}),
            );
        }
        for (_, name) in query::group_types(&self.trees, project).unwrap() {
            let index = query::group_type_index(&self.trees, project, &name)
                .unwrap()
                .unwrap();
            for g in query::groups_of_type(&self.trees, project, index, 1000).unwrap() {
                out.insert(
                    format!("group {name} {}", g.group_key),
                    Value::Object(g.properties),
                );
            }
        }
        out
    }
}

/// A small story touching every kind of write the compactor makes.
fn story() -> Vec<Record> {
    let events = [
        json!({"event": "$pageview", "distinct_id": "anon-1", "properties": {"$current_url": "https://x/", "$set_once": {"ref": "ad"}}}),
        json!({"event": "$identify", "distinct_id": "user-1", "properties": {"$anon_distinct_id": "anon-1", "$set": {"email": "u@x"}}}),
        json!({"event": "$pageview", "distinct_id": "anon-1", "properties": {"$groups": {"company": "acme"}}}),
        json!({"event": "$groupidentify", "distinct_id": "user-1", "properties": {"$group_type": "company", "$group_key": "acme", "$group_set": {"plan": "pro"}}}),
        json!({"event": "e", "distinct_id": "user-2", "$set": {"a": 1}}),
        json!({"event": "$create_alias", "distinct_id": "user-2", "properties": {"alias": "user-1"}}),
        json!({"event": "survey sent", "distinct_id": "user-2", "properties": {"$survey_id": "s1", "$survey_response": "yes"}}),
        json!({"event": "e", "distinct_id": "bot", "properties": {"$process_person_profile": false}}),
    ];
    events
        .into_iter()
        .enumerate()
        .map(|(i, e)| record(1, i as i64, e))
        .collect()
}

#[test]
fn applies_every_record_once_in_order() {
    let mut f = fixture(Compaction::default());
    f.push(&story());
    f.drain();
    assert!(f.log_empty());
    let events = f.events(1);
    assert_eq!(events.len(), 8);
    // Newest first.
    assert_eq!(events[0].event, "e");
    assert_eq!(events[0].person_id, None, "$process_person_profile: false");
    let persons = query::persons(&f.trees, 1, 100).unwrap();
    assert_eq!(persons.len(), 1, "anon-1, user-1 and user-2 are one person");
    let p = &persons[0];
    assert_eq!(
        Value::Object(p.properties.clone()),
        json!({"ref": "ad", "email": "u@x", "a": 1})
    );
    assert!(events
        .iter()
        .filter(|e| e.distinct_id != "bot")
        .all(|e| e.person_id == Some(p.id)));
    // Groups: $groups attached the type index, $groupidentify created the group.
    let attached = events
        .iter()
        .find(|e| e.properties.contains_key("$groups"))
        .unwrap();
    assert_eq!(attached.properties["$group_0"], "acme");
    let group = query::group(&f.trees, 1, 0, "acme").unwrap().unwrap();
    assert_eq!(Value::Object(group.properties), json!({"plan": "pro"}));
    assert_eq!(
        query::group_types(&f.trees, 1).unwrap(),
        [(0, "company".to_string())]
    );
    // Built-in events keep their properties, and $ip is added.
    let survey = events.iter().find(|e| e.event == "survey sent").unwrap();
    assert_eq!(survey.properties["$survey_response"], "yes");
    assert_eq!(survey.properties["$ip"], "127.0.0.1");
    // Top-level $set is kept with the event.
    let e = events
        .iter()
        .find(|e| e.distinct_id == "user-2" && e.event == "e")
        .unwrap();
    assert_eq!(e.properties["$set"], json!({"a": 1}));
    assert_eq!(
        f.trees.meta.get(CHECKPOINT_KEY).unwrap().map(|v| v.len()),
        Some(8),
        "checkpoint advanced"
    );
    assert_eq!(f.compactor.stats.applied.load(Ordering::Relaxed), 8);
}

/// Fail the transaction on `source` at every record position in turn, each on a fresh
/// database holding `records`: the step fails, `after_failure` checks what is visible,
/// and a retry empties the log and the lanes and reaches exactly the state of a run
/// without failures.
fn fail_at_every_record(
    records: &[Record],
    source: Source,
    after_failure: impl Fn(&Fixture, usize),
) {
    let mut clean = fixture(Compaction::default());
    clean.push(records);
    clean.drain();
    let expected = clean.state(1);
    for fail_at in 0..records.len() {
        let mut f = fixture(Compaction::default());
        f.push(records);
        f.compactor.fail_at = Some((source, fail_at));
        assert!(f.compactor.step().is_err(), "injected failure at {fail_at}");
        after_failure(&f, fail_at);
        f.drain();
        assert!(f.log_empty() && f.trees.historical.is_empty());
        assert!(f.trees.overflow.is_empty());
        assert_eq!(f.state(1), expected, "fail at {fail_at}");
    }
}

#[test]
fn a_failure_at_any_point_of_a_chunk_applies_nothing_and_a_retry_applies_all_once() {
    let records = story();
    fail_at_every_record(&records, Source::Log, |f, fail_at| {
        // Nothing of the failed chunk is visible, and the log still holds all of it.
        assert!(f.trees.events.is_empty(), "fail at {fail_at}");
        assert!(f.trees.persons.is_empty() && f.trees.groups.is_empty());
        assert_eq!(f.log.shared().depth(), records.len().div_ceil(3) as u64);
    });
}

#[test]
fn a_failure_in_a_lane_transaction_applies_nothing_of_it() {
    // Historical records move to their lane in the log's transaction and are applied
    // in the lane's: fail the second at every point.
    let records: Vec<Record> = story()
        .into_iter()
        .map(|r| Record {
            historical: true,
            ..r
        })
        .collect();
    fail_at_every_record(&records, Source::Historical, |f, _| {
        // The move to the lane committed; nothing of the lane's chunk did.
        assert!(f.log_empty());
        assert_eq!(f.trees.historical.len(), records.len());
        assert!(f.trees.events.is_empty() && f.trees.persons.is_empty());
    });
}

#[test]
fn a_retried_uuid_is_stored_once() {
    let mut f = fixture(Compaction::default());
    let r = record(1, 0, json!({"event": "e", "distinct_id": "d"}));
    f.push(&[r.clone(), r.clone()]);
    f.drain();
    f.push(&[r]);
    f.drain();
    assert_eq!(f.events(1).len(), 1);
    assert_eq!(f.compactor.stats.duplicates.load(Ordering::Relaxed), 2);
}

#[test]
fn spikes_go_to_overflow_and_are_never_dropped() {
    let mut f = fixture(Compaction {
        overflow_rate: 1.0,
        overflow_burst: 3.0,
        ..Compaction::default()
    });
    let mut records: Vec<Record> = (0..10)
        .map(|i| record(1, i, json!({"event": "spam", "distinct_id": "loud"})))
        .collect();
    records.push(record(
        1,
        10,
        json!({"event": "normal", "distinct_id": "quiet"}),
    ));
    f.push(&records);
    // The first step applies the burst and the quiet user's event, and parks the rest.
    let first = f.compactor.step().unwrap();
    assert_eq!(first.realtime, 11);
    assert_eq!(f.compactor.stats.to_overflow.load(Ordering::Relaxed), 7);
    f.drain();
    let events = f.events(1);
    assert_eq!(events.iter().filter(|e| e.event == "spam").count(), 10);
    assert_eq!(events.iter().filter(|e| e.event == "normal").count(), 1);
    assert!(f.trees.overflow.is_empty());
}

#[test]
fn historical_batches_use_their_own_lane_in_order() {
    let mut f = fixture(Compaction {
        overflow_rate: 1.0,
        overflow_burst: 1.0,
        ..Compaction::default()
    });
    let records: Vec<Record> = (0..20)
        .map(|i| {
            let set = json!({"event": "import", "distinct_id": "old-user", "$set": {"n": i}});
            Record {
                historical: true,
                ..record(1, i, set)
            }
        })
        .collect();
    f.push(&records);
    f.drain();
    // Never spike-routed despite a limit of one event, and applied in order: the
    // last $set wins.
    assert_eq!(f.compactor.stats.to_overflow.load(Ordering::Relaxed), 0);
    assert_eq!(f.compactor.stats.to_historical.load(Ordering::Relaxed), 20);
    let person = query::person_by_distinct_id(&f.trees, 1, "old-user")
        .unwrap()
        .unwrap();
    assert_eq!(person.properties["n"], 19);
    assert_eq!(f.events(1).len(), 20);
}

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
fn a_restart_keeps_deduplicating() {
    let mut f = fixture(Compaction::default());
    let r = record(1, 0, json!({"event": "e", "distinct_id": "d"}));
    f.push(std::slice::from_ref(&r));
    f.drain();
    // A new compactor on the same database, as after a restart, reloads the window.
    f.restart();
    let other = record(1, 1, json!({"event": "e", "distinct_id": "d"}));
    f.push(&[r, other]);
    f.drain();
    assert_eq!(f.events(1).len(), 2);
    assert_eq!(f.compactor.stats.duplicates.load(Ordering::Relaxed), 1);
    assert_eq!(
        f.trees.recent_ids.len(),
        2,
        "one entry per chunk that stored events"
    );
}

#[test]
fn the_same_uuid_in_two_projects_is_two_events() {
    let mut f = fixture(Compaction::default());
    let one = record(1, 0, json!({"event": "e", "distinct_id": "d"}));
    let two = Record {
        project: 2,
        ..one.clone()
    };
    f.push(&[one, two]);
    f.drain();
    assert_eq!(f.events(1).len(), 1);
    assert_eq!(f.events(2).len(), 1);
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
fn entries_left_in_the_log_tree_of_an_earlier_version_come_first() {
    let mut f = fixture(Compaction::default());
    let set = |i, value| {
        record(
            1,
            i,
            json!({"event": "e", "distinct_id": "d", "$set": {"a": value}}),
        )
    };
    f.push_legacy(&[set(0, 1), set(1, 2)]);
    f.push(&[set(2, 3)]);
    f.drain();
    assert!(f.log_empty());
    assert_eq!(f.events(1).len(), 3);
    let person = &query::persons(&f.trees, 1, 10).unwrap()[0];
    assert_eq!(person.properties["a"], 3, "the files' entry applied last");
}

#[test]
fn segments_are_recycled_once_applied_and_a_restart_resumes_after_the_checkpoint() {
    let mut f = fixture(Compaction::default());
    let records: Vec<Record> = (0..300)
        .map(|i| record(1, i, json!({"event": "e", "distinct_id": format!("d{i}")})))
        .collect();
    f.push(&records[..200]);
    let dir = f._dir.path().join(log::DIR_NAME);
    let segments = || {
        std::fs::read_dir(&dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension() == Some("log".as_ref()))
            .count()
    };
    let written = segments();
    assert!(written > 5, "{written} segments");
    f.drain();
    assert!(segments() <= 2, "{} segments left", segments());
    // Unapplied entries survive a restart; applied ones are not applied again.
    f.push(&records[200..]);
    f.restart();
    f.drain();
    assert_eq!(f.events(1).len(), 300);
    assert_eq!(f.compactor.stats.duplicates.load(Ordering::Relaxed), 0);
    assert!(f.log_empty());
}

#[test]
fn the_decide_cache_sees_every_committed_change_to_a_person() {
    let mut f = fixture(Compaction::default());
    let cache = Arc::new(PersonCache::new(crate::store::person_cache::DEFAULT_BYTES));
    f.compactor.person_cache = Some(cache.clone());
    let props = |f: &Fixture, d: &str| {
        cache
            .person(&f.trees, 1, d)
            .unwrap()
            .map(|p| Value::Object(p.properties.clone()))
    };
    let mut i = 0;
    let mut send = |f: &mut Fixture, event: Value| {
        i += 1;
        f.push(&[record(1, i, event)]);
        f.drain();
    };
    // Cached while unknown, then linked.
    assert_eq!(props(&f, "anon"), None);
    send(
        &mut f,
        json!({"event": "e", "distinct_id": "anon", "$set": {"a": 1}}),
    );
    assert_eq!(props(&f, "anon"), Some(json!({"a": 1})));
    // Changed in place.
    send(
        &mut f,
        json!({"event": "e", "distinct_id": "anon", "$set": {"a": 2}}),
    );
    assert_eq!(props(&f, "anon"), Some(json!({"a": 2})));
    // Another person, cached, then merged into by $identify: both ids see the merge.
    send(
        &mut f,
        json!({"event": "e", "distinct_id": "user", "$set": {"b": 1}}),
    );
    assert_eq!(props(&f, "user"), Some(json!({"b": 1})));
    send(
        &mut f,
        json!({"event": "$identify", "distinct_id": "user",
               "properties": {"$anon_distinct_id": "anon"}}),
    );
    let merged = props(&f, "user");
    assert_eq!(merged, props(&f, "anon"));
    assert_eq!(merged, Some(json!({"a": 2, "b": 1})));
    // What the cache serves is what sled holds.
    let stored = query::person_by_distinct_id(&f.trees, 1, "anon")
        .unwrap()
        .unwrap();
    assert_eq!(Some(Value::Object(stored.properties)), merged);
}

#[test]
fn the_decide_cache_sees_every_committed_change_to_a_group() {
    let mut f = fixture(Compaction::default());
    let cache = Arc::new(PersonCache::new(crate::store::person_cache::DEFAULT_BYTES));
    f.compactor.person_cache = Some(cache.clone());
    let props = |f: &Fixture, kind: &str, key: &str| {
        cache
            .group(&f.trees, 1, kind, key)
            .unwrap()
            .map(|p| Value::Object(Map::clone(&p)))
    };
    let mut i = 0;
    let mut send = |f: &mut Fixture, event: Value| {
        i += 1;
        f.push(&[record(1, i, event)]);
        f.drain();
    };
    let identify = |kind: &str, key: &str, set: Value| {
        json!({"event": "$groupidentify", "distinct_id": "u",
               "properties": {"$group_type": kind, "$group_key": key, "$group_set": set}})
    };
    // Both unknown, and cached so; an event naming the type gives it an index but
    // creates no group.
    assert_eq!(props(&f, "org", "o1"), None);
    send(
        &mut f,
        json!({"event": "e", "distinct_id": "u", "properties": {"$groups": {"org": "o1"}}}),
    );
    assert_eq!(props(&f, "org", "o1"), None);
    // Created, then changed.
    send(&mut f, identify("org", "o1", json!({"tier": "gold"})));
    assert_eq!(props(&f, "org", "o1"), Some(json!({"tier": "gold"})));
    send(&mut f, identify("org", "o1", json!({"seats": 5})));
    assert_eq!(
        props(&f, "org", "o1"),
        Some(json!({"tier": "gold", "seats": 5}))
    );
    // A type first named by `$groupidentify`, after a cached miss.
    assert_eq!(props(&f, "company", "c"), None);
    send(&mut f, identify("company", "c", json!({"size": 9})));
    assert_eq!(props(&f, "company", "c"), Some(json!({"size": 9})));
    // What the cache serves is what sled holds.
    let index = query::group_type_index(&f.trees, 1, "org")
        .unwrap()
        .unwrap();
    let stored = query::group(&f.trees, 1, index, "o1").unwrap().unwrap();
    assert_eq!(
        Some(Value::Object(stored.properties)),
        props(&f, "org", "o1")
    );
}

/// One chunk per event, so the memo carries each chunk's persons into the next: an
/// event it answers for must change nothing, and a person changed through another of
/// its distinct ids, by a merge, or by an event that takes the round trip must not be
/// answered for.
#[test]
fn the_memo_across_chunks_never_skips_an_event_that_changes_a_person() {
    let mut f = fixture(Compaction::default());
    let mut i = 0;
    let mut send = |f: &mut Fixture, event: Value, pretty: bool| {
        i += 1;
        let mut r = record(1, i, event.clone());
        if pretty {
            // Not as serde_json writes it: the compactor parses it whole.
            r.data = serde_json::to_vec_pretty(&event).unwrap();
        }
        f.push(&[r]);
        f.drain();
        let by_anon = query::person_by_distinct_id(&f.trees, 1, "anon").unwrap();
        by_anon.map(|p| (p.id, Value::Object(p.properties)))
    };
    let set = |id: &str, props: Value| json!({"event": "e", "distinct_id": id, "$set": props});

    send(&mut f, set("anon", json!({"x": 1})), false);
    let (first, props) = send(&mut f, set("anon", json!({"x": 1})), false).unwrap();
    assert_eq!(props, json!({"x": 1}));
    assert_eq!(f.compactor.memo.person_of(1, "anon"), Some(first));

    // Changed through another distinct id of the same person.
    send(
        &mut f,
        json!({"event": "$identify", "distinct_id": "user",
               "properties": {"$anon_distinct_id": "anon"}}),
        false,
    );
    send(&mut f, set("user", json!({"x": 2})), false);
    let (_, props) = send(&mut f, set("anon", json!({"x": 1})), false).unwrap();
    assert_eq!(props, json!({"x": 1}), "anon's $set after user's");

    // Changed by an event that takes the round trip.
    send(&mut f, set("user", json!({"x": 3})), true);
    let (_, props) = send(&mut f, set("anon", json!({"x": 1})), false).unwrap();
    assert_eq!(props, json!({"x": 1}), "anon's $set after a round trip");

    // The same, both in one chunk: the round trip changes the person the memo knows.
    let mut round_trip = record(1, 100, set("user", json!({"x": 4})));
    round_trip.data = serde_json::to_vec_pretty(&set("user", json!({"x": 4}))).unwrap();
    f.push(&[round_trip, record(1, 101, set("anon", json!({"x": 1})))]);
    f.drain();
    let person = query::person_by_distinct_id(&f.trees, 1, "anon").unwrap();
    assert_eq!(
        person.map(|p| Value::Object(p.properties)),
        Some(json!({"x": 1})),
        "anon's $set after a round trip in the same chunk"
    );

    // Merged into another person: anon's events now belong to the survivor.
    send(&mut f, set("other", json!({"y": 1})), false);
    send(
        &mut f,
        json!({"event": "$create_alias", "distinct_id": "anon",
               "properties": {"alias": "other"}}),
        false,
    );
    let survivor = query::person_by_distinct_id(&f.trees, 1, "other")
        .unwrap()
        .unwrap()
        .id;
    let (now, props) = send(&mut f, set("anon", json!({"x": 1})), false).unwrap();
    assert_eq!(now, survivor);
    assert_eq!(props, json!({"x": 1, "y": 1}));
    let last = f.events(1)[0].clone();
    assert_eq!(
        (last.distinct_id.as_str(), last.person_id),
        ("anon", Some(survivor))
    );
    assert_eq!(f.compactor.memo.person_of(1, "anon"), Some(survivor));
}

#[test]
fn corrupt_records_are_quarantined_not_blocking() {
    let mut f = fixture(Compaction::default());
    f.log.push(b"garbage").unwrap();
    f.push(&[record(1, 0, json!({"event": "ok", "distinct_id": "d"}))]);
    f.drain();
    assert_eq!(f.events(1).len(), 1);
    assert_eq!(f.trees.quarantine.len(), 1);
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
fn the_thread_reports_a_failing_step_and_recovers() {
    let mut f = fixture(Compaction::default());
    f.push(&story());
    f.compactor.fail_at = Some((Source::Log, 0));
    let stats = f.compactor.stats();
    let Fixture {
        compactor,
        log,
        _dir,
        ..
    } = f;
    let handle = spawn(compactor).unwrap();
    // The failed step marks it unhealthy (the server then refuses new events) ...
    let deadline = Instant::now() + Duration::from_secs(5);
    while stats.healthy.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "never reported unhealthy");
        std::thread::sleep(Duration::from_millis(1));
    }
    // ... and the retry after the back-off applies everything and clears it.
    while !(stats.healthy.load(Ordering::SeqCst) && log.shared().depth() == 0) {
        assert!(Instant::now() < deadline, "never recovered");
        std::thread::sleep(Duration::from_millis(5));
    }
    handle.stop();
    assert_eq!(stats.applied.load(Ordering::Relaxed), 8);
}

/// The memo against no memo: random streams of linking, merging and person-changing
/// events over six distinct ids, some taking the round trip, the historical lane or
/// the overflow lane, some with GeoIP, one chunk per round, through two compactors
/// alike but for the memo (on some seeds a memo of one to four ids, so it is emptied
/// all the time). Everything stored must be the same.
#[test]
fn the_memo_changes_nothing_that_is_stored() {
    let ids = ["a", "b", "c", "d", "e", "f"];
    let mut hits = 0;
    for seed in 1..=200u64 {
        let mut g =
            crate::compactor::apply::tests::Gen(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let settings = Compaction {
            overflow_burst: 3.0,
            overflow_rate: 1.0,
            ..Compaction::default()
        };
        let mut with = fixture(settings.clone());
        let mut without = fixture(settings);
        without.compactor.memo_off = true;
        if seed % 3 == 0 {
            with.compactor.memo = Memo::with_capacity(1 + g.next(4) as usize);
        }
        let mut i = 0i64;
        for _round in 0..12 {
            let mut chunk = Vec::new();
            for _ in 0..1 + g.next(5) {
                i += 1;
                let id = ids[g.next(6) as usize];
                let other = ids[g.next(6) as usize];
                let mut props = serde_json::Map::new();
                let name = match g.next(16) {
                    0 => {
                        props.insert("$anon_distinct_id".into(), json!(other));
                        "$identify"
                    }
                    1 => {
                        props.insert("alias".into(), json!(other));
                        "$create_alias"
                    }
                    2 => {
                        props.insert("alias".into(), json!(other));
                        "$merge_dangerously"
                    }
                    _ => "e",
                };
                let mut event = json!({"event": name, "distinct_id": id});
                let value = json!(g.next(2));
                match g.next(8) {
                    0 => drop(props.insert("$set".into(), json!({"x": value}))),
                    1 => drop(props.insert("$set_once".into(), json!({"y": value}))),
                    2 => drop(props.insert("$unset".into(), json!(["x"]))),
                    3 => event["$set"] = json!({"x": value}),
                    _ => {}
                }
                if g.next(10) == 0 {
                    props.insert("$process_person_profile".into(), json!(false));
                }
                if g.next(8) == 0 {
                    props.insert("$geoip_disable".into(), json!(true));
                }
                event["properties"] = Value::Object(props);
                let mut r = record(1, i, event.clone());
                if g.next(3) == 0 {
                    r.data = serde_json::to_vec_pretty(&event).unwrap();
                }
                r.historical = g.next(6) == 0;
                if g.next(2) == 0 {
                    r.ip = Some("81.2.69.160".parse().unwrap());
                }
                if g.next(4) == 0 {
                    r.timestamp -= 1_000_000;
                }
                chunk.push(r);
            }
            for f in [&mut with, &mut without] {
                f.push(&chunk);
                f.drain();
            }
        }
        assert_eq!(with.state(1), without.state(1), "seed {seed}");
        for id in ids {
            let person = |f: &Fixture| {
                query::person_by_distinct_id(&f.trees, 1, id)
                    .unwrap()
                    .map(|p| {
                        let mut ids = p.distinct_ids;
                        ids.sort();
                        let props = Value::Object(p.properties);
                        (
                            ids,
                            props,
                            p.is_identified,
                            p.created_at,
                            p.first_distinct_id,
                        )
                    })
            };
            assert_eq!(person(&with), person(&without), "seed {seed}, id {id}");
        }
        hits += with.compactor.memo.hits.get();
        assert_eq!(without.compactor.memo.hits.get(), 0);
    }
    assert!(hits > 100, "the memo answered for {hits} events only");
}
