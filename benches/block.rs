//! Event blocks (`store::block`): building blocks from a chunk of posthog-js
//! `$pageview`s (sort, cut, lay out by column and by property key, LZ4), and decoding
//! them as the sink does (every event) and as a person's events do (one event of each
//! block). Throughput is in events, or blocks for the latter; the stored bytes an event
//! are printed beside, so a layout change shows both its size and its cost.

#[path = "common/mod.rs"]
mod common;

use criterion::{criterion_group, Criterion, Throughput};
use flagpost::store::block::{self, Block, Entry, Rows};
use uuid::Uuid;

use common::{distinct_id, random_uuid, NOW_MS};

/// A compactor chunk's worth of events.
const EVENTS: usize = 1024;
/// Persons sending them: a few events each, as on a busy site.
const PERSONS: usize = 200;

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
    let mut group = c.benchmark_group("block");
    group.throughput(Throughput::Elements(EVENTS as u64));
    group.bench_function("build", |b| b.iter(|| block::build(chunk.clone())));
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
