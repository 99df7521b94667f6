//! Edge mode's forwarder, its encoding alone: a window of 10,000 posthog-js
//! `$pageview`s from their stored blocks to gzip'd `/batch/` bodies of 1000 events,
//! the way it was done before issue 40's fifth round (each block decoded whole with
//! its properties joined, each event's text made apart, the body assembled from them)
//! and the way it is now (`forward::batch`: each block's rows written straight into
//! one buffer, a body copied from it in one run), both gzip'd by flate2 at level 1.
//! Both in one process on the same blocks, so the figure is the encoding's CPU, which
//! a drain's wall clock on shared cores hides; callgrind counts it where the cores
//! are too busy for the wall clock.

#[path = "common/mod.rs"]
mod common;

use std::io::Write;

use criterion::{criterion_group, Criterion, Throughput};
use flagpost::edge::forward::batch::{self, Lines};
use flagpost::store::block::{self, Block, Entry, Rows};

use common::{distinct_id, random_uuid, NOW_MS};

/// A forwarder window's worth of events.
const EVENTS: usize = 10_000;
/// Persons sending them, as the load harness's 25,600.
const PERSONS: usize = 25_600;

fn values() -> Vec<Vec<u8>> {
    let entries: Vec<Entry> = (0..EVENTS)
        .map(|i| {
            let person = i * 7_919 % PERSONS;
            let at = NOW_MS + i as i64;
            let ids = [
                common::uuid(at, i as u64),
                random_uuid(at, i as u64 * 2),
                random_uuid(at, i as u64 * 2 + 1),
            ];
            let event = common::pageview_event(person, at, ids, common::API_KEY);
            Entry {
                timestamp: at,
                created_at: at + 40,
                uuid: ids[0],
                person_id: None,
                event: "$pageview".into(),
                distinct_id: distinct_id(person),
                properties: serde_json::to_vec(&event["properties"]).expect("JSON"),
            }
        })
        .collect();
    block::build(entries).into_iter().map(|(_, v)| v).collect()
}

/// The bodies as they were made before.
fn before(values: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut lines: Vec<Vec<u8>> = Vec::new();
    for v in values {
        let block = Block::decode(v).expect("a block");
        for h in block.heads() {
            let properties = block.properties(h);
            let mut json = Vec::with_capacity(properties.len() + 160);
            json.extend_from_slice(b"{\"uuid\":\"");
            json.extend_from_slice(h.uuid.hyphenated().to_string().as_bytes());
            json.extend_from_slice(b"\",\"event\":");
            serde_json::to_writer(&mut json, block.event(h)).expect("JSON");
            json.extend_from_slice(b",\"distinct_id\":");
            serde_json::to_writer(&mut json, block.distinct_id(h)).expect("JSON");
            json.extend_from_slice(b",\"timestamp\":\"");
            flagpost::support::clock::write_ms(&mut json, h.timestamp);
            json.extend_from_slice(b"\",\"properties\":");
            json.extend_from_slice(properties);
            json.push(b'}');
            lines.push(json);
        }
    }
    lines
        .chunks(batch::MAX_EVENTS)
        .map(|part| {
            let size = part.iter().map(|e| e.len() + 1).sum::<usize>() + 160;
            let mut json = Vec::with_capacity(size);
            json.extend_from_slice(
                br#"{"api_key":"phc_k","historical_migration":false,"sent_at":""#,
            );
            flagpost::support::clock::write_ms(&mut json, NOW_MS);
            json.extend_from_slice(br#"","batch":["#);
            json.extend_from_slice(&part.join(&b","[..]));
            json.extend_from_slice(b"]}");
            let mut gz = flate2::write::GzEncoder::new(
                Vec::with_capacity(json.len() / 4),
                flate2::Compression::fast(),
            );
            gz.write_all(&json).expect("gzip");
            gz.finish().expect("gzip")
        })
        .collect()
}

/// The bodies as the forwarder makes them now.
fn now(values: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut lines = Lines::new();
    for v in values {
        lines.push_rows(&Rows::decode(v).expect("a block"));
    }
    batch::parts(&lines, 0, batch::MAX_BODY_BYTES)
        .iter()
        .map(|(events, historical)| batch::body("phc_k", *historical, NOW_MS, &lines, events))
        .collect()
}

fn forward(c: &mut Criterion) {
    let values = values();
    let (old, new) = (before(&values), now(&values));
    let size = |bodies: &[Vec<u8>]| bodies.iter().map(Vec::len).sum::<usize>();
    println!(
        "{} blocks; gzip'd bodies: {} bytes before, {} now",
        values.len(),
        size(&old),
        size(&new),
    );
    let mut group = c.benchmark_group("forward");
    group.throughput(Throughput::Elements(EVENTS as u64));
    group.bench_function("window/before", |b| b.iter(|| before(&values)));
    group.bench_function("window/now", |b| b.iter(|| now(&values)));
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = forward
}

fn main() {
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
