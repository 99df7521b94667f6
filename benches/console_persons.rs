//! The console's persons pages over a large project (`http::console::persons`): a
//! database holding N persons (1 million unless `PERSONS_BENCH_N` says otherwise),
//! each stored as the compactor stores one (JSON under project and id, ids PostHog's
//! UUIDv5 of the distinct id, its distinct id linked) and folded into the persons'
//! and distinct ids' runs, with the dozen properties posthog-js sets on a first visit
//! (about 700 bytes). Then the first-seen index is built as an older database gets it
//! and folded into its run (the times and the run's size printed), and the reads the persons page
//! makes are timed through it: the newest 50, the newest 50 whose email contains a
//! text, the page 10,000 deep, a property search that matches no one (so it examines
//! its whole bound), and a distinct id prefix. The scans the page made without the
//! index are timed once each beside them (`PERSONS_BENCH_SCAN=0` skips them: at a
//! million persons they take about a minute), and so is the first search, before the
//! persons it reads are kept (`store::person_bytes`). Then the index of persons by
//! property is built and folded the same way (times and bytes printed), and searches
//! answered from it are timed: an email containing one person's id (every person has
//! an email, so the whole key is read), a plan no one has, a regex of a URL, and
//! negative tests no one passes (the persons without the key are found too), and an
//! email containing another person's id each time; beside them, a read of the email
//! key's entries through the table's iterator, and the bytes the index's runs keep in
//! memory before and after the searches (the notes of the blocks they read). Last, the
//! text searches' first run after a fold that writes the email key's parts again and
//! after a restart (the tables opened again), each once (the fold's thread CPU and
//! bytes written printed), and the store's memory holders and the resident set.

use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion};
use flagpost::http::console::find::Matcher;
use flagpost::http::console::persons::{
    by_index, by_prefix, newest, newest_persons, Span, MAX_PERSONS_EXAMINED, MAX_PERSONS_SCANNED,
};
use flagpost::http::params::Params;
use flagpost::persons::{self, Person};
use flagpost::store::layered::{Layered, Take};
use flagpost::store::rollup::backfill::Step;
use flagpost::store::{by_property, first_seen, keys, memory, person_bytes, Trees};
use serde_json::json;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PROJECT: u64 = 1;
/// Persons written per sled batch while filling.
const BATCH: u64 = 10_000;

struct Filled {
    dir: tempfile::TempDir,
    db: sled::Db,
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
        let (mut people, mut ids) = (Vec::new(), Vec::new());
        for i in first..(first + BATCH).min(n) {
            let p = person(i);
            let value = serde_json::to_vec(&p).unwrap();
            bytes += value.len();
            people.push((keys::with_uuid(PROJECT, p.id)[..].into(), value.into()));
            ids.push((
                keys::with_str(PROJECT, &p.distinct_ids[0]).into(),
                p.id.as_bytes()[..].into(),
            ));
        }
        trees.persons.write(people).unwrap();
        trees.distinct_ids.write(ids).unwrap();
    }
    db.flush().unwrap();
    // Into the sorted runs, where the compactor's folds keep all but recent changes.
    // Folded whole: a served database keeps at most an eighth of its persons' bytes
    // in the delta (`layered::FOLD_SHARE`), and a page of persons read from the delta
    // costs a map lookup instead of a run's block.
    while trees.persons.delta_len() > 0 || trees.distinct_ids.delta_len() > 0 {
        trees.persons.fold().unwrap();
        trees.distinct_ids.fold().unwrap();
    }
    eprintln!(
        "{n} persons, {} bytes each on average, written in {:.1} s",
        bytes as u64 / n.max(1),
        started.elapsed().as_secs_f64()
    );
    build_index(&trees, n);
    Filled { dir, db, trees }
}

/// Build the first-seen index as an older database gets it, then fold it into its run
/// as the compactor does, printing how long each took and what the run takes on disk.
fn build_index(trees: &Trees, n: u64) {
    let started = Instant::now();
    first_seen::start_build(trees).unwrap();
    let build = first_seen::Build::new(trees);
    while build.step(trees).unwrap() != Step::Done {}
    fold_index("first-seen index", &trees.first_seen, started, n);
}

