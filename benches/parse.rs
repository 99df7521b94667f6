//! From decoded JSON to write-ahead log records (`capture`): `parse` (simd-json, in
//! place, to a tape), `Payload::key`, `normalise_event` of each event and
//! `Record::encode`, for one ~600-byte `$pageview` and for a posthog batch of 100.
//! Each stage is measured on its own, and the whole chain as the capture handler runs
//! it (`encode_event` writes each event straight into its record), which is what a
//! capture request pays before it queues for the log; `all_edge` is the same chain in
//! edge mode (`encode_fixed`: uuid, corrected timestamp, `$ignore_sent_at`, `$sent_at`
//! and `$ip` written into each event), beside it. Throughput is in events.

#[path = "common/mod.rs"]
mod common;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use flagpost::capture::{self, Context, Encoded, Fixing, Outcome};
use serde_json::{json, Value};

use common::{pageview, API_KEY, NOW_MS};

/// posthog-js and the server SDKs flush at most this many events per batch.
const BATCH_EVENTS: usize = 100;

/// The request-level facts of a capture request from a browser.
fn context() -> Context {
    Context {
        project: 1,
        now: NOW_MS + 250,
        sent_at: Some(NOW_MS + 200),
        historical: false,
        ip: Some("81.2.69.160".parse().expect("an address")),
    }
}

/// `{api_key, batch, sent_at}` as the SDKs send it.
fn batch() -> Vec<u8> {
    let events: Vec<Value> = (0..BATCH_EVENTS)
        .map(|n| {
            let mut e = pageview(n);
            e.as_object_mut().expect("an object").remove("api_key");
            e
        })
        .collect();
    let sent_at = flagpost::support::clock::format_ms(NOW_MS + 200);
    json!({"api_key": API_KEY, "batch": events, "sent_at": sent_at})
        .to_string()
        .into_bytes()
}

/// Everything the capture handler does between decoding and the log: it writes each
/// event straight into its encoded record (`encode_event`, or in edge mode a
/// `Fixer`'s, made once per request).
fn records(bytes: &mut [u8], ctx: &Context, edge: Option<Fixing>) -> Vec<Vec<u8>> {
    let payload = capture::parse(bytes, false).expect("parses");
    assert_eq!(payload.key().expect("has a key"), API_KEY);
    let fixer = edge.map(|fixing| capture::Fixer::new(ctx, fixing));
    payload
        .events()
        .map(|event| {
            let encoded = match &fixer {
                None => capture::encode_event(event, ctx),
                Some(fixer) => fixer.encode(event),
            };
            match encoded.expect("valid") {
                Encoded::Keep(record) => record,
                Encoded::Drop(reason) => panic!("dropped: {}", reason.as_str()),
            }
        })
        .collect()
}

/// Benchmarks of one body with `events` events.
fn stages(c: &mut Criterion, name: &str, body: &[u8], events: usize) {
    let ctx = context();
    let mut parsed = body.to_vec();
    let payload = capture::parse(&mut parsed, false).expect("parses");
    assert_eq!(payload.len(), events);
    let mut group = c.benchmark_group(format!("parse/{name}"));
    group.throughput(Throughput::Elements(events as u64));
    // The parser works in place, so each iteration gets a fresh copy of the body.
    group.bench_function("parse", |b| {
        b.iter_batched_ref(
            || body.to_vec(),
            |bytes| capture::parse(bytes, false).expect("parses").len(),
            BatchSize::SmallInput,
        )
    });
    group.bench_function("key", |b| {
        b.iter(|| payload.key().expect("has a key").len())
    });
    // Normalising reads the parsed payload, which stays as it is.
    group.bench_function("normalise", |b| {
        b.iter(|| {
            payload
                .events()
                .map(|e| capture::normalise_event(e, &ctx).expect("valid"))
                .collect::<Vec<Outcome>>()
        })
    });
    let kept: Vec<_> = payload
        .events()
        .map(
            |e| match capture::normalise_event(e, &ctx).expect("valid") {
                Outcome::Keep(record) => record,
                Outcome::Drop(reason) => panic!("dropped: {}", reason.as_str()),
            },
        )
        .collect();
    group.bench_function("encode", |b| {
        b.iter(|| kept.iter().map(|r| r.encode()).collect::<Vec<_>>())
    });
    group.bench_function("all", |b| {
        b.iter_batched_ref(
            || body.to_vec(),
            |bytes| records(bytes, &ctx, None),
            BatchSize::SmallInput,
        )
    });
    group.bench_function("all_edge", |b| {
        b.iter_batched_ref(
            || body.to_vec(),
            |bytes| records(bytes, &ctx, Some(Fixing::default())),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn parse(c: &mut Criterion) {
    let event = pageview(0).to_string().into_bytes();
    stages(c, "event", &event, 1);
    stages(c, "batch100", &batch(), BATCH_EVENTS);
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = parse
}
criterion_main!(benches);
