//! The console's rollups (`store::rollup`): a database holding the rollups of N events
//! (10 million unless `ROLLUP_BENCH_EVENTS` says otherwise) spread evenly over 90 days,
//! written as the compactor writes them (chunks of 1,024 events in time order, one
//! transaction each); then the reads the insights page makes over 90 days: the chart
//! of one and of three events by day (counts and unique persons: hours summed,
//! sketches merged), the top events, and the flags' exposures. The events themselves
//! are not stored: these reads never touch them. Events are 20 names (the first half of
//! them `$pageview`), one in 20 a flag call, from 200,000 persons.

use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion};
use flagpost::store::rollup::{self, Pending};
use flagpost::store::Trees;
use serde_json::json;
use sled::transaction::{ConflictableTransactionError, Transactional};
use uuid::Uuid;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PROJECT: u64 = 1;
const DAYS: i64 = 90;
const CHUNK: usize = 1024;
const PERSONS: u64 = 200_000;
/// The hour the 90 days end in.
const END: i64 = 1_700_000_000_000 / rollup::HOUR_MS * rollup::HOUR_MS;
const DAY_MS: i64 = 24 * rollup::HOUR_MS;

fn name(i: u64) -> String {
    match i % 20 {
        0..=9 => "$pageview".into(),
        10 => "$feature_flag_called".into(),
        n => format!("event-{n}"),
    }
}

struct Filled {
    _dir: tempfile::TempDir,
    trees: Trees,
}

fn fill(events: u64) -> Filled {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let db = sled::Config::new()
        .path(dir.path())
        .cache_capacity(256 << 20)
        .open()
        .unwrap();
    let trees = Trees::open(&db, dir.path()).unwrap();
    let span = DAYS * DAY_MS;
    let flag_properties: Vec<Vec<u8>> = ["control", "test"]
        .iter()
        .map(|v| {
            serde_json::to_vec(&json!({"$feature_flag": "flag-a", "$feature_flag_response": v}))
                .unwrap()
        })
        .collect();
    let started = Instant::now();
    let mut write_ns = 0u128;
    let mut i = 0u64;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    while i < events {
        let mut pending = Pending::default();
        let n = (CHUNK as u64).min(events - i);
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let ts = END - span + (i as i128 * span as i128 / events as i128) as i64;
            let who = x % PERSONS;
            let event = name(x >> 20);
            let properties: &[u8] = match event.as_str() {
                "$feature_flag_called" => &flag_properties[(x >> 40) as usize % 2],
                _ => b"{}",
            };
            let person = Some(Uuid::from_u64_pair(who, 7));
            pending.add(PROJECT, ts, &event, person, "", properties);
            i += 1;
        }
        let t = Instant::now();
        (&trees.rollups.tree,)
            .transaction(|(tree,)| {
                pending.write(tree)?;
                Ok::<_, ConflictableTransactionError<()>>(())
            })
            .unwrap();
        write_ns += t.elapsed().as_nanos();
    }
    db.flush().unwrap();
    eprintln!(
        "filled the rollups of {events} events in {:.1} s (writing them: {:.0} ns per event); {} keys",
        started.elapsed().as_secs_f64(),
        write_ns as f64 / events as f64,
        trees.rollups.len()
    );
    Filled { _dir: dir, trees }
}

fn chart(trees: &Trees, names: &[&str]) -> u64 {
    let first = (END - DAYS * DAY_MS) / DAY_MS * DAY_MS;
    let n = (DAYS + 1) as usize;
    let mut total = 0;
    for name in names {
        let (counts, uniques) =
            rollup::series(&trees.rollups, PROJECT, name, (first, DAY_MS, n)).unwrap();
        total += counts.iter().sum::<u64>() + uniques[0];
    }
    total
}

fn bench(c: &mut Criterion) {
    let events: u64 = std::env::var("ROLLUP_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let f = fill(events);
    let (from, to) = (END - DAYS * DAY_MS, END + rollup::HOUR_MS);
    let mut g = c.benchmark_group(format!("rollups_{events}_events_90_days"));
    g.sample_size(20);
    g.bench_function("chart_1_event_by_day", |b| {
        b.iter(|| chart(&f.trees, &["$pageview"]))
    });
    g.bench_function("chart_3_events_by_day", |b| {
        b.iter(|| chart(&f.trees, &["$pageview", "event-12", "event-19"]))
    });
    g.bench_function("top_events", |b| {
        b.iter(|| rollup::top(&f.trees.rollups, PROJECT, from, to).unwrap())
    });
    g.bench_function("exposures", |b| {
        b.iter(|| rollup::exposures(&f.trees.rollups, PROJECT, from, to).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