/// Fold an index built since `started` into its run, printing the times and bytes.
fn fold_index(name: &str, table: &Layered, started: Instant, n: u64) {
    let took = started.elapsed().as_secs_f64();
    let started = Instant::now();
    while table.delta_len() > 0 {
        fold(table, Take::Due);
    }
    let folded = started.elapsed().as_secs_f64();
    let run = table.run().unwrap();
    eprintln!(
        "{name} of {} keys built in {took:.1} s, folded in {folded:.1} s: its run {} bytes \
         ({:.1} bytes a person)",
        run.entries(),
        run.file_bytes(),
        run.file_bytes() as f64 / n.max(1) as f64
    );
}

/// Build the index of persons by property as an older database gets it, and fold it.
fn build_by_property(trees: &Trees, n: u64) {
    let started = Instant::now();
    by_property::start_build(trees).unwrap();
    let build = by_property::Build::new(trees);
    while build.step(trees).unwrap() != Step::Done {
        // The compactor folds as the build goes: the delta stays bounded.
        if trees.by_property.should_fold() {
            fold(&trees.by_property, Take::Due);
        }
    }
    fold_index("index by property", &trees.by_property, started, n);
    let (cpu, bytes) = FOLDS.with(|f| f.take());
    eprintln!(
        "index by property's folds: {cpu:.2} s of the fold thread's CPU, {bytes} bytes written"
    );
}

thread_local! {
    /// The CPU seconds and bytes written of the folds on this thread since last taken.
    static FOLDS: std::cell::Cell<(f64, u64)> = const { std::cell::Cell::new((0.0, 0)) };
}

/// This thread's CPU time, seconds.
fn thread_cpu() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to write.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// Fold `table`, counting its CPU time and bytes written in [`FOLDS`].
fn fold(table: &Layered, take: Take) {
    let cpu = thread_cpu();
    let folded = table.fold_taking(take).unwrap();
    let spent = thread_cpu() - cpu;
    FOLDS.with(|f| {
        let (c, b) = f.get();
        f.set((c + spent, b + folded.written_bytes));
    });
}

/// Once each, the passes the page made without the index (what main's build does).
fn scans(f: &Filled, matcher: &Matcher) {
    for (name, test, keep) in [
        ("scan: newest 50", None, 50),
        ("scan: newest 50 email icontains", Some(matcher), 50),
        ("scan: offset 9,950", None, 10_000),
    ] {
        let started = Instant::now();
        let (found, scanned, _) = newest_persons(&f.trees, PROJECT, test, keep).unwrap();
        eprintln!(
            "{name}: {:.2} s ({} found, {scanned} examined)",
            started.elapsed().as_secs_f64(),
            found.len()
        );
    }
}

fn span(cursor: Option<Vec<u8>>, offset: usize, limit: usize) -> Span {
    Span {
        cursor,
        offset,
        limit,
        examine: MAX_PERSONS_EXAMINED,
    }
}

