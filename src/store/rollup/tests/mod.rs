//! Rollups against the stored events they count: equal to a scan on random data,
//! and the same whether built by the compactor's chunks or by a backfill.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::json;
use sled::transaction::Transactional;

use super::backfill::{self, Backfill, Step};
use super::*;
use crate::store::block::{self, Entry};
use crate::store::event_index;
use crate::store::keys::NEXT_BLOCK_KEY;
use crate::store::query::{self, EventFilter};
use crate::store::Trees;

const T0: i64 = 1_700_000_000_000;
const NAMES: [&str; 4] = ["$pageview", "signup", "$feature_flag_called", "survey sent"];

/// A small deterministic generator (xorshift64).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// `n` events over three days in projects 1 and 2, some without a person.
fn random_events(seed: u64, n: usize) -> Vec<(u64, Entry)> {
    let mut rng = Rng(seed);
    (0..n)
        .map(|i| {
            let name = NAMES[rng.below(4) as usize];
            let who = rng.below(300);
            let properties = match name {
                "$feature_flag_called" => {
                    let response = [json!("control"), json!("test"), json!(true), json!(null)]
                        [rng.below(4) as usize]
                        .clone();
                    json!({"$feature_flag": format!("flag-{}", rng.below(3)),
                           "$feature_flag_response": response})
                }
                "survey sent" => {
                    let id = rng.below(2);
                    let answer =
                        [json!("yes"), json!(["a", "b"]), json!(7)][rng.below(3) as usize].clone();
                    json!({"$survey_id": format!("s{id}"), "$survey_name": format!("Survey {id}"),
                           "$survey_response": answer})
                }
                _ => json!({"n": i}),
            };
            let entry = Entry {
                timestamp: T0 + rng.below(3 * 24 * HOUR_MS as u64) as i64,
                created_at: T0,
                uuid: Uuid::from_u128(i as u128 + 1),
                person_id: (!who.is_multiple_of(5)).then(|| Uuid::from_u128(who as u128 + 1_000)),
                event: name.to_owned(),
                distinct_id: format!("d{who}"),
                properties: serde_json::to_vec(&properties).unwrap(),
            };
            (1 + rng.below(2), entry)
        })
        .collect()
}

fn open() -> (tempfile::TempDir, sled::Db, Trees) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let trees = Trees::open(&db, dir.path()).unwrap();
    (dir, db, trees)
}

/// Store `events` in chunks of `chunk` as the compactor does: blocks, the next block
/// id and (when `rollups`) the chunk's rollups, in one transaction.
fn store(trees: &Trees, events: &[(u64, Entry)], chunk: usize, rollups: bool) {
    for part in events.chunks(chunk) {
        (&trees.events, &trees.meta, &trees.rollups.tree)
            .transaction(|(ev, meta, ro)| {
                let mut next = meta
                    .get(NEXT_BLOCK_KEY)?
                    .map_or(0, |v| u64::from_be_bytes(v.as_ref().try_into().unwrap()));
                let mut by_project: HashMap<u64, Vec<Entry>> = HashMap::new();
                let mut pending = Pending::default();
                for (p, e) in part {
                    by_project.entry(*p).or_default().push(e.clone());
                    let (name, id) = (&e.event, &e.distinct_id);
                    pending.add(*p, e.timestamp, name, e.person_id, id, &e.properties);
                }
                for (p, list) in by_project {
                    // Indexed as the compactor does: reads by name go through the index.
                    for built in block::build_indexed(list) {
                        ev.insert(&keys::block(p, built.newest, next)[..], built.value)?;
                        let block = event_index::BlockRef {
                            id: next,
                            project: p,
                            newest: built.newest,
                            oldest: built.oldest,
                        };
                        let (distinct_ids, events) = (built.distinct_ids, built.events);
                        trees.event_index.add(&[event_index::NewBlock {
                            block,
                            distinct_ids,
                            events,
                            properties: built.properties,
                        }]);
                        next += 1;
                    }
                }
                meta.insert(NEXT_BLOCK_KEY, &next.to_be_bytes()[..])?;
                if rollups {
                    pending.write(ro)?;
                }
                Ok::<_, sled::transaction::ConflictableTransactionError<()>>(())
            })
            .unwrap();
        trees.event_index.committed();
    }
}

