//! The compactor's two lookups per event that grow with the data (`lookups`): is this
//! uuid in the deduplication window, and what does the persons' run hold for this key.
//!
//! (a) `window`: a full window of the default 2,000,000 uuids (random, v4-like, so
//! every frozen segment's range holds a new one), asked about 1,000 uuids never stored
//! (every new event's question), 1,000 stored ones (a retried batch) and 1,000 newer
//! time-ordered ones (v7, the usual case). (b) `run`: a run of 1,000,000 persons of
//! about 100 bytes each (130 MB uncompressed, four times the block cache), asked 1,000
//! keys at a time walking over all of it (each iteration other keys: what a stream of
//! persons not seen lately asks), and 1,000 keys of a busy tenth asked again and
//! again. Throughput is in lookups. The window's segments are in files under the
//! target dir (`store::dedup`): a stored uuid's lookup reads 4 KiB of one, from the page
//! cache. Earlier commits, whose window was all in memory, took no directory and
//! answered without a `Result`: to compare, build this file against one with those two
//! calls changed back.

#[path = "common/mod.rs"]
mod common;

use std::cell::Cell;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use flagpost::config::{DEFAULT_DEDUP_MAX_AGE_MS, DEFAULT_DEDUP_MAX_IDS};
use flagpost::store::dedup::{Id, Window};
use flagpost::store::layered::{Run, Writer};
use sled::IVec;

/// Uuids a chunk stores: the window takes them a chunk at a time.
const CHUNK: usize = 1_000;
/// Lookups per measured iteration.
const ASKED: usize = 1_000;
/// Persons in the run.
const PERSONS: u64 = 1_000_000;
/// Steps between keys asked one after another: a prime, so the walk meets them all.
const STRIDE: u64 = 7_919;

// The server's allocator (src/main.rs), so the figures are those of the code that runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A well-mixed 128-bit value for `n` (a v4-like uuid).
fn scrambled(n: u64) -> u128 {
    let mut x = u128::from(n).wrapping_add(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834);
    x ^= x >> 61;
    x = x.wrapping_mul(0x2545_f491_4f6c_dd1d_9e37_79b9_7f4a_7c15);
    x ^ (x >> 67)
}

fn window(c: &mut Criterion) {
    let dir = tempfile::Builder::new()
        .prefix("flagpost-bench-window-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("a temporary dir");
    let mut w = Window::new(dir.path(), DEFAULT_DEDUP_MAX_AGE_MS, DEFAULT_DEDUP_MAX_IDS);
    let stored = DEFAULT_DEDUP_MAX_IDS as u64;
    for chunk in 0..stored / CHUNK as u64 {
        let ids: Vec<Id> = (0..CHUNK as u64)
            .map(|i| (1, scrambled(chunk * CHUNK as u64 + i)))
            .collect();
        let key = IVec::from(&chunk.to_be_bytes()[..]);
        w.insert(key, common::NOW_MS, &ids, None, common::NOW_MS)
            .expect("the segments' files are written");
    }
    assert!(
        w.len() >= DEFAULT_DEDUP_MAX_IDS - 65_536,
        "{} uuids",
        w.len()
    );
    let absent: Vec<Id> = (0..ASKED as u64)
        .map(|i| (1, scrambled(stored + i)))
        .collect();
    let present: Vec<Id> = (0..ASKED as u64)
        .map(|i| (1, scrambled(stored - 1 - i * 997)))
        .collect();
    let newer: Vec<Id> = (0..ASKED as u64)
        .map(|i| (1, u128::MAX - u128::from(i)))
        .collect();
    let mut group = c.benchmark_group("window");
    group.throughput(Throughput::Elements(ASKED as u64));
    for (name, ids, expected) in [
        ("absent", &absent, 0),
        ("present", &present, ASKED),
        ("newer v7", &newer, 0),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let found = ids
                    .iter()
                    .filter(|&&id| w.contains(black_box(id)).expect("the segments are read"))
                    .count();
                assert_eq!(found, expected);
            })
        });
    }
    group.finish();
}

fn key(n: u64) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..8].copy_from_slice(&1u64.to_be_bytes());
    k[8..].copy_from_slice(&scrambled(n).to_be_bytes());
    k
}

fn run(c: &mut Criterion) {
    let dir = tempfile::Builder::new()
        .prefix("flagpost-bench-lookups-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("a temporary dir");
    let path = dir.path().join("persons.0000000001.run");
    let mut keys: Vec<[u8; 24]> = (0..PERSONS).map(key).collect();
    keys.sort_unstable();
    let mut writer = Writer::create(&path).expect("the run is created");
    for (n, k) in keys.iter().enumerate() {
        let value = format!(
            r#"{{"email":"user{n}@example.com","plan":"{}","seats":{}}}"#,
            ["free", "pro"][n % 2],
            n % 40
        );
        let mut value = value.into_bytes();
        value.resize(100, b' ');
        writer.push(k, &value).expect("the entry is written");
    }
    writer.finish().expect("the run is finished");
    let run = Run::open(&path).expect("the run opens");
    let busy: Vec<[u8; 24]> = (0..ASKED as u64)
        .map(|i| key((i * 7_919) % (PERSONS / 10)))
        .collect();
    let mut group = c.benchmark_group("run");
    group.throughput(Throughput::Elements(ASKED as u64));
    let walked = Cell::new(0u64);
    group.bench_function("spread", |b| {
        b.iter(|| {
            let from = walked.replace(walked.get() + ASKED as u64);
            let found = (from..from + ASKED as u64)
                .filter(|i| run.get(black_box(&key(i * STRIDE % PERSONS))).is_some());
            assert_eq!(found.count(), ASKED);
        })
    });
    group.bench_function("busy tenth", |b| {
        b.iter(|| {
            let found = busy.iter().filter(|k| run.get(black_box(&k[..])).is_some());
            assert_eq!(found.count(), ASKED);
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = window, run
}
criterion_main!(benches);
