//! Events through the event index: exactly what a scan of every block finds and what
//! was stored, for distinct ids, for persons whose distinct ids were merged, for event
//! names and for both at once, with time filters, across many blocks, folds and merges
//! of the index's runs, retention, a restart that lost the recent part, an index built
//! for a database stored without one (or with one of an older format), and a restart
//! in the middle of that build.

use std::collections::BTreeSet;

use super::*;
use crate::store::event_index::{self, Step};

const HOUR: i64 = 3_600_000;
const PEOPLE: usize = 12;

/// Events of `PEOPLE` persons, each with an anonymous id, a user id and an alias,
/// scattered over `hours` before `NOW` in sending order, so each chunk makes many
/// blocks; `$identify` and `$create_alias` among them, so persons merge.
fn story(events: usize, hours: i64) -> Vec<Record> {
    let mut out = Vec::new();
    for n in 0..events {
        let k = n % PEOPLE;
        let who = match n / PEOPLE % 3 {
            0 => format!("anon-{k}"),
            1 => format!("user-{k}"),
            _ => format!("alias-{k}"),
        };
        let ts = NOW - (n as i64 * 7_919 % hours) * HOUR - n as i64;
        let event = match n {
            _ if n == events / 3 + k => {
                json!({"event": "$identify", "distinct_id": format!("user-{k}"),
                "properties": {"$anon_distinct_id": format!("anon-{k}")}})
            }
            _ if n == 2 * events / 3 + k => {
                json!({"event": "$create_alias", "distinct_id": format!("user-{k}"),
                "properties": {"alias": format!("alias-{k}")}})
            }
            _ => {
                json!({"event": format!("e{}", n % 3), "distinct_id": who, "properties": {"n": n}})
            }
        };
        out.push(Record {
            timestamp: ts,
            ..record(1, n as i64, event)
        });
    }
    out
}

/// Every page of `filter`, 7 at a time; the events' uuids, and whether the index
/// answered.
fn paged(trees: &Trees, filter: &EventFilter) -> (Vec<Uuid>, bool) {
    let through = query::events(trees, 1, filter.clone(), None).through_index();
    let mut out = Vec::new();
    let mut cursor: Option<[u8; 32]> = None;
    loop {
        let c = cursor.as_ref().map(|c| &c[..]);
        let (page, next) = query::events_page(trees, 1, filter.clone(), c, 7).unwrap();
        out.extend(page.iter().map(|e| e.uuid));
        match next {
            Some(c) => cursor = Some(c),
            None => return (out, through),
        }
    }
}

/// The same read with the index set aside: the scan of every block.
fn scanned(trees: &Trees, dir: &std::path::Path, filter: &EventFilter) -> Vec<Uuid> {
    let mut without = trees.clone();
    without.event_index = event_index::Index::unopened(dir);
    let (out, through) = paged(&without, filter);
    assert!(!through);
    out
}

/// The filters a person page and the read API make: by distinct id, by person, by
/// name, and those with one another and with time filters.
fn filters(trees: &Trees) -> Vec<EventFilter> {
    let mut out = Vec::new();
    for name in ["e1", "$identify", "$create_alias", "none has it"] {
        let named = EventFilter {
            event: Some(name.into()),
            ..EventFilter::default()
        };
        out.push(named.clone());
        out.push(EventFilter {
            after: Some(NOW - 150 * HOUR),
            before: Some(NOW - 30 * HOUR + 17),
            ..named.clone()
        });
        out.push(EventFilter {
            distinct_id: Some("user-4".into()),
            ..named.clone()
        });
    }
    for k in [0, 5, 11] {
        for who in ["anon", "user", "alias"] {
            out.push(EventFilter {
                distinct_id: Some(format!("{who}-{k}")),
                ..EventFilter::default()
            });
        }
        let person = query::person_id_of(trees, 1, &format!("anon-{k}")).unwrap();
        assert!(person.is_some());
        out.push(EventFilter {
            person_id: person,
            ..EventFilter::default()
        });
        out.push(EventFilter {
            person_id: person,
            after: Some(NOW - 100 * HOUR),
            before: Some(NOW - 20 * HOUR),
            event: Some("e1".into()),
            ..EventFilter::default()
        });
        out.push(EventFilter {
            person_id: person,
            distinct_id: Some(format!("user-{k}")),
            ..EventFilter::default()
        });
        out.push(EventFilter {
            person_id: person,
            event: Some("e2".into()),
            ..EventFilter::default()
        });
    }
    out.push(EventFilter {
        distinct_id: Some("nobody".into()),
        ..EventFilter::default()
    });
    out.push(EventFilter {
        person_id: Some(Uuid::from_u128(7)),
        ..EventFilter::default()
    });
    out
}