fn bench(c: &mut Criterion) {
    let n: u64 = std::env::var("PERSONS_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    assert!(
        n as usize <= MAX_PERSONS_SCANNED,
        "the bound would cut the scan short"
    );
    let f = fill(n);
    let contains = Params::parse(Some("property=email&operator=icontains&value=GLOBEX"));
    let matcher = Matcher::from_params(&contains).unwrap().unwrap();
    let nobody = Params::parse(Some("property=plan&value=enterprise"));
    let nobody = Matcher::from_params(&nobody).unwrap().unwrap();
    if std::env::var("PERSONS_BENCH_SCAN").as_deref() != Ok("0") {
        scans(&f, &matcher);
    }
    // The first search after a start or a fold reads every person from the runs; the
    // ones after it find the newest persons kept (`store::person_bytes`), which is
    // what the timings below measure.
    let started = Instant::now();
    let cold = newest(&f.trees, PROJECT, Some(&nobody), span(None, 0, 50)).unwrap();
    eprintln!(
        "first search, nothing kept: {:.1} ms ({} examined); kept after it: {:?} (persons, bytes)",
        started.elapsed().as_secs_f64() * 1000.0,
        cold.examined,
        person_bytes::global().held()
    );
    // The cursor of the page 10,000 deep, as a reader paging on would hold it.
    let deep = newest(&f.trees, PROJECT, None, span(None, 9_999, 1)).unwrap();
    assert_eq!(deep.persons.len(), 1);
    let mut g = c.benchmark_group(format!("console_persons_{n}"));
    g.sample_size(10);
    g.bench_function("newest_50", |b| {
        b.iter(|| newest(&f.trees, PROJECT, None, span(None, 0, 50)).unwrap())
    });
    g.bench_function("newest_50_email_icontains", |b| {
        b.iter(|| newest(&f.trees, PROJECT, Some(&matcher), span(None, 0, 50)).unwrap())
    });
    g.bench_function("page_10000_deep_by_cursor", |b| {
        b.iter(|| newest(&f.trees, PROJECT, None, span(deep.next.clone(), 0, 50)).unwrap())
    });
    g.bench_function("offset_9950", |b| {
        b.iter(|| newest(&f.trees, PROJECT, None, span(None, 9_950, 50)).unwrap())
    });
    g.bench_function("property_matching_no_one_whole_bound", |b| {
        b.iter(|| {
            let page = newest(&f.trees, PROJECT, Some(&nobody), span(None, 0, 50)).unwrap();
            assert_eq!(page.examined, MAX_PERSONS_EXAMINED.min(n as usize));
            page
        })
    });
    g.bench_function("distinct_id_prefix_50", |b| {
        b.iter(|| by_prefix(&f.trees, PROJECT, "user-0001", None, 50).unwrap())
    });
    g.finish();
    build_by_property(&f.trees, n);
    let one = format!("property=email&operator=icontains&value=USER{}@", n / 2);
    let searches = [
        ("index_email_of_one", one.as_str()),
        ("index_plan_no_one", "property=plan&value=enterprise"),
        (
            "index_url_regex",
            "property=$initial_current_url&operator=regex&value=ref%3D96$",
        ),
        // Negative tests no one passes: the whole key's entries and the whole
        // first-seen index are read for the persons without the key.
        (
            "index_browser_is_not_chrome",
            "property=$initial_browser&operator=is_not&value=Chrome",
        ),
        (
            "index_email_not_icontains_example",
            "property=email&operator=not_icontains&value=example",
        ),
        ("index_plan_is_not_set", "property=plan&operator=is_not_set"),
        // A text no block's shared start or end holds: every block is read.
        (
            "index_email_not_icontains_at",
            "property=email&operator=not_icontains&value=%40",
        ),
    ];
    let notes = |when: &str| {
        let held = f.trees.by_property.run().map_or(0, |r| r.resident_bytes());
        eprintln!("index by property's runs {when}: {held} bytes in memory");
    };
    let emails = by_property::key_prefix(PROJECT, "email").unwrap();
    notes("before any search");
    noting_cost(&f.trees, &emails);
    let mut g = c.benchmark_group(format!("console_persons_by_property_{n}"));
    g.sample_size(10);
    // What reading the email key's entries cost through the table's iterator (main's
    // search before it read the blocks in place), beside the reads below.
    g.bench_function("iterator_over_the_email_key", |b| {
        b.iter(|| f.trees.by_property.scan_prefix(&emails).count())
    });
    for (name, query) in searches {
        let params = Params::parse(Some(query));
        let m = Matcher::from_params(&params).unwrap().unwrap();
        let started = Instant::now();
        let page = by_index(&f.trees, PROJECT, &m, span(None, 0, 50)).unwrap();
        eprintln!(
            "{name}: first search {:.1} ms, {} found, {} examined, complete {}",
            started.elapsed().as_secs_f64() * 1000.0,
            page.persons.len(),
            page.examined,
            page.complete
        );
        g.bench_function(name, |b| {
            b.iter(|| by_index(&f.trees, PROJECT, &m, span(None, 0, 50)).unwrap())
        });
    }
    // A different person's id each search: what the blocks' notes leave unread is not
    // an answer kept of one text.
    let mut i = 0;
    g.bench_function("index_email_of_another_each_time", |b| {
        b.iter(|| {
            i += 1;
            let id = (n / 3 + i * 7_919) % n;
            let query = format!("property=email&operator=icontains&value=USER{id}@");
            let m = Matcher::from_params(&Params::parse(Some(&query)));
            let page = by_index(&f.trees, PROJECT, &m.unwrap().unwrap(), span(None, 0, 50));
            assert_eq!(page.unwrap().persons.len(), 1);
        })
    });
    g.finish();
    notes("after the searches");
    let texts = [&searches[0], &searches[4], &searches[6]];
    // A fold that writes the email key's parts again (a hundredth of its entries
    // written again as they are), and the first search of each text after it.
    let again: Vec<_> = (f.trees.by_property.scan_prefix(&emails))
        .step_by(100)
        .map(|e| e.unwrap())
        .collect();
    f.trees.by_property.write(again).unwrap();
    fold(&f.trees.by_property, Take::Every);
    let (cpu, bytes) = FOLDS.with(|f| f.take());
    eprintln!("a fold of the email key's parts: {cpu:.2} s of CPU, {bytes} bytes written");
    first_searches(&f.trees, "after a fold", &texts);
    // A restart: the tables opened again from the database.
    let Filled { dir, db, trees } = f;
    drop(trees);
    let trees = Trees::open(&db, dir.path()).unwrap();
    first_searches(&trees, "after a restart", &texts);
    let held = trees.by_property.run().map_or(0, |r| r.resident_bytes());
    eprintln!("index by property's runs after them: {held} bytes in memory");
    let holders = memory::holders(&trees);
    let sum: u64 = holders.iter().map(|h| h.1).sum();
    eprintln!(
        "memory holders: {holders:?}, {sum} bytes; resident set {} bytes",
        flagpost::support::memory::resident_bytes()
    );
    drop((trees, db, dir));
}

