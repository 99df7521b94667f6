//! `/decide`'s lookup of a stored person (`person_lookup`): `PersonCache::person` for a
//! distinct id whose person the cache does not hold yet, on a database of
//! `PERSON_LOOKUP_PERSONS` persons (default 200,000, the scale scenario's quick size),
//! each created anonymous and identified (two distinct ids, about 200 bytes of JSON),
//! folded into the persons' and distinct ids' runs. Three cases:
//!
//! - **blocks cached**: the run blocks holding the link and the person were read
//!   before (by another lookup), the person cache is empty;
//! - **blocks not cached**: the tables are opened again before each lookup, so their
//!   runs have ids the block cache has never seen and both blocks are read and decoded;
//! - **person cached**: the person cache holds the person (a user's second page load).
//!
//! Without `PERSON_LOOKUP_DRIVER` it is a criterion bench. With
//! `PERSON_LOOKUP_DRIVER=<n>` it makes `n` lookups of each case, each in a function of
//! its own (`drive_cached_blocks`, `drive_cold_blocks`, `drive_cached_person`), for
//! `valgrind --tool=callgrind`: a case's instructions a lookup are its function's
//! inclusive cost over `n`. The database is built once into `PERSON_LOOKUP_DB` (under
//! the target dir by default) through the compactor and reused while it exists, so the
//! build runs natively, not under valgrind. The same file builds against earlier
//! commits for a comparison side by side.

#[path = "common/mod.rs"]
mod common;

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use criterion::{criterion_group, Criterion};
use flagpost::compactor::Compactor;
use flagpost::config::{Compaction, DEFAULT_LOG_SEGMENT_BYTES};
use flagpost::log::record::encode_frame;
use flagpost::log::{self, Record};
use flagpost::projects::Projects;
use flagpost::store::layered::Layered;
use flagpost::store::person_cache::{PersonCache, DEFAULT_BYTES};
use flagpost::store::{Trees, DISTINCT_IDS_TREE, PERSONS_TREE};
use serde_json::json;

use common::{pageview, uuid, API_KEY, NOW_MS};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Persons in the database unless `PERSON_LOOKUP_PERSONS` says otherwise.
const PERSONS: usize = 200_000;
/// Records the compactor takes a step at a time while building.
const STEP_RECORDS: usize = 1024;
/// Persons asked for one after another are this far apart in creation order (a
/// prime), so they fall in different blocks of both tables.
const STRIDE: usize = 7_919;
/// Lookups per criterion iteration.
const ASKED: usize = 100;

fn persons() -> usize {
    std::env::var("PERSON_LOOKUP_PERSONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(PERSONS)
}

fn db_dir() -> PathBuf {
    std::env::var_os("PERSON_LOOKUP_DB")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("person-lookup-{}", persons()))
        })
}

fn user(p: usize) -> String {
    format!("user-{p:07}")
}

/// Person `p`'s `k`th event: an anonymous `$pageview` with `$set_once`, then
/// `$identify` with `$set`.
fn record(p: usize, k: usize) -> Record {
    let at = NOW_MS + (2 * p + k) as i64;
    let anon = format!("anon-{p:07}");
    let distinct_id = if k == 0 { anon.clone() } else { user(p) };
    let mut event = pageview(p);
    event["distinct_id"] = distinct_id.as_str().into();
    let props = &mut event["properties"];
    props["distinct_id"] = distinct_id.as_str().into();
    if k == 0 {
        props["$set_once"] = json!({
            "$initial_referrer": "$direct",
            "$initial_current_url": props["$current_url"].clone(),
        });
    } else {
        event["event"] = "$identify".into();
        let props = &mut event["properties"];
        props["$anon_distinct_id"] = anon.into();
        let plan = ["free", "pro", "enterprise"][p % 3];
        props["$set"] = json!({
            "email": format!("{}@example.com", user(p)),
            "plan": plan,
            "seats": p % 40,
        });
    }
    let id = uuid(at, (2 * p + k) as u64);
    event["uuid"] = id.to_string().into();
    Record {
        project: 1,
        received_at: at,
        timestamp: at,
        sent_at: None,
        uuid: id,
        historical: false,
        ip: None,
        event: event["event"].as_str().unwrap_or("$pageview").to_owned(),
        distinct_id,
        data: serde_json::to_vec(&event).expect("serialises"),
    }
}

fn open(dir: &Path) -> (sled::Db, Trees) {
    let db = sled::Config::new()
        .path(dir)
        .cache_capacity(flagpost::config::DEFAULT_CACHE_BYTES)
        .open()
        .expect("sled opens");
    let trees = Trees::open(&db, dir).expect("the trees open");
    (db, trees)
}

/// The database of [`persons`] persons, built through the compactor if not there yet.
fn database() -> (PathBuf, sled::Db, Trees) {
    let dir = db_dir();
    let done = dir.join("built");
    if !done.exists() {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the database's dir is made");
        build(&dir);
        std::fs::write(&done, b"").expect("the mark is written");
    }
    let (db, trees) = open(&dir);
    (dir, db, trees)
}