/// What each filter must find, from every event stored.
fn expected(f: &Fixture, filter: &EventFilter) -> Vec<Uuid> {
    let who: Option<BTreeSet<String>> = filter.person_id.map(|id| {
        query::person(&f.trees, 1, id)
            .unwrap()
            .map(|p| p.distinct_ids.into_iter().collect())
            .unwrap_or_default()
    });
    let mut all = f.events(1);
    all.retain(|e| {
        filter.after.is_none_or(|t| e.timestamp >= t)
            && filter.before.is_none_or(|t| e.timestamp < t)
            && filter.event.as_deref().is_none_or(|n| e.event == n)
            && filter
                .distinct_id
                .as_deref()
                .is_none_or(|d| e.distinct_id == d)
            && who.as_ref().is_none_or(|w| w.contains(&e.distinct_id))
    });
    all.into_iter().map(|e| e.uuid).collect()
}

/// Every filter: the index answers, with exactly the scan's events and the stored.
fn check_answers(f: &Fixture, trees: &Trees) -> usize {
    let mut found = 0;
    for filter in filters(trees) {
        let (through_index, indexed) = paged(trees, &filter);
        assert!(indexed, "{filter:?} read through the index");
        assert_eq!(
            through_index,
            scanned(trees, f._dir.path(), &filter),
            "{filter:?}"
        );
        assert_eq!(through_index, expected(f, &filter), "{filter:?}");
        found += through_index.len();
    }
    found
}

/// Run the index's worker until it has nothing to do; how many passes wrote.
fn settle(trees: &Trees) -> usize {
    let mut wrote = 0;
    loop {
        match trees.event_index.step(trees).unwrap() {
            Step::Idle => return wrote,
            _ => wrote += 1,
        }
    }
}

/// The blocks stored, as the index names them.
fn stored_blocks(trees: &Trees) -> BTreeSet<u64> {
    trees
        .events
        .iter()
        .keys()
        .map(|k| keys::block_id(&k.unwrap()).unwrap())
        .collect()
}

#[test]
fn a_persons_events_through_the_index_equal_the_scan_across_folds_and_merges() {
    let mut f = fixture(Compaction::default());
    let records = story(3_000, 400);
    for part in records.chunks(250) {
        f.push(part);
        f.drain();
        settle(&f.trees);
    }
    let blocks = f.trees.events.len();
    assert!(blocks > 500, "{blocks} blocks");
    let status = f.trees.event_index.status();
    assert!(status.complete);
    // Folded many times, merged down to a few runs; the rest still in memory.
    assert!(status.runs <= event_index::MAX_RUNS, "{status:?}");
    assert!(status.runs >= 2, "{status:?}");
    assert!(
        status.recent_blocks < event_index::FOLD_BLOCKS,
        "{status:?}"
    );
    assert_eq!(
        status.blocks as usize + status.recent_blocks,
        blocks,
        "{status:?}"
    );
    let found = check_answers(&f, &f.trees);
    assert!(found > 1_000, "{found} events found");
}

#[test]
fn retention_leaves_the_runs_naming_the_blocks_still_stored() {
    let mut f = fixture(Compaction {
        retention_days: 5,
        ..Compaction::default()
    });
    for part in story(2_000, 240).chunks(200) {
        f.push(part);
        f.drain();
        settle(&f.trees);
    }
    let deleted = f.compactor.enforce_retention(NOW).unwrap();
    assert!(deleted > 500, "{deleted} deleted");
    // Reads pass over the deleted blocks the runs still name.
    check_answers(&f, &f.trees);
    f.trees.event_index.fold_all().unwrap();
    let named = |t: &Trees| t.event_index.status().blocks as usize;
    let (before, stored) = (named(&f.trees), stored_blocks(&f.trees).len());
    assert!(before > stored + 500, "{before} named, {stored} stored");
    // The worker drops the deleted blocks from the runs they are a good part of.
    assert!(settle(&f.trees) > 0);
    let after = named(&f.trees);
    assert!(
        after >= stored && after < stored + (before - stored) / 4,
        "{after} named"
    );
    check_answers(&f, &f.trees);
}

#[test]
fn a_restart_that_lost_the_recent_part_indexes_only_those_blocks_again() {
    let mut f = fixture(Compaction::default());
    let records = story(1_500, 300);
    f.push(&records[..1_000]);
    f.drain();
    settle(&f.trees);
    let before = f.trees.event_index.status();
    f.push(&records[1_000..]);
    f.drain();
    // A crash: the recent part and a fold's run never named by the manifest are lost.
    let dir = f._dir.path().join(event_index::DIR_NAME);
    std::fs::write(dir.join("999.run"), b"half a run").unwrap();
    let trees = Trees::open(&f.db, f._dir.path()).unwrap();
    assert!(!dir.join("999.run").exists());
    let status = trees.event_index.status();
    assert_eq!(status.covered, before.covered.max(status.covered));
    assert!(!status.complete);
    let filter = EventFilter {
        distinct_id: Some("anon-3".into()),
        ..EventFilter::default()
    };
    assert!(!paged(&trees, &filter).1, "reads scan until it is built");
    let mut built = Vec::new();
    loop {
        match trees.event_index.step(&trees).unwrap() {
            Step::Built { done, total } => {
                built.push((done, total));
                if done == total {
                    break;
                }
            }
            other => panic!("{other:?} before the build was done"),
        }
    }
    // Only the blocks the runs did not cover: those stored after the last fold.
    let total = built.last().unwrap().1 as usize;
    let uncovered = stored_blocks(&trees).range(before.covered..).count();
    assert_eq!(total, uncovered);
    assert!(total > 0 && total < stored_blocks(&trees).len());
    f.trees = trees.clone();
    f.compactor.trees = trees;
    check_answers(&f, &f.trees);
}

