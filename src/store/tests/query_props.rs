//! Events by a property key through the event index, against the same reads without
//! it (every block read, those lacking the key passed over) and against every event
//! stored: keys in one event in three hundred, in a sixth, only in the newest blocks,
//! needing escapes, in every event and in none; properties kept whole; time filters,
//! a name and a distinct id beside the key; every bound and page size. Also a
//! database whose index is of the format before property keys (built again, reads
//! right meanwhile) and a restart (the runs keep the keys).

use serde_json::{Map, Value};
use uuid::Uuid;

use super::super::tests::{naive, put, HOUR};
use super::*;
use crate::store::block::{self, Entry};
use crate::store::event::StoredEvent;
use crate::store::event_index::{self, Index, Step};
use crate::store::query::{events, EventFilter};
use crate::store::{keys, Trees};
use crate::support::lcg::Lcg;

/// Chunks stored, each one or a few blocks.
const CHUNKS: u64 = 80;
/// The keys read: rare, common, only late, needing escapes, in every event, in none.
const KEYS: [&str; 6] = ["rare", "some", "late", "we\"ird", "n", "nobody"];

/// Keeps the events having property `key`, as `is_set` does.
struct Has(&'static str);

impl BlockTest for Has {
    fn key(&self) -> Option<String> {
        Some(self.0.into())
    }

    fn keep(&mut self, rows: &Rows, left: &mut Vec<u32>) -> Result<(), sled::Error> {
        left.retain(|&i| {
            rows.stored(i as usize)
                .unwrap()
                .properties
                .contains_key(self.0)
        });
        Ok(())
    }
}

/// Chunk `c`'s events, from `rng`: realtime, spread over hours or in the past, as the
/// query fixture's; some properties written with spaces, which a block keeps whole.
fn chunk(rng: &mut Lcg, c: u64, uuid: &mut u128) -> Vec<(Entry, StoredEvent)> {
    let (base, spread) = match c % 3 {
        0 => (10 * HOUR + c as i64 * 1000, 2000),
        1 => (rng.next(20) as i64 * HOUR, 5 * HOUR),
        _ => (rng.next(40) as i64 * HOUR / 2, 3),
    };
    let mut out = Vec::new();
    for _ in 0..1 + rng.next(90) {
        *uuid += 1 + u128::from(rng.next(3));
        let mut props = Map::new();
        props.insert("n".into(), Value::from(*uuid as u64));
        let keyed = [("rare", 300), ("some", 6), ("we\"ird", 40)];
        for (key, one_in) in keyed {
            if rng.next(one_in) == 0 {
                props.insert(key.into(), Value::from("x"));
            }
        }
        if c >= CHUNKS - 8 {
            props.insert("late".into(), Value::Bool(true));
        }
        let event = StoredEvent {
            uuid: Uuid::from_u128(uuid.reverse_bits()),
            event: ["a", "b", "c"][rng.next(3) as usize].into(),
            distinct_id: format!("d{}", rng.next(4)),
            properties: props,
            timestamp: base + rng.next(spread as u64) as i64,
            created_at: 0,
            person_id: None,
        };
        let mut entry = Entry::from_stored(&event);
        if rng.next(100) == 0 {
            // Kept whole: its block may hold any key.
            let text = serde_json::to_string(&event.properties).unwrap();
            entry.properties = text.replacen(':', ": ", 1).into_bytes();
        }
        out.push((entry, event));
    }
    out
}

/// Every chunk stored and indexed as the compactor does, the worker folding and
/// merging as it goes; every event stored, with its project.
fn store(trees: &Trees, seed: u64) -> Vec<(u64, StoredEvent)> {
    let mut rng = Lcg(seed);
    let (mut all, mut next, mut uuid) = (Vec::new(), 0u64, 0u128);
    for c in 0..CHUNKS {
        let project = 1 + u64::from(c % 5 == 4);
        let (entries, stored): (Vec<Entry>, Vec<StoredEvent>) =
            chunk(&mut rng, c, &mut uuid).into_iter().unzip();
        for built in block::build_indexed(entries) {
            put(trees, project, next, built);
            next += 1;
        }
        trees.event_index.committed();
        settle(trees);
        all.extend(stored.into_iter().map(|e| (project, e)));
    }
    trees
        .meta
        .insert(keys::NEXT_BLOCK_KEY, &next.to_be_bytes()[..])
        .unwrap();
    all
}

fn settle(trees: &Trees) {
    while trees.event_index.step(trees).unwrap() != Step::Idle {}
}

fn filters() -> Vec<EventFilter> {
    vec![
        EventFilter::default(),
        EventFilter {
            event: Some("b".into()),
            ..EventFilter::default()
        },
        EventFilter {
            after: Some(3 * HOUR + 17),
            before: Some(11 * HOUR),
            ..EventFilter::default()
        },
        EventFilter {
            distinct_id: Some("d2".into()),
            event: Some("a".into()),
            after: Some(2 * HOUR),
            ..EventFilter::default()
        },
    ]
}

/// A page as a caller sees it: its events, the next page's cursor, events examined.
type Page = (Vec<StoredEvent>, Option<[u8; 32]>, usize);

/// Every page of `f`'s events having `key`, following the cursors.
fn pages(
    trees: &Trees,
    project: u64,
    f: &EventFilter,
    key: &'static str,
    (limit, budget): (usize, usize),
) -> Vec<Page> {
    let mut out: Vec<Page> = Vec::new();
    let mut cursor: Option<[u8; 32]> = None;
    loop {
        let from = cursor.as_ref().map(|c| &c[..]);
        let walk = events(trees, project, f.clone(), from);
        let mut walk = walk.tested_within(Box::new(Has(key)), budget, usize::MAX);
        let mut found = Vec::new();
        let mut last = None;
        for entry in walk.by_ref() {
            let (k, event) = entry.unwrap();
            found.push(event);
            last = Some(k);
            if found.len() >= limit {
                break;
            }
        }
        let next = match found.len() >= limit {
            true => last,
            false => (walk.stopped_at()).map(|(t, u)| keys::event(project, t, Uuid::from_u128(u))),
        };
        out.push((found, next, walk.examined()));
        assert!(out.len() < 10_000, "the pages move on");
        match next {
            Some(c) => cursor = Some(c),
            None => return out,
        }
    }
}

/// The same database read without its index.
fn unindexed(trees: &Trees, dir: &std::path::Path) -> Trees {
    let mut without = trees.clone();
    without.event_index = Index::unopened(dir);
    without
}

/// Bounds (page size, blocks a page): a block a page, a few, and all.
const BOUNDS: [(usize, usize); 4] = [(100_000, 1), (9, 5), (7, 1_000), (100_000, 1_000)];

/// Every key, filter and bound (`thorough`; else the rarer keys at the larger bounds),
/// both projects: the index's pages are the unindexed read's, page by page (events,
/// cursors, examined), and hold every event having the key.
fn check_all(trees: &Trees, without: &Trees, all: &[(u64, StoredEvent)], thorough: bool) {
    let (keys, bounds) = match thorough {
        true => (&KEYS[..], &BOUNDS[..]),
        false => (&KEYS[..3], &BOUNDS[1..]),
    };
    for project in [1, 2] {
        for (i, f) in filters().iter().enumerate() {
            for &key in keys {
                let want: Vec<StoredEvent> = (naive(all, project, f).into_iter())
                    .filter(|e| e.properties.contains_key(key))
                    .collect();
                let walk = events(trees, project, f.clone(), None);
                assert!(walk.tested(Box::new(Has(key)), 1).through_index());
                for &bound in bounds {
                    if bound.1 == 1 && matches!(key, "n" | "some") {
                        // A page a block: hundreds of pages, each read twice.
                        continue;
                    }
                    let ctx = format!("project {project} filter {i} {key} {bound:?}");
                    let through = pages(trees, project, f, key, bound);
                    assert_eq!(through, pages(without, project, f, key, bound), "{ctx}");
                    let got: Vec<StoredEvent> = through.into_iter().flat_map(|p| p.0).collect();
                    assert_eq!(got, want, "{ctx}");
                }
            }
        }
    }
}

/// How many blocks of `project` may hold `key`, as their key lists say.
fn blocks_with(trees: &Trees, project: u64, key: &str) -> usize {
    let stored = trees.events.scan_prefix(keys::project(project)).values();
    stored
        .map(|v| block::Rows::decode(&v.unwrap()).unwrap())
        .filter(|rows| rows.column(key).unwrap().may_hold())
        .count()
}

#[test]
fn a_key_reads_the_same_pages_through_the_index_as_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let trees = Trees::open(&db, dir.path()).unwrap();
    let all = store(&trees, 1);
    let status = trees.event_index.status();
    assert!(status.complete && status.runs >= 2, "{status:?}");
    check_all(&trees, &unindexed(&trees, dir.path()), &all, true);
}

