//! Event blocks (`store::block`): building blocks from a chunk of posthog-js
//! `$pageview`s (sort, cut, lay out by column and by property key, LZ4), and decoding
//! them as the sink does (every event) and as a person's events do (one event of each
//! block). Throughput is in events, or blocks for the latter; the stored bytes an event
//! are printed beside, so a layout change shows both its size and its cost.
//!
//! Also timed: the console's filter by a property, a block without the key told from
//! its key dictionary and one with it read for that key's column.
//!
//! Also printed: the same for a chunk of the load harness's scale traffic (every
//! event from another person, random uuids, as at 20 M events and 1 M persons), and
//! for both chunks where an event's stored bytes go, part by part: what the blocks
//! save when that part is made the same in every event.

#[path = "common/mod.rs"]
mod common;

use criterion::{criterion_group, Criterion, Throughput};
use flagpost::store::block::{self, Block, Entry, Rows};
use uuid::Uuid;

use common::{distinct_id, random_uuid, NOW_MS};

/// The scale traffic's key, as the load harness's `flags` module names it.
mod flags {
    pub const API_KEY: &str = "phc_load_test_project";
}

#[allow(dead_code)]
#[path = "load/scale_events.rs"]
mod scale_events;

/// A compactor chunk's worth of events.
const EVENTS: usize = 1024;
/// Persons sending them: a few events each, as on a busy site.
const PERSONS: usize = 200;
/// The scale chunk's run: the harness's `--scale-events 20000000 --scale-persons
/// 1000000`, of which the chunk is taken from the middle.
const SCALE_EVENTS: u64 = 20_000_000;
const SCALE_PERSONS: u64 = 1_000_000;
/// The project the harness's persons are made in (their ids derive from it).
const PROJECT: u64 = 1;
/// Events a batch of the harness arrives apart, in ms (about 50,000 events a second).
const BATCH_MS: i64 = 2;

fn entries() -> Vec<Entry> {
    (0..EVENTS)
        .map(|i| {
            let person = i * 7_919 % PERSONS;
            let at = NOW_MS + i as i64 * 37;
            // A person keeps its device and session ids from event to event.
            let ids = [
                random_uuid(at, i as u64),
                random_uuid(NOW_MS, person as u64 * 2),
                random_uuid(NOW_MS, person as u64 * 2 + 1),
            ];
            let event = common::pageview_event(person, at, ids, common::API_KEY);
            Entry {
                timestamp: at,
                created_at: at + 40,
                uuid: ids[0],
                person_id: Some(Uuid::from_u128(person as u128 * 0x9e37_79b9_7f4a_7c15)),
                event: "$pageview".into(),
                distinct_id: distinct_id(person),
                properties: serde_json::to_vec(&event["properties"]).expect("JSON"),
            }
        })
        .collect()
}

/// A chunk of the scale traffic as the server stores it: each person made for their
/// anonymous id, which `$identify` then merges their user id into.
fn scale_entries() -> Vec<Entry> {
    use std::io::Read;
    let traffic = scale_events::Traffic::new(SCALE_EVENTS, SCALE_PERSONS, NOW_MS);
    let first = traffic.batches() / 2;
    let mut out = Vec::with_capacity(EVENTS);
    for b in first..first + (EVENTS as u64).div_ceil(scale_events::BATCH_EVENTS) {
        let mut json = Vec::new();
        flate2::read::GzDecoder::new(&traffic.body(b, NOW_MS)[..])
            .read_to_end(&mut json)
            .expect("gzip");
        let body: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
        let arrived = NOW_MS + (b - first) as i64 * BATCH_MS;
        for event in body["batch"].as_array().expect("a batch") {
            let text = |key: &str| event[key].as_str().expect("a string").to_owned();
            let distinct_id = text("distinct_id");
            let anonymous = distinct_id.replace("user-", "anon-");
            let timestamp = time::OffsetDateTime::parse(
                &text("timestamp"),
                &time::format_description::well_known::Rfc3339,
            )
            .expect("a time");
            out.push(Entry {
                timestamp: (timestamp.unix_timestamp_nanos() / 1_000_000) as i64,
                created_at: arrived,
                uuid: text("uuid").parse().expect("a uuid"),
                person_id: Some(flagpost::persons::id_for(PROJECT, &anonymous)),
                event: text("event"),
                distinct_id,
                properties: serde_json::to_vec(&event["properties"]).expect("JSON"),
            });
        }
    }
    out.truncate(EVENTS);
    out
}

fn stored(chunk: &[Entry]) -> usize {
    let built = block::build(chunk.to_vec());
    built.iter().map(|(_, v)| v.len()).sum()
}

