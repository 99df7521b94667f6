//! The compactor (`compactor`): one `Compactor::step` over a log holding 1024
//! records (32 log entries of 32, as group commit writes them under load), the chunk
//! one realtime step takes. Events are `$pageview`s from an address GeoIP locates:
//! (a) with `$process_person_profile: false`, so only the event is stored, and (b) with
//! `$set` and `$set_once` on every event and eight `$identify` merges of an anonymous
//! person into an identified one per step. Every step sees fresh uuids and distinct
//! ids, so nothing is deduplicated or diverted to the overflow lane; and (c) with 20
//! or 40 of the properties posthog-js sets on a person (`common::person_properties`),
//! by returning users (each step's users are the ones before, two of their properties
//! changing with the page) or new ones, with the persons' index by property kept and
//! not (`compactor::BY_PROPERTY_WRITES`): what keeping it costs. The database and the
//! log live under the target dir. Throughput is in events.

#[path = "common/mod.rs"]
mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use arc_swap::ArcSwap;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, SamplingMode, Throughput};
use flagpost::compactor::{Compactor, BY_PROPERTY_WRITES};
use flagpost::config::{Compaction, DEFAULT_LOG_SEGMENT_BYTES};
use flagpost::geoip;
use flagpost::log;
use flagpost::log::record::encode_frame;
use flagpost::log::Record;
use flagpost::projects::Projects;
use flagpost::store::Trees;
use serde_json::json;

use common::{pageview, uuid, API_KEY, NOW_MS};

// The server's allocator (src/main.rs), so the figures are those of the code that runs:
// allocation is a large share of a step, and glibc malloc is much slower at it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The compactor's realtime chunk.
const STEP_RECORDS: usize = 1024;
/// Records per log entry: a group commit of 32 concurrent single-event requests.
const ENTRY_RECORDS: usize = 32;
/// Persons per step, each sending `STEP_RECORDS / USERS` events.
const USERS: usize = 128;
/// One user in this many starts anonymous, becomes known, then identifies: a merge.
const MERGE_EVERY: usize = 16;
/// A step takes milliseconds: fewer, flat samples keep the benchmark to a few seconds.
const SAMPLES: usize = 20;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Persons {
    Off,
    On,
    /// Persons of this many properties, returning from step to step or new.
    Many {
        properties: usize,
        returning: bool,
    },
}

/// A compactor on a fresh database under the target dir.
struct Fixture {
    log: log::Appender,
    trees: Trees,
    compactor: Compactor,
    /// Steps filled so far: the source of fresh uuids and distinct ids.
    fills: usize,
    _dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let (dir, db) = common::open_db("flagpost-bench-compactor-");
        let trees = Trees::open(&db, dir.path()).expect("the trees open");
        let projects = format!(r#"{{"projects":[{{"id":1,"api_key":"{API_KEY}"}}]}}"#);
        let projects = Projects::parse(projects.as_bytes()).expect("valid projects");
        let mmdb =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/GeoIP2-City-Test.mmdb");
        let geoip = geoip::Database::open(&mmdb).expect("the test GeoIP database opens");
        let (log, reader, preparer) = log::open(
            &dir.path().join(log::DIR_NAME),
            1,
            None,
            DEFAULT_LOG_SEGMENT_BYTES,
        )
        .expect("the log opens");
        // Segments are then made as the fill needs them, outside the measured step.
        preparer.stop();
        drop(db);
        let compactor = Compactor::new(
            trees.clone(),
            reader,
            Arc::new(ArcSwap::from_pointee(projects)),
            Compaction::default(),
            Arc::new(geoip),
        );
        Fixture {
            log,
            trees,
            compactor,
            fills: 0,
            _dir: dir,
        }
    }

    /// Append one step's worth of records to the log, as the writer does.
    fn fill(&mut self, persons: Persons) {
        let records: Vec<Vec<u8>> = (0..STEP_RECORDS)
            .map(|i| record(self.fills, i, persons).encode())
            .collect();
        for entry in records.chunks(ENTRY_RECORDS) {
            let frame = encode_frame(entry.iter().map(Vec::as_slice));
            self.log.push(&frame).expect("log append");
        }
        self.log.commit().expect("log sync");
        self.fills += 1;
    }
}