/// The index names only the blocks that may hold the key, so a page of a rare key
/// reads those and no others, and one bound of that many blocks holds every match.
#[test]
fn a_rare_key_reads_only_the_blocks_that_may_hold_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let trees = Trees::open(&db, dir.path()).unwrap();
    let all = store(&trees, 3);
    let every = trees.events.scan_prefix(keys::project(1)).count();
    for key in KEYS {
        let walk = events(&trees, 1, EventFilter::default(), None);
        let walk = walk.tested(Box::new(Has(key)), 1);
        let named = walk.named_blocks().unwrap();
        assert_eq!(named, blocks_with(&trees, 1, key), "{key}");
        let want = naive(&all, 1, &EventFilter::default());
        let want = want.iter().filter(|e| e.properties.contains_key(key));
        let page = pages(
            &trees,
            1,
            &EventFilter::default(),
            key,
            (100_000, named.max(1)),
        );
        assert_eq!(page.len(), 1, "{key}: one page");
        assert_eq!(page[0].0.len(), want.count(), "{key}");
    }
    let rare = blocks_with(&trees, 1, "rare");
    assert!(0 < rare && rare * 10 < every, "{rare} of {every} blocks");
    assert_eq!(blocks_with(&trees, 1, "n"), every);
}

#[test]
fn an_index_of_the_format_before_is_built_again_and_reads_right_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let all = {
        let db = sled::open(dir.path()).unwrap();
        let trees = Trees::open(&db, dir.path()).unwrap();
        let all = store(&trees, 4);
        trees.event_index.fold_all().unwrap();
        all
    };
    // As the release before wrote it: runs without property keys.
    let manifest = dir.path().join(event_index::DIR_NAME).join("MANIFEST");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let older = text.replace("flagpost event index 3", "flagpost event index 2");
    std::fs::write(&manifest, older).unwrap();
    let db = sled::open(dir.path()).unwrap();
    let trees = Trees::open(&db, dir.path()).unwrap();
    let status = trees.event_index.status();
    assert!(status.set_aside.is_some() && !status.complete, "{status:?}");
    let walk = events(&trees, 1, EventFilter::default(), None);
    assert!(!walk.tested(Box::new(Has("rare")), 1).through_index());
    let without = unindexed(&trees, dir.path());
    let scanned = pages(&trees, 1, &EventFilter::default(), "rare", (9, 5));
    assert_eq!(
        scanned,
        pages(&without, 1, &EventFilter::default(), "rare", (9, 5))
    );
    settle(&trees);
    assert!(trees.event_index.status().complete);
    check_all(&trees, &without, &all, false);
}

#[test]
fn a_restart_keeps_the_property_keys_in_the_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (all, named) = {
        let db = sled::open(dir.path()).unwrap();
        let trees = Trees::open(&db, dir.path()).unwrap();
        let all = store(&trees, 5);
        trees.event_index.fold_all().unwrap();
        (all, blocks_with(&trees, 1, "rare"))
    };
    let db = sled::open(dir.path()).unwrap();
    let trees = Trees::open(&db, dir.path()).unwrap();
    let status = trees.event_index.status();
    assert!(status.complete && status.recent_blocks == 0, "{status:?}");
    assert!(status.set_aside.is_none(), "{status:?}");
    let walk = events(&trees, 1, EventFilter::default(), None);
    let walk = walk.tested(Box::new(Has("rare")), 1);
    assert_eq!(walk.named_blocks(), Some(named));
    check_all(&trees, &unindexed(&trees, dir.path()), &all, false);
}