/// What the fold's note of a block costs ([`by_property::NOTER`]), beside LZ4's
/// compression of the same block: a block of the email key's first entries, as a run
/// holds them (4 KiB), noted and compressed 20,000 times each.
fn noting_cost(trees: &Trees, emails: &[u8]) {
    let mut raw = Vec::new();
    for e in trees.by_property.scan_prefix(emails) {
        let (k, v) = e.unwrap();
        for part in [
            &(k.len() as u32).to_le_bytes()[..],
            &(v.len() as u32).to_le_bytes(),
            &k,
            &v,
        ] {
            raw.extend_from_slice(part);
        }
        if raw.len() >= 4096 {
            break;
        }
    }
    let mut note = Vec::new();
    let started = Instant::now();
    for _ in 0..20_000 {
        note.clear();
        (by_property::NOTER.note)(std::hint::black_box(&raw), &mut note);
    }
    let noted = started.elapsed().as_secs_f64() / 20_000.0 * 1e6;
    let started = Instant::now();
    for _ in 0..20_000 {
        std::hint::black_box(lz4_flex::block::compress(std::hint::black_box(&raw)));
    }
    let lz4 = started.elapsed().as_secs_f64() / 20_000.0 * 1e6;
    eprintln!(
        "a block of {} bytes: noted in {noted:.1} µs, compressed in {lz4:.1} µs",
        raw.len()
    );
}

/// Each search of `texts` (name, query) once, then again, timed and printed.
fn first_searches(trees: &Trees, when: &str, texts: &[&(&str, &str)]) {
    for (name, query) in texts {
        let m = Matcher::from_params(&Params::parse(Some(query)));
        let m = m.unwrap().unwrap();
        let ms = || {
            let started = Instant::now();
            let page = by_index(trees, PROJECT, &m, span(None, 0, 50)).unwrap();
            (started.elapsed().as_secs_f64() * 1000.0, page.persons.len())
        };
        let (first, found) = ms();
        let (second, _) = ms();
        eprintln!(
            "{name} {when}: first search {first:.1} ms, the next {second:.1} ms, {found} found"
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