#[test]
fn a_database_stored_without_the_index_builds_it() {
    let mut f = fixture(Compaction::default());
    f.push(&story(2_000, 300));
    f.drain();
    // As a database written before the index: no directory at all.
    std::fs::remove_dir_all(f._dir.path().join(event_index::DIR_NAME)).unwrap();
    reopen(&mut f);
    assert!(!f.trees.event_index.is_complete());
    let passes = build(&f.trees);
    assert!(passes > 5, "{passes} batches");
    let status = f.trees.event_index.status();
    assert!(status.complete);
    assert_eq!(status.blocks as usize, stored_blocks(&f.trees).len());
    settle(&f.trees);
    check_answers(&f, &f.trees);
}

#[test]
fn an_index_claiming_blocks_the_database_lacks_is_built_again() {
    let mut f = fixture(Compaction::default());
    f.push(&story(600, 50));
    f.drain();
    settle(&f.trees);
    f.trees.event_index.fold_all().unwrap();
    let next = f.trees.meta.get(keys::NEXT_BLOCK_KEY).unwrap().unwrap();
    // As a database restored from a backup taken before the runs' blocks were stored.
    f.trees
        .meta
        .insert(keys::NEXT_BLOCK_KEY, &1u64.to_be_bytes()[..])
        .unwrap();
    let trees = Trees::open(&f.db, f._dir.path()).unwrap();
    assert_eq!(trees.event_index.status().runs, 0);
    f.trees.meta.insert(keys::NEXT_BLOCK_KEY, next).unwrap();
}

/// The database opened again, as at a restart, for the reads and the compactor.
fn reopen(f: &mut Fixture) {
    let trees = Trees::open(&f.db, f._dir.path()).unwrap();
    f.trees = trees.clone();
    f.compactor.trees = trees;
}

/// Build passes until one says the build is done; how many there were.
fn build(trees: &Trees) -> usize {
    let mut passes = 0;
    loop {
        passes += 1;
        match trees.event_index.step(trees).unwrap() {
            Step::Built { done, total } if done == total => return passes,
            Step::Built { .. } => {}
            other => panic!("{other:?} before the build was done"),
        }
    }
}

#[test]
fn an_index_of_the_older_format_is_set_aside_and_built_again() {
    let mut f = fixture(Compaction::default());
    f.push(&story(1_200, 200));
    f.drain();
    // As the first format left it: a manifest of version 1 naming a run of its own.
    let dir = f._dir.path().join(event_index::DIR_NAME);
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("MANIFEST"),
        "flagpost event index 1\ncovered 100000\nnext 4\nrun 3\n",
    )
    .unwrap();
    std::fs::write(dir.join("3.run"), b"a run of the first format").unwrap();
    reopen(&mut f);
    let status = f.trees.event_index.status();
    let why = status.set_aside.unwrap_or_default();
    assert!(why.contains("older format"), "{why}");
    assert!(!status.complete && status.runs == 0);
    assert!(!dir.join("3.run").exists());
    assert!(build(&f.trees) > 5);
    settle(&f.trees);
    check_answers(&f, &f.trees);
}

#[test]
fn a_build_restarted_midway_with_folds_during_it_answers_exactly() {
    let mut f = fixture(Compaction::default());
    let records = story(3_000, 400);
    f.push(&records[..1_500]);
    f.drain();
    std::fs::remove_dir_all(f._dir.path().join(event_index::DIR_NAME)).unwrap();
    reopen(&mut f);
    for _ in 0..3 {
        let step = f.trees.event_index.step(&f.trees).unwrap();
        assert!(matches!(step, Step::Built { done, total } if done < total));
    }
    // Events stored while the build runs: the recent part is folded meanwhile.
    let mut folded = 0;
    for part in records[1_500..2_200].chunks(100) {
        f.push(part);
        f.drain();
        let step = f.trees.event_index.step(&f.trees).unwrap();
        folded += usize::from(step == Step::Wrote);
    }
    assert!(folded > 0);
    let status = f.trees.event_index.status();
    assert!(!status.complete, "{status:?}");
    assert!(status.recent_blocks < 300, "{status:?}");
    // A restart in the middle: the build goes on from what the manifest covers.
    reopen(&mut f);
    assert!(!f.trees.event_index.is_complete());
    for part in records[2_200..].chunks(200) {
        f.push(part);
        f.drain();
        f.trees.event_index.step(&f.trees).unwrap();
    }
    while !f.trees.event_index.is_complete() {
        f.trees.event_index.step(&f.trees).unwrap();
    }
    settle(&f.trees);
    let found = check_answers(&f, &f.trees);
    assert!(found > 1_000, "{found} events found");
}