/// The `i`th record of fill `fill`. Users' events interleave, as live traffic does.
fn record(fill: usize, i: usize, persons: Persons) -> Record {
    let (user, nth) = (i % USERS, i / USERS);
    let person = match persons {
        Persons::Many {
            returning: true, ..
        } => user,
        _ => fill * USERS + user,
    };
    let merges = persons == Persons::On && user % MERGE_EVERY == 0;
    let known = format!("user-{person:08}");
    let anon = format!("anon-{person:08}");
    // A merging user: three anonymous events, three known, identify, one more known.
    let distinct_id = if merges && nth < 3 { &anon } else { &known };
    let at = NOW_MS + (fill * STEP_RECORDS + i) as i64;
    let mut event = pageview(person);
    event["distinct_id"] = distinct_id.as_str().into();
    event["properties"]["distinct_id"] = distinct_id.as_str().into();
    let properties = &mut event["properties"];
    match persons {
        Persons::Off => properties["$process_person_profile"] = false.into(),
        Persons::On => {
            let plan = ["free", "pro", "enterprise"][person % 3];
            properties["$set"] = json!({
                "plan": plan,
                "seats": person % 40,
                "last_page": properties["$pathname"].clone(),
            });
            properties["$set_once"] = json!({
                "$initial_referrer": "$direct",
                "$initial_current_url": properties["$current_url"].clone(),
            });
        }
        Persons::Many {
            properties: count, ..
        } => {
            let all = common::person_properties(person, fill * 8 + nth, count);
            let (once, set): (Vec<_>, Vec<_>) = all
                .into_iter()
                .partition(|(k, _)| k.starts_with("$initial_"));
            properties["$set"] = serde_json::Value::Object(set.into_iter().collect());
            properties["$set_once"] = serde_json::Value::Object(once.into_iter().collect());
        }
    }
    if merges && nth == 6 {
        event["event"] = "$identify".into();
        event["properties"]["$anon_distinct_id"] = anon.as_str().into();
        event["properties"]["$set"]["email"] = format!("{known}@example.com").into();
    }
    let name = event["event"].as_str().expect("a name").to_owned();
    let id = uuid(at, (fill * STEP_RECORDS + i) as u64);
    event["uuid"] = id.to_string().into();
    Record {
        project: 1,
        received_at: at,
        timestamp: at,
        sent_at: None,
        uuid: id,
        historical: false,
        ip: Some("81.2.69.160".parse().expect("an address")),
        event: name,
        distinct_id: distinct_id.clone(),
        data: serde_json::to_vec(&event).expect("serialises"),
    }
}

fn step(c: &mut Criterion) {
    let mut group = c.benchmark_group("compactor/step");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(SAMPLES)
        .throughput(Throughput::Elements(STEP_RECORDS as u64));
    let many = |properties, returning| Persons::Many {
        properties,
        returning,
    };
    let variants = [
        ("1024 events, no persons", Persons::Off, true),
        ("1024 events, persons", Persons::On, true),
        ("20 properties, returning, index", many(20, true), true),
        ("20 properties, returning, no index", many(20, true), false),
        ("40 properties, returning, index", many(40, true), true),
        ("40 properties, returning, no index", many(40, true), false),
        ("40 properties, new, index", many(40, false), true),
        ("40 properties, new, no index", many(40, false), false),
    ];
    let only = std::env::var("COMPACTOR_BENCH_ONLY").unwrap_or_default();
    for (name, persons, index) in variants {
        if !name.contains(only.as_str()) {
            continue;
        }
        BY_PROPERTY_WRITES.store(index, Ordering::Relaxed);
        let mut fixture = Fixture::new();
        let fixture = &mut fixture;
        group.bench_function(name, |b| {
            // A cell rather than two closures borrowing the fixture: the setup fills
            // the log, the routine steps the compactor over it.
            let cell = std::cell::RefCell::new(&mut *fixture);
            b.iter_batched(
                || cell.borrow_mut().fill(persons),
                |()| {
                    let report = cell
                        .borrow_mut()
                        .compactor
                        .step()
                        .expect("the step commits");
                    assert_eq!(
                        report.realtime, STEP_RECORDS,
                        "one step takes the whole log"
                    );
                },
                BatchSize::PerIteration,
            )
        });
        let stats = fixture.compactor.stats();
        assert_eq!(stats.duplicates.load(Ordering::Relaxed), 0);
        assert_eq!(stats.to_overflow.load(Ordering::Relaxed), 0);
        println!(
            "compactor/step/{name}: {} events applied, {} persons stored",
            stats.applied.load(Ordering::Relaxed),
            fixture.trees.persons.iter().count()
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = step
}
criterion_main!(benches);