fn build(dir: &Path) {
    let (db, trees) = open(dir);
    let projects = format!(r#"{{"projects":[{{"id":1,"api_key":"{API_KEY}"}}]}}"#);
    let projects = Projects::parse(projects.as_bytes()).expect("valid projects");
    let (mut appender, reader, preparer) =
        log::open(&dir.join(log::DIR_NAME), 1, None, DEFAULT_LOG_SEGMENT_BYTES)
            .expect("the log opens");
    let mut compactor = Compactor::new(
        trees.clone(),
        reader,
        Arc::new(ArcSwap::from_pointee(projects)),
        Compaction::default(),
        Arc::new(flagpost::geoip::Database::disabled()),
    );
    let n = persons();
    // Each person's two events a step apart, so the identify finds the anonymous person.
    let all: Vec<(usize, usize)> = (0..2).flat_map(|k| (0..n).map(move |p| (p, k))).collect();
    for step in all.chunks(STEP_RECORDS) {
        let records: Vec<Vec<u8>> = step.iter().map(|&(p, k)| record(p, k).encode()).collect();
        for entry in records.chunks(32) {
            appender
                .push(&encode_frame(entry.iter().map(Vec::as_slice)))
                .expect("log append");
        }
        appender.commit().expect("log sync");
        let report = compactor.step().expect("the step commits");
        assert_eq!(report.realtime, step.len());
    }
    preparer.stop();
    for table in [&trees.persons, &trees.distinct_ids, &trees.first_seen] {
        table.fold().expect("the table folds");
    }
    drop(compactor);
    db.flush().expect("sled flushes");
}

/// The tables opened again: runs with ids the block cache has not seen.
fn reopened(db: &sled::Db, dir: &Path, trees: &Trees) -> Trees {
    Trees {
        persons: Layered::open(db, dir, PERSONS_TREE).expect("persons open"),
        distinct_ids: Layered::open(db, dir, DISTINCT_IDS_TREE).expect("distinct ids open"),
        ..trees.clone()
    }
}

fn asked(count: usize) -> Vec<String> {
    let n = persons();
    (0..count).map(|i| user(i * STRIDE % n)).collect()
}

/// One lookup, asserting the person is found.
#[inline(never)]
fn lookup(cache: &PersonCache, trees: &Trees, distinct_id: &str) {
    let found = cache
        .person(trees, 1, black_box(distinct_id))
        .expect("the lookup reads");
    assert!(found.is_some(), "{distinct_id} is stored");
    black_box(found);
}

#[inline(never)]
fn drive_cached_blocks(trees: &Trees, ids: &[String]) {
    let cache = PersonCache::new(DEFAULT_BYTES);
    for id in ids {
        lookup(&cache, trees, id);
    }
}

#[inline(never)]
fn drive_cold_blocks(cache: &PersonCache, trees: &Trees, id: &str) {
    lookup(cache, trees, id);
}

#[inline(never)]
fn drive_cached_person(cache: &PersonCache, trees: &Trees, ids: &[String]) {
    for id in ids {
        lookup(cache, trees, id);
    }
}

fn driver(n: usize) {
    let (dir, db, trees) = database();
    let ids = asked(n);
    // Blocks read once by another cache, then the measured lookups.
    let warm = PersonCache::new(DEFAULT_BYTES);
    for id in &ids {
        lookup(&warm, &trees, id);
    }
    drive_cached_blocks(&trees, &ids);
    drive_cached_person(&warm, &trees, &ids);
    for id in &ids {
        let fresh = reopened(&db, &dir, &trees);
        drive_cold_blocks(&PersonCache::new(DEFAULT_BYTES), &fresh, id);
    }
    println!("person_lookup: {n} lookups of each case");
}

fn bench(c: &mut Criterion) {
    let (dir, db, trees) = database();
    let ids = asked(ASKED);
    let mut group = c.benchmark_group("person_lookup");
    group.throughput(criterion::Throughput::Elements(ASKED as u64));
    group.bench_function("blocks cached", |b| {
        b.iter(|| drive_cached_blocks(&trees, &ids))
    });
    group.bench_function("blocks not cached", |b| {
        b.iter_batched(
            || reopened(&db, &dir, &trees),
            |fresh| drive_cached_blocks(&fresh, &ids),
            criterion::BatchSize::PerIteration,
        )
    });
    let cache = PersonCache::new(DEFAULT_BYTES);
    group.bench_function("person cached", |b| {
        b.iter(|| drive_cached_person(&cache, &trees, &ids))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = bench
}

fn main() {
    match std::env::var("PERSON_LOOKUP_DRIVER") {
        Ok(n) => driver(n.parse().expect("PERSON_LOOKUP_DRIVER is a count")),
        Err(_) => {
            benches();
            Criterion::default().configure_from_args().final_summary();
        }
    }
}
