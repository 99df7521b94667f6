//! Events by name through the index's runs: a name in every block, in half, in the
//! old blocks only, in many old blocks and few new ones (runs walked and runs listed
//! in one read, pages crossing from one to the other), in one block and in none, with
//! time filters, a distinct id and every page size, against every event stored; also
//! after blocks are deleted and after a restart that lost the recent part.

use serde_json::json;

use super::tests::{naive, paged, put};
use super::*;
use crate::store::block::{self, Entry};
use crate::store::event_index::Step;

const MINUTE: i64 = 60_000;
const BASE: i64 = 1_000 * 60 * MINUTE;
/// Chunks stored; each makes one block of its project.
const CHUNKS: u64 = 420;
const NAMES: [&str; 7] = [
    "every",
    "half",
    "early",
    "thin late",
    "once",
    "none has it",
    "late only",
];

/// The names chunk `i`'s events carry besides "every".
fn names_of(i: u64) -> Vec<&'static str> {
    let mut out = vec!["every"];
    if i.is_multiple_of(2) {
        out.push("half");
    }
    if i < CHUNKS * 2 / 5 {
        out.push("early");
    }
    if i < CHUNKS * 3 / 10 || i.is_multiple_of(20) {
        out.push("thin late");
    }
    if i == 137 {
        out.push("once");
    }
    if i > CHUNKS - 12 {
        out.push("late only");
    }
    out
}

/// The chunk's events: most around its own minute, every seventh chunk's from hours
/// before (stored late, so block ids and times disagree), two sharing a time.
fn chunk(i: u64) -> Vec<StoredEvent> {
    let at = match i % 7 {
        3 => BASE - (i as i64 % 11) * 60 * MINUTE,
        _ => BASE + i as i64 * MINUTE,
    };
    let names = names_of(i);
    (0..6u64)
        .map(|n| StoredEvent {
            uuid: uuid::Uuid::from_u128(u128::from(i * 100 + n).reverse_bits()),
            event: names[n as usize % names.len()].into(),
            distinct_id: format!("d{}", (i + n) % 5),
            properties: json!({"n": n}).as_object().unwrap().clone(),
            timestamp: at + (n as i64 % 5) * 7_000,
            created_at: 0,
            person_id: None,
        })
        .collect()
}

/// Run the index's worker until it has nothing to do.
fn settle(trees: &Trees) {
    while trees.event_index.step(trees).unwrap() != Step::Idle {}
}

/// Every chunk stored as a block and indexed as the compactor does, the worker
/// folding and merging the runs as it goes; every event stored, with its project.
fn store(trees: &Trees) -> Vec<(u64, StoredEvent)> {
    let mut all = Vec::new();
    for i in 0..CHUNKS {
        let project = 1 + u64::from(i % 3 == 2);
        let events = chunk(i);
        let built = block::build_indexed(events.iter().map(Entry::from_stored).collect());
        assert_eq!(built.len(), 1);
        for b in built {
            put(trees, project, i, b);
        }
        trees.event_index.committed();
        settle(trees);
        all.extend(events.into_iter().map(|e| (project, e)));
    }
    let next = CHUNKS.to_be_bytes();
    trees.meta.insert(keys::NEXT_BLOCK_KEY, &next[..]).unwrap();
    all
}

fn filters() -> Vec<EventFilter> {
    let mut out = Vec::new();
    for name in NAMES {
        let named = EventFilter {
            event: Some(name.into()),
            ..EventFilter::default()
        };
        out.push(named.clone());
        out.push(EventFilter {
            after: Some(BASE + 100 * MINUTE),
            ..named.clone()
        });
        out.push(EventFilter {
            before: Some(BASE + 200 * MINUTE + 7_000),
            ..named.clone()
        });
        out.push(EventFilter {
            after: Some(BASE - 5 * 60 * MINUTE),
            before: Some(BASE + 50 * MINUTE),
            ..named.clone()
        });
        out.push(EventFilter {
            distinct_id: Some("d3".into()),
            ..named.clone()
        });
    }
    out
}

/// Every filter, every page size, in both projects: exactly the events stored.
fn check_all(trees: &Trees, all: &[(u64, StoredEvent)]) {
    for project in [1, 2] {
        for f in filters() {
            let want = naive(all, project, &f);
            assert!(events(trees, project, f.clone(), None).through_index());
            for limit in [1, 7, 100, 100_000] {
                let got = paged(trees, project, &f, limit);
                assert_eq!(got, want, "project {project} limit {limit} {f:?}");
            }
        }
    }
}

fn named(name: &str) -> EventFilter {
    EventFilter {
        event: Some(name.into()),
        ..EventFilter::default()
    }
}

fn open_at(dir: &std::path::Path) -> (sled::Db, Trees) {
    let db = sled::open(dir).unwrap();
    let trees = Trees::open(&db, dir).unwrap();
    (db, trees)
}

#[test]
fn names_common_and_rare_read_through_runs_walked_or_listed_equal_every_event() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, trees) = open_at(dir.path());
    let all = store(&trees);
    let status = trees.event_index.status();
    assert!(status.complete && status.runs >= 3, "{status:?}");
    check_all(&trees, &all);
    // How each run answered: a name in every block or in half walks them all; one in
    // one block lists; one common in the old blocks and rare in the new does both in
    // the same read.
    let runs = status.runs;
    let ways = |name: &str| events(&trees, 1, named(name), None).index_ways().unwrap();
    assert_eq!(ways("every").0, runs);
    assert_eq!(ways("half").0, runs);
    assert_eq!(ways("once").0, 0);
    let (walked, listed) = ways("thin late");
    assert!(
        walked >= 1 && listed >= 2,
        "{walked} walked, {listed} listed"
    );
    // A page of a name in every block takes a few of its blocks, not all.
    let total = events(&trees, 1, named("every"), None)
        .named_blocks()
        .unwrap();
    let mut it = events(&trees, 1, named("every"), None);
    for _ in 0..10 {
        it.next().unwrap().unwrap();
    }
    let left = it.named_blocks().unwrap();
    assert!(total > 200 && left + 20 >= total, "{left} of {total} left");
}

#[test]
fn names_read_exactly_after_deletes_and_after_a_restart_that_lost_the_recent_part() {
    let dir = tempfile::tempdir().unwrap();
    let (db, trees) = open_at(dir.path());
    let mut all = store(&trees);
    // As retention deletes: the oldest blocks, the runs still naming them.
    let cut = BASE + 60 * MINUTE;
    let gone: Vec<sled::IVec> = trees
        .events
        .iter()
        .keys()
        .map(Result::unwrap)
        .filter(|k| keys::split_block(k).unwrap().1 < cut)
        .collect();
    assert!(gone.len() > 50, "{} deleted", gone.len());
    for k in &gone {
        trees.events.remove(k).unwrap();
    }
    // An event's chunk is in its uuid; the chunk's block went with its newest time.
    let chunk_of = |e: &StoredEvent| (e.uuid.as_u128().reverse_bits() / 100) as u64;
    let newest = |i: u64| chunk(i).iter().map(|e| e.timestamp).max().unwrap();
    all.retain(|(_, e)| newest(chunk_of(e)) >= cut);
    check_all(&trees, &all);
    trees.event_index.note_deleted();
    settle(&trees);
    check_all(&trees, &all);
    // A restart: the runs are opened from disk, the recent part is built again.
    drop(trees);
    let trees = Trees::open(&db, dir.path()).unwrap();
    assert!(!trees.event_index.is_complete());
    while !trees.event_index.is_complete() {
        trees.event_index.step(&trees).unwrap();
    }
    check_all(&trees, &all);
}
