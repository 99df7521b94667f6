//! The console's persons pages over a large project (`http::console::find`): a
//! database holding N persons (1 million unless `PERSONS_BENCH_N` says otherwise),
//! each stored as the compactor stores one (JSON under project and id, ids PostHog's
//! UUIDv5 of the distinct id) and folded into the persons' run with the dozen properties posthog-js sets on a first
//! visit (about 700 bytes); then the reads the persons page makes, each a whole pass
//! over the persons because they are stored by id, not by time: the newest 50, the
//! newest 50 whose email contains a text, and the 50 at the deepest offset a list
//! allows (10,000).

use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion};
use flagpost::http::console::find::{newest_persons, Matcher, MAX_PERSONS_SCANNED};
use flagpost::http::params::Params;
use flagpost::persons::{self, Person};
use flagpost::store::{keys, Trees};
use serde_json::json;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PROJECT: u64 = 1;
/// Persons written per sled batch while filling.
const BATCH: u64 = 10_000;

struct Filled {
    _dir: tempfile::TempDir,
    trees: Trees,
}

fn person(i: u64) -> Person {
    let distinct_id = format!("user-{i:08}");
    let company = ["acme", "globex", "initech"][(i % 3) as usize];
    let plan = ["free", "pro", "team"][(i % 3) as usize];
    let properties = json!({
        "email": format!("user{i}@{company}.example"),
        "plan": plan,
        "$initial_browser": "Chrome", "$initial_browser_version": 131,
        "$initial_os": "Mac OS X", "$initial_os_version": "15.1.0",
        "$initial_device_type": "Desktop",
        "$initial_current_url": format!("https://app.example.com/welcome?ref={}", i % 97),
        "$initial_pathname": "/welcome", "$initial_referrer": "https://www.google.com/",
        "$initial_referring_domain": "www.google.com",
        "$initial_geoip_country_code": "DE", "$initial_geoip_city_name": "Berlin",
    });
    Person {
        id: persons::id_for(PROJECT, &distinct_id),
        created_at: 1_700_000_000_000 + i as i64 * 1000,
        properties: properties.as_object().cloned().unwrap_or_default(),
        distinct_ids: vec![distinct_id.clone()],
        is_identified: true,
        first_distinct_id: distinct_id,
    }
}

fn fill(n: u64) -> Filled {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let db = sled::Config::new()
        .path(dir.path())
        .cache_capacity(256 << 20)
        .open()
        .unwrap();
    let trees = Trees::open(&db, dir.path()).unwrap();
    let started = Instant::now();
    let mut bytes = 0usize;
    for first in (0..n).step_by(BATCH as usize) {
        let mut batch = sled::Batch::default();
        for i in first..(first + BATCH).min(n) {
            let p = person(i);
            let value = serde_json::to_vec(&p).unwrap();
            bytes += value.len();
            batch.insert(&keys::with_uuid(PROJECT, p.id)[..], value);
        }
        trees.persons.delta().apply_batch(batch).unwrap();
    }
    db.flush().unwrap();
    // Into the sorted run, where the compactor's folds keep all but recent changes.
    trees.persons.fold().unwrap();
    eprintln!(
        "{n} persons, {} bytes each on average, written in {:.1} s",
        bytes as u64 / n.max(1),
        started.elapsed().as_secs_f64()
    );
    Filled { _dir: dir, trees }
}

fn bench(c: &mut Criterion) {
    let n: u64 = std::env::var("PERSONS_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    assert!(
        n as usize <= MAX_PERSONS_SCANNED,
        "the bound would cut the pass short"
    );
    let f = fill(n);
    let contains = Params::parse(Some("property=email&operator=icontains&value=GLOBEX"));
    let matcher = Matcher::from_params(&contains).unwrap().unwrap();
    let mut g = c.benchmark_group(format!("console_persons_{n}"));
    g.sample_size(10);
    g.bench_function("newest_50", |b| {
        b.iter(|| newest_persons(&f.trees, PROJECT, None, 50).unwrap())
    });
    g.bench_function("newest_50_email_icontains", |b| {
        b.iter(|| newest_persons(&f.trees, PROJECT, Some(&matcher), 50).unwrap())
    });
    g.bench_function("deepest_page_offset_9950", |b| {
        b.iter(|| newest_persons(&f.trees, PROJECT, None, 10_000).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
