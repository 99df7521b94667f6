//! Exactly once: every record applied once and in order, across failed transactions
//! at any record, retries, restarts, legacy log trees, recycled segments and corrupt
//! records; duplicates by uuid stored once.

use super::*;

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
        assert!(f.trees.persons.is_empty().unwrap() && f.trees.groups.is_empty());
        assert_eq!(f.log.shared().depth(), records.len().div_ceil(3) as u64);
    });
}

#[test]
fn a_transaction_sled_runs_again_counts_and_stores_its_events_once() {
    use crate::store::rollup;
    // Many parts of events handed to the block thread before the conflict, or none.
    let records: Vec<Record> = (0..40)
        .map(|i| {
            record(
                1,
                i,
                json!({"event": "e", "distinct_id": format!("d{}", i % 7)}),
            )
        })
        .collect();
    let counts = |f: &Fixture| {
        let hours = rollup::events(&f.trees.rollups, 1, "e", i64::MIN, i64::MAX).unwrap();
        let counts: Vec<(i64, u64, u64)> = hours
            .iter()
            .map(|(h, n, s)| (*h, *n, s.estimate()))
            .collect();
        counts
    };
    let mut clean = fixture(Compaction::default());
    clean.push(&records);
    clean.drain();
    assert_eq!(counts(&clean), [(rollup::hour_of(NOW), 40, 7)]);
    for conflict_at in [0, 1, 7, 20, 39] {
        let mut f = fixture(Compaction::default());
        f.push(&records);
        f.compactor.conflict_at = Some(conflict_at);
        f.drain();
        assert_eq!(f.compactor.conflict_at, None);
        assert_eq!(counts(&f), counts(&clean), "conflict at {conflict_at}");
        assert_eq!(f.state(1), clean.state(1), "conflict at {conflict_at}");
        assert_eq!(f.events(1).len(), 40);
    }
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
        assert!(f.trees.events.is_empty() && f.trees.persons.is_empty().unwrap());
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

/// The window reloads from the blocks its entries name: every uuid of chunks of two
/// projects is found after a restart, and an entry of the earlier format (the uuids
/// themselves) still loads beside them.
#[test]
fn a_restart_reloads_the_window_from_the_chunks_blocks() {
    let mut f = fixture(Compaction::default());
    let mut all = Vec::new();
    for chunk in 0..5i64 {
        let records: Vec<_> = (0..300)
            .map(|i| {
                let n = chunk * 300 + i;
                record(
                    1 + (n % 2) as u64,
                    n,
                    json!({"event": "e", "distinct_id": format!("d{n}")}),
                )
            })
            .collect();
        f.push(&records);
        f.drain();
        all.extend(records);
    }
    for entry in f.trees.recent_ids.iter() {
        let (_, value) = entry.unwrap();
        assert!(
            crate::store::dedup::decode_ranges(&value).is_some(),
            "an entry names blocks"
        );
    }
    let old = record(1, 99_999, json!({"event": "e", "distinct_id": "old"}));
    let legacy = crate::store::dedup::encode(&[(1, old.uuid.as_u128())]);
    let key = keys::recent(crate::support::clock::now_ms(), 1 << 40);
    f.trees.recent_ids.insert(key, legacy).unwrap();
    let stored = f.events(1).len() + f.events(2).len();
    assert_eq!(stored, 1500);
    f.restart();
    all.push(old);
    f.push(&all);
    f.drain();
    assert_eq!(f.events(1).len() + f.events(2).len(), 1500);
    assert_eq!(f.compactor.stats.duplicates.load(Ordering::Relaxed), 1501);
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
fn corrupt_records_are_quarantined_not_blocking() {
    let mut f = fixture(Compaction::default());
    f.log.push(b"garbage").unwrap();
    f.push(&[record(1, 0, json!({"event": "ok", "distinct_id": "d"}))]);
    f.drain();
    assert_eq!(f.events(1).len(), 1);
    assert_eq!(f.trees.quarantine.len(), 1);
}

/// Chunks of ten records from `from`, one distinct id each.
fn numbered(from: i64, n: i64) -> Vec<Record> {
    (from..from + n)
        .map(|i| record(1, i, json!({"event": "e", "distinct_id": format!("d{i}")})))
        .collect()
}

/// A window whose hash set is frozen into a segment at each chunk a tenth of a second
/// after the one before, so a test's chunks write the segments' files.
fn freezing() -> Fixture {
    fixture(Compaction {
        dedup_max_age_ms: 2_400,
        ..Compaction::default()
    })
}

/// A segment's file of the window damaged while the server runs: the chunk whose
/// lookup reads it fails (nothing of it stored), the window is loaded again from the
/// database at the next step, and every event is stored once.
#[test]
fn a_damaged_window_file_fails_the_chunk_and_the_window_is_loaded_again() {
    let mut f = freezing();
    let (a, b) = (numbered(0, 10), numbered(10, 10));
    f.push(&a);
    f.drain();
    std::thread::sleep(Duration::from_millis(150));
    f.push(&b);
    f.drain();
    let window = &f.compactor.state.as_ref().unwrap().window;
    assert!(window.damage_segments() > 0, "the first chunk was frozen");
    // A retry of one of the first chunk's events, and a new one.
    let new = numbered(20, 1);
    f.push(&[a[3].clone(), new[0].clone()]);
    let failed = f.compactor.step().unwrap_err();
    assert!(matches!(failed, Error::Dedup(_)), "{failed}");
    assert!(failed.to_string().contains("checksum"), "{failed}");
    assert_eq!(f.events(1).len(), 20, "nothing of the failed chunk stored");
    f.drain();
    assert_eq!(f.events(1).len(), 21);
    assert_eq!(f.compactor.stats.duplicates.load(Ordering::Relaxed), 1);
    let dir = f._dir.path().join(crate::store::dedup::DIR_NAME);
    assert_eq!(
        std::fs::read_dir(dir).unwrap().count(),
        0,
        "its files are unlinked"
    );
}

/// The window's files cannot be written (its directory replaced by a file, as a full
/// disk refuses them): the chunk whose commit froze a segment is stored and the window
/// dropped; loading it again fails until the files can be written, and no event is
/// lost or stored twice.
#[test]
fn a_window_file_that_cannot_be_written_loses_and_repeats_nothing() {
    let mut f = freezing();
    let (a, b, c) = (numbered(0, 10), numbered(10, 10), numbered(20, 1));
    f.push(&a);
    f.drain();
    let dir = f._dir.path().join(crate::store::dedup::DIR_NAME);
    std::fs::remove_dir(&dir).unwrap();
    std::fs::write(&dir, b"not a directory").unwrap();
    std::thread::sleep(Duration::from_millis(150));
    f.push(&b);
    f.compactor.step().unwrap();
    assert_eq!(f.events(1).len(), 20, "the chunk is committed");
    assert!(f.compactor.state.is_none(), "the window is dropped");
    f.push(&[a[0].clone(), b[0].clone(), c[0].clone()]);
    let failed = f.compactor.step().unwrap_err();
    assert!(matches!(failed, Error::Dedup(_)), "{failed}");
    assert_eq!(f.events(1).len(), 20);
    std::fs::remove_file(&dir).unwrap();
    f.drain();
    assert_eq!(f.events(1).len(), 21);
    assert_eq!(f.compactor.stats.duplicates.load(Ordering::Relaxed), 2);
}

#[test]
fn the_chunk_read_ahead_is_applied_next_and_read_again_after_a_failure() {
    // Three chunks of the log's files: the second is read while the first's blocks
    // are synced, then fails; it and what follows are read again, each once. The
    // first chunk's historical records are applied from their lane in the same step,
    // after the read ahead.
    let records: Vec<Record> = (0..2500)
        .map(|i| Record {
            historical: i < 5,
            ..record(
                1,
                i,
                json!({"event": "e", "distinct_id": format!("d{}", i % 50)}),
            )
        })
        .collect();
    let mut clean = fixture(Compaction::default());
    clean.push(&records);
    clean.drain();
    let expected = clean.state(1);

    let mut f = fixture(Compaction::default());
    f.push(&records);
    let report = f.compactor.step().unwrap();
    let first = report.realtime;
    assert!(first >= 1024 && first < records.len(), "{first}");
    assert_eq!(report.historical, 5);
    let ahead = f.compactor.ahead.as_ref().map_or(0, |c| c.items.len());
    assert!(ahead >= 1024, "the next chunk was read ahead: {ahead}");
    // What was read ahead still counts as waiting in the log.
    let ahead_from = f.compactor.ahead.as_ref().and_then(|c| c.first_seq);
    let log = f.log.shared();
    assert_eq!(Some(log.durable_end() - log.depth()), ahead_from);
    assert!(log.depth() > 300, "{}", log.depth());
    // The second chunk fails once every record is applied and the third is read.
    f.compactor.fail_at = Some((Source::Log, ahead));
    assert!(f.compactor.step().is_err());
    assert!(f.compactor.ahead.is_none(), "the third chunk is read again");
    assert_eq!(
        f.events(1).len(),
        first,
        "nothing of the failed chunk stored"
    );
    f.drain();
    assert!(f.log_empty());
    let events = f.events(1);
    assert_eq!(events.len(), records.len());
    let uuids: std::collections::HashSet<_> = events.iter().map(|e| e.uuid).collect();
    assert_eq!(uuids.len(), records.len());
    assert_eq!(f.state(1), expected);
}