fn contents(tree: &sled::Tree) -> Vec<(Vec<u8>, Vec<u8>)> {
    tree.iter()
        .map(|e| {
            let (k, v) = e.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .collect()
}

/// Every hour's counts and exact unique persons, per event name, by scanning.
type PerHour = BTreeMap<(String, i64), (u64, u64)>;

fn scanned(trees: &Trees, project: u64) -> PerHour {
    let mut seen: BTreeMap<(String, i64), (u64, HashSet<String>)> = BTreeMap::new();
    for e in query::events(trees, project, EventFilter::default(), None) {
        let e = e.unwrap().1;
        let who = e.person_id.map_or(e.distinct_id.clone(), |p| p.to_string());
        let slot = seen
            .entry((e.event.clone(), hour_of(e.timestamp)))
            .or_default();
        slot.0 += 1;
        slot.1.insert(who);
    }
    seen.into_iter()
        .map(|(k, (n, who))| (k, (n, who.len() as u64)))
        .collect()
}

fn rolled(trees: &Trees, project: u64) -> PerHour {
    let (from, to) = (hour_of(T0), hour_of(T0) + 4 * 24 * HOUR_MS);
    let mut out = BTreeMap::new();
    for name in NAMES {
        for (hour, n, sketch) in events(&trees.rollups, project, name, from, to).unwrap() {
            out.insert((name.to_owned(), hour), (n, sketch.estimate()));
        }
    }
    out
}

#[test]
fn rollups_equal_a_scan_of_the_events() {
    let (_dir, _db, trees) = open();
    store(&trees, &random_events(7, 5_000), 700, true);
    let (from, to) = (hour_of(T0), hour_of(T0) + 4 * 24 * HOUR_MS);
    for project in [1, 2] {
        // Under 128 persons an hour: unique counts are exact too.
        let scan = scanned(&trees, project);
        assert_eq!(rolled(&trees, project), scan);
        let mut totals: HashMap<String, u64> = HashMap::new();
        for ((name, _), (n, _)) in &scan {
            *totals.entry(name.clone()).or_default() += n;
        }
        assert_eq!(top(&trees.rollups, project, from, to).unwrap(), totals);

        let mut flags: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        let mut surveys_seen: BTreeMap<String, read::Survey> = BTreeMap::new();
        for e in query::events(&trees, project, EventFilter::default(), None) {
            let e = e.unwrap().1;
            let p = &e.properties;
            if e.event == "$feature_flag_called" {
                let flag = p["$feature_flag"].as_str().unwrap().to_owned();
                let value = exposure_value(p.get("$feature_flag_response"));
                *flags.entry(flag).or_default().entry(value).or_default() += 1;
            } else if e.event == "survey sent" {
                let id = p["$survey_id"].as_str().unwrap().to_owned();
                let name = p["$survey_name"].as_str().unwrap().to_owned();
                let slot = surveys_seen.entry(id).or_insert((name, 0, BTreeMap::new()));
                slot.1 += 1;
                for a in answers(p.get("$survey_response")) {
                    *slot.2.entry(a).or_default() += 1;
                }
            }
        }
        assert!(flags["flag-1"].contains_key("control") && flags["flag-1"].contains_key("false"));
        assert_eq!(exposures(&trees.rollups, project, from, to).unwrap(), flags);
        assert_eq!(
            surveys(&trees.rollups, project, from, to).unwrap(),
            surveys_seen
        );
    }
    // A range of whole hours counts exactly the events inside it.
    let (a, b) = (hour_of(T0) + 5 * HOUR_MS, hour_of(T0) + 30 * HOUR_MS);
    let filter = EventFilter {
        after: Some(a),
        before: Some(b),
        event: Some("signup".into()),
        distinct_id: None,
        person_id: None,
    };
    let n = query::events(&trees, 1, filter, None).count() as u64;
    let hours = events(&trees.rollups, 1, "signup", a, b).unwrap();
    assert_eq!(hours.iter().map(|h| h.1).sum::<u64>(), n);
}

fn backfill_all(trees: &Trees) -> Vec<u8> {
    let b = Backfill::new(trees).unwrap();
    let mut seen = Vec::new();
    loop {
        match b.step(trees).unwrap() {
            Step::Progress(p) => seen.push(p),
            Step::Done => return seen,
        }
    }
}

#[test]
fn a_backfill_builds_what_the_compactor_would_have() {
    let events = random_events(11, 40_000);
    let (_d1, _db1, incremental) = open();
    store(&incremental, &events, 1_000, true);

    // An older database: the events, no rollups, and no rollups version.
    let (dir, db, old) = open();
    store(&old, &events[..30_000], 1_000, false);
    old.meta.remove(VERSION_KEY).unwrap();
    drop((old, db));
    let db = crate::store::reopen_for_tests(dir.path());
    let trees = Trees::open(&db, dir.path()).unwrap();
    assert_eq!(status(&trees.meta).unwrap(), Status::Building(0));
    // Events stored while the backfill runs get their rollups from their chunk.
    store(&trees, &events[30_000..], 1_000, true);
    let progress = backfill_all(&trees);
    assert!(progress.windows(2).all(|w| w[0] <= w[1]), "{progress:?}");
    assert!(
        progress.len() > 2 && *progress.last().unwrap() >= 90,
        "{progress:?}"
    );
    assert_eq!(status(&trees.meta).unwrap(), Status::Ready);
    assert_eq!(contents(&trees.rollups), contents(&incremental.rollups));
    // Opened again: current, nothing rebuilt.
    backfill::prepare(&trees).unwrap();
    assert_eq!(status(&trees.meta).unwrap(), Status::Ready);
    assert_eq!(contents(&trees.rollups), contents(&incremental.rollups));
}

#[test]
fn a_backfill_resumes_without_counting_twice_and_an_old_version_is_rebuilt() {
    let events = random_events(3, 20_000);
    let (_d1, _db1, incremental) = open();
    store(&incremental, &events, 500, true);
    let (_dir, _db, trees) = open();
    store(&trees, &events, 500, true);
    // Rollups of another version: emptied and rebuilt.
    trees.meta.insert(VERSION_KEY, &[VERSION + 1][..]).unwrap();
    trees.rollups.insert(b"stale", &b"x"[..]).unwrap();
    backfill::prepare(&trees).unwrap();
    assert_eq!(trees.rollups.len(), 0);
    let b = Backfill::new(&trees).unwrap();
    for _ in 0..3 {
        assert!(matches!(b.step(&trees).unwrap(), Step::Progress(_)));
    }
    // As after a restart: a new backfill continues from the recorded position.
    backfill::prepare(&trees).unwrap();
    backfill_all(&trees);
    assert_eq!(contents(&trees.rollups), contents(&incremental.rollups));
}

#[test]
fn a_new_database_needs_no_backfill_and_retention_forgets_old_hours() {
    let (_dir, _db, trees) = open();
    assert_eq!(status(&trees.meta).unwrap(), Status::Ready);
    store(&trees, &random_events(5, 2_000), 1_000, true);
    let cut = hour_of(T0) + 24 * HOUR_MS;
    let before = trees.rollups.len();
    let deleted = forget_before(&trees.rollups, cut).unwrap();
    assert!(deleted > 0 && deleted < before as u64);
    for (key, _) in contents(&trees.rollups) {
        let hour = match key[8] {
            EVENTS => read::key_hour(&key).unwrap(),
            _ => keys::time_from(key[9..17].try_into().unwrap()),
        };
        assert!(hour >= cut, "{key:?}");
    }
    let left = events(&trees.rollups, 1, "signup", i64::MIN, i64::MAX).unwrap();
    assert!(!left.is_empty() && left.iter().all(|h| h.0 >= cut));
}

#[test]
fn answers_and_flag_values_are_labels() {
    assert_eq!(answers(Some(&json!("yes"))), vec!["yes"]);
    assert_eq!(answers(Some(&json!(["a", "b"]))), vec!["a", "b"]);
    assert_eq!(answers(Some(&json!(9))), vec!["9"]);
    assert!(answers(Some(&serde_json::Value::Null)).is_empty());
    assert_eq!(exposure_value(Some(&json!("test"))), "test");
    assert_eq!(exposure_value(Some(&json!(true))), "true");
    assert_eq!(exposure_value(None), "false");
}