/// Where an event's stored bytes go: for each part, the bytes an event the blocks
/// save when that part is the same in every event (each alone, the rest as it is).
fn parts(name: &str, chunk: &[Entry]) {
    let total = stored(chunk);
    let per_event = |bytes: usize| bytes as f64 / chunk.len() as f64;
    let saved = |change: &dyn Fn(&mut Entry)| {
        let mut changed = chunk.to_vec();
        changed.iter_mut().for_each(change);
        per_event(total) - per_event(stored(&changed))
    };
    let first = chunk[0].clone();
    let mut rows: Vec<(String, f64)> = vec![
        ("uuid".into(), saved(&|e| e.uuid = first.uuid)),
        ("time".into(), saved(&|e| e.timestamp = first.timestamp)),
        ("created_at".into(), saved(&|e| e.created_at = e.timestamp)),
        ("person".into(), saved(&|e| e.person_id = first.person_id)),
        ("name".into(), saved(&|e| e.event = first.event.clone())),
        (
            "distinct id".into(),
            saved(&|e| e.distinct_id = first.distinct_id.clone()),
        ),
    ];
    let object = |e: &Entry| -> serde_json::Map<String, serde_json::Value> {
        serde_json::from_slice(&e.properties).unwrap_or_default()
    };
    for (key, value) in object(&first) {
        let change = |e: &mut Entry| {
            let mut properties = object(e);
            if let Some(v) = properties.get_mut(&key) {
                *v = value.clone();
            }
            e.properties = serde_json::to_vec(&properties).expect("JSON");
        };
        rows.push((format!("properties.{key}"), saved(&change)));
    }
    let parts: f64 = rows.iter().map(|r| r.1).sum();
    rows.push(("the rest".into(), per_event(total) - parts));
    println!(
        "{name}: {:.1} stored bytes an event, of which",
        per_event(total)
    );
    for (part, bytes) in rows {
        println!("  {part:<28} {bytes:>6.1}");
    }
}

fn blocks(c: &mut Criterion) {
    let chunk = entries();
    let built = block::build(chunk.clone());
    let stored: usize = built.iter().map(|(_, v)| v.len()).sum();
    let json: usize = chunk.iter().map(|e| e.properties.len()).sum();
    println!(
        "{} events in {} blocks: {:.1} stored bytes an event ({:.0} bytes of properties JSON)",
        EVENTS,
        built.len(),
        stored as f64 / EVENTS as f64,
        json as f64 / EVENTS as f64
    );
    let scale = scale_entries();
    let scale_json: usize = scale.iter().map(|e| e.properties.len()).sum();
    println!(
        "scale traffic: {} events, {:.0} bytes of properties JSON each",
        scale.len(),
        scale_json as f64 / scale.len() as f64
    );
    parts("a site's pageviews", &chunk);
    parts("the scale traffic", &scale);
    let mut group = c.benchmark_group("block");
    group.throughput(Throughput::Elements(EVENTS as u64));
    group.bench_function("build", |b| b.iter(|| block::build(chunk.clone())));
    group.bench_function("build, scale traffic", |b| {
        b.iter(|| block::build(scale.clone()))
    });
    group.bench_function("decode", |b| {
        b.iter(|| {
            let mut bytes = 0;
            for (_, value) in &built {
                let block = Block::decode(value).expect("a block decodes");
                for h in block.heads() {
                    bytes += block.properties(h).len();
                }
            }
            assert_eq!(bytes, json);
            bytes
        })
    });
    group.finish();
    // A person's events use one event or two of each block they read.
    let mut group = c.benchmark_group("block, one event of each");
    group.throughput(Throughput::Elements(built.len() as u64));
    group.bench_function("decode whole", |b| {
        b.iter(|| {
            let mut events = Vec::with_capacity(built.len());
            for (_, value) in &built {
                let block = Block::decode(value).expect("a block decodes");
                events.push(block.stored(&block.heads()[0]));
            }
            events
        })
    });
    group.bench_function("decode rows", |b| {
        b.iter(|| {
            let mut events = Vec::with_capacity(built.len());
            for (_, value) in &built {
                let rows = Rows::decode(value).expect("a block decodes");
                events.push(rows.stored(0).expect("the block has an event"));
            }
            events
        })
    });
    group.finish();
    // The console's filter by a property: a block without the key is told from its
    // key dictionary; one with it has that key's column read, event by event.
    let mut group = c.benchmark_group("block, a property of each");
    group.throughput(Throughput::Elements(built.len() as u64));
    group.bench_function("key dictionary, key absent", |b| {
        b.iter(|| {
            let absent = built
                .iter()
                .filter(|(_, v)| block::may_hold_key(v, "alias") == Some(false));
            assert_eq!(absent.count(), built.len());
        })
    });
    group.bench_function("key dictionary, key present", |b| {
        b.iter(|| {
            let named = built
                .iter()
                .filter(|(_, v)| block::may_hold_key(v, "$current_url") == Some(true));
            assert_eq!(named.count(), built.len());
        })
    });
    group.bench_function("decode rows, read the key's column", |b| {
        b.iter(|| {
            let mut bytes = 0;
            let mut text = Vec::new();
            for (_, value) in &built {
                let rows = Rows::decode(value).expect("a block decodes");
                let column = rows.column("$current_url").expect("layout 4");
                for i in 0..rows.heads().len() {
                    text.clear();
                    assert_eq!(column.value(i, &mut text), block::Cell::Value);
                    bytes += text.len();
                }
            }
            bytes
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = blocks
}

fn main() {
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
