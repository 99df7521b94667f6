//! The ClickHouse sink's insert measurements, each against a `clickhouse-server` of
//! its own (Debian's package, started by the tests' starter,
//! `tests/integration/sink/server.rs`): measurements, not checks, so they are not part
//! of the test run.
//!
//! `cargo bench --bench sink_insert [-- formats | worker | options]` (all three when
//! none is named):
//! - `formats`: how fast the real server takes events as RowBinary (what the sink
//!   sends) against JSONEachRow (what a JSON-based client would send), encoding
//!   included: the figure behind choosing a hand-written RowBinary encoder;
//! - `worker`: the whole sink path on the sending side, outbox to acknowledgement;
//! - `options`: ways of sending the same events, side by side.

#[allow(dead_code)]
#[path = "../tests/integration/sink/server.rs"]
mod server;
/// The tests' HTTP helpers, which the ClickHouse starter uses.
#[allow(dead_code)]
#[path = "../tests/integration/util.rs"]
mod util;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use flagpost::config;
use flagpost::sink::rowbinary::RowBinary;
use flagpost::sink::rows::{EventRow, Origin};
use flagpost::sink::{Destination, Shape, Table};
use serde_json::json;
use uuid::Uuid;

use server::ClickHouse;

const MEASUREMENTS: [(&str, fn()); 3] = [
    ("formats", row_binary_against_json_each_row),
    ("worker", worker_events_per_second),
    ("options", insert_options),
];

fn main() -> ExitCode {
    // `cargo bench` passes `--bench`; anything else names a measurement.
    let named: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    for name in &named {
        if !MEASUREMENTS.iter().any(|(known, _)| known == name) {
            eprintln!("sink_insert: unknown measurement {name}: formats, worker or options");
            return ExitCode::FAILURE;
        }
    }
    if server::binary().is_none() {
        eprintln!(
            "sink_insert: this needs clickhouse-server: apt-get install clickhouse-server \
             (or set CLICKHOUSE_SERVER to its path)"
        );
        return ExitCode::FAILURE;
    }
    for (name, measure) in MEASUREMENTS {
        if named.is_empty() || named.iter().any(|n| n == name) {
            println!("== {name}");
            measure();
        }
    }
    ExitCode::SUCCESS
}

/// The sink's settings for a server and its database.
fn settings(ch: &ClickHouse) -> config::Sink {
    config::Sink {
        url: ch.url(),
        database: ch.database.clone(),
        user: server::USER.to_string(),
        password: server::PASSWORD.to_string(),
    }
}

/// Run `f` on a fresh single-threaded runtime.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// The sink's view of the server, tables created.
fn destination(ch: &ClickHouse) -> Destination {
    block_on(Destination::open(settings(ch))).expect("destination opens")
}

/// Events per insert: the sink's batch size.
const BATCH: usize = 10_000;
/// Batches per format and round.
const BATCHES: usize = 10;
/// Rounds, alternating the formats, so a merge in the background hurts both alike.
const ROUNDS: usize = 3;

/// A pageview's properties as posthog-js sends them, about 600 bytes of JSON.
fn properties(i: usize) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "$current_url": format!("https://example.com/products/{}", i % 500),
        "$host": "example.com", "$pathname": format!("/products/{}", i % 500),
        "$browser": "Chrome", "$browser_version": 120, "$os": "Mac OS X",
        "$device_type": "Desktop", "$screen_height": 1080, "$screen_width": 1920,
        "$lib": "web", "$lib_version": "1.96.1", "$insert_id": format!("{i:016x}"),
        "$referrer": "https://www.google.com/", "$referring_domain": "www.google.com",
        "$session_id": "018c2d1a-6b0e-7c6a-9a1e-3c2e0f6d9b41",
        "$window_id": "018c2d1a-6b0e-7c6a-9a1e-3c2e0f6d9b42",
        "$pageview_id": format!("018c2d1a-6b0e-7c6a-{i:04x}"),
        "utm_source": "newsletter", "plan": "pro", "$group_0": "acme",
    }))
    .unwrap()
}

struct Event {
    uuid: Uuid,
    distinct_id: String,
    properties: Vec<u8>,
    timestamp: i64,
}

fn events(n: usize) -> Vec<Event> {
    (0..n)
        .map(|i| Event {
            uuid: Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0000 | i as u128),
            distinct_id: format!("user-{}", i % 5000),
            properties: properties(i),
            timestamp: 1_700_000_000_000 + i as i64,
        })
        .collect()
}

fn row_binary(shape: Shape, batch: &[Event], salt: u128) -> Vec<u8> {
    let mut out = RowBinary::with_capacity(batch.len() * 800);
    for (i, e) in batch.iter().enumerate() {
        EventRow {
            uuid: salted(e.uuid, salt),
            event: "$pageview",
            properties: &e.properties,
            timestamp: e.timestamp,
            team_id: 1,
            distinct_id: &e.distinct_id,
            elements_chain: "",
            created_at: e.timestamp + 5,
            person_id: e.uuid,
            groups: ["acme", "", "", "", ""],
            origin: Origin {
                committed_ms: e.timestamp,
                offset: i as u64,
            },
        }
        .encode(shape, &mut out);
    }
    out.into_bytes()
}

/// Each round and format writes its own uuids, so the replacing engine's merges
/// have nothing to collapse and every insert is measured alike.
fn salted(id: Uuid, salt: u128) -> Uuid {
    Uuid::from_u128(id.as_u128() ^ (salt << 64))
}

/// The same rows as JSONEachRow, times as Unix seconds (which the server parses for
/// `DateTime`).
fn json_each_row(batch: &[Event], salt: u128) -> Vec<u8> {
    let mut out = Vec::with_capacity(batch.len() * 1000);
    for (i, e) in batch.iter().enumerate() {
        let props = std::str::from_utf8(&e.properties).unwrap();
        let row = json!({
            "uuid": salted(e.uuid, salt), "event": "$pageview", "properties": props,
            "timestamp": e.timestamp / 1000, "team_id": 1, "distinct_id": e.distinct_id,
            "elements_chain": "", "created_at": (e.timestamp + 5) / 1000,
            "person_id": e.uuid, "$group_0": "acme", "$group_1": "", "$group_2": "",
            "$group_3": "", "$group_4": "", "timestamp_ms": e.timestamp,
            "created_at_ms": e.timestamp + 5, "_timestamp": e.timestamp / 1000, "_offset": i,
        });
        serde_json::to_writer(&mut out, &row).unwrap();
        out.push(b'\n');
    }
    out
}

fn row_binary_against_json_each_row() {
    let ch = ClickHouse::start("sink_throughput");
    let mut dest = destination(&ch);
    let shape = dest.shape();
    assert_eq!(
        shape,
        Shape::Narrow,
        "the JSON rows are written for the narrow shape"
    );
    let all = events(BATCH * BATCHES);
    let binary = Table::Event.insert_sql(shape);
    let json = binary.replace("FORMAT RowBinary", "FORMAT JSONEachRow");
    let (mut rb, mut js) = (Duration::ZERO, Duration::ZERO);
    let (mut rb_bytes, mut js_bytes) = (0, 0);
    block_on(async {
        for round in 0..ROUNDS as u128 {
            let started = Instant::now();
            for batch in all.chunks(BATCH) {
                let rows = row_binary(shape, batch, 2 * round + 1);
                rb_bytes += rows.len();
                dest.client()
                    .insert(&binary, rows, &[])
                    .await
                    .expect("RowBinary");
            }
            rb += started.elapsed();
            let started = Instant::now();
            for batch in all.chunks(BATCH) {
                let rows = json_each_row(batch, 2 * round + 2);
                js_bytes += rows.len();
                dest.client()
                    .insert(&json, rows, &[])
                    .await
                    .expect("JSONEachRow");
            }
            js += started.elapsed();
        }
    });
    let rows = (ROUNDS * BATCHES * BATCH) as f64;
    assert_eq!(
        ch.query("SELECT count() FROM events FINAL"),
        format!("{}\n", 2 * ROUNDS * BATCHES * BATCH)
    );
    println!(
        "RowBinary:   {:>8.0} events/s, {} bytes/event\nJSONEachRow: {:>8.0} events/s, {} bytes/event\nratio {:.2}",
        rows / rb.as_secs_f64(),
        rb_bytes / (ROUNDS * BATCHES * BATCH),
        rows / js.as_secs_f64(),
        js_bytes / (ROUNDS * BATCHES * BATCH),
        js.as_secs_f64() / rb.as_secs_f64()
    );
}

/// Chunks of [`CHUNK_EVENTS`] in the worker's measurement, as the compactor writes
/// them (its realtime chunk is 1,024 log records).
const WORKER_CHUNKS: usize = 200;
const CHUNK_EVENTS: usize = 1_000;

/// Batch sizes the worker is measured with, alternating: the sink's and a larger one.
const WORKER_BATCHES: [u64; 4] = [10_000, 50_000, 10_000, 50_000];

/// A store as the compactor leaves it: `all` in blocks of [`CHUNK_EVENTS`], one
/// outbox entry per chunk.
fn worker_store(
    all: &[Event],
) -> (
    tempfile::TempDir,
    flagpost::store::Trees,
    flagpost::store::outbox::Outbox,
) {
    use flagpost::store::outbox::{record, Committed, Outbox};
    use flagpost::store::{block, keys, Trees};
    use sled::transaction::ConflictableTransactionError;

    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let trees = Trees::open(&db, dir.path()).unwrap();
    let outbox = Outbox::open(&db).unwrap();
    let mut id = 0;
    for (c, chunk) in all.chunks(CHUNK_EVENTS).enumerate() {
        let entries = chunk.iter().map(|e| block::Entry {
            timestamp: e.timestamp,
            created_at: e.timestamp + 5,
            uuid: e.uuid,
            person_id: Some(e.uuid),
            event: "$pageview".into(),
            distinct_id: e.distinct_id.clone(),
            properties: e.properties.clone(),
        });
        let mut committed = Committed {
            at: 1_700_000_000_000 + c as i64,
            events: chunk.len() as u64,
            ..Committed::default()
        };
        for (newest, value) in block::build(entries.collect()) {
            let key = keys::block(1, newest, id);
            id += 1;
            trees.events.insert(key, value).unwrap();
            committed.blocks.push(key.to_vec());
        }
        outbox
            .tree()
            .transaction(|tx| Ok::<_, ConflictableTransactionError<()>>(record(tx, &committed)?))
            .unwrap();
    }
    (dir, trees, outbox)
}

/// The whole sink path on the sending side: outbox entries, blocks read from sled and
/// decoded, rows encoded, inserted and acknowledged, for 200k pageviews, in batches
/// of the sink's size and larger, taking turns.
fn worker_events_per_second() {
    use flagpost::sink::batch::Sources;
    use flagpost::sink::Worker;

    let ch = ClickHouse::start("sink_worker_throughput");
    let all = events(WORKER_CHUNKS * CHUNK_EVENTS);
    let total = (WORKER_CHUNKS * CHUNK_EVENTS) as u64;
    for batch_rows in WORKER_BATCHES {
        let (_dir, trees, outbox) = worker_store(&all);
        // Reading and encoding alone, without ClickHouse: the sink's own share.
        let entries: Vec<_> = outbox.entries(None).unwrap().map(Result::unwrap).collect();
        let started = Instant::now();
        let built = flagpost::sink::batch::build(&Sources::of(&trees), &entries, Shape::Narrow);
        let build = started.elapsed();
        assert_eq!(built.unwrap().rows(), total);
        let mut worker = Worker::new(settings(&ch), outbox.clone(), Sources::of(&trees))
            .unwrap()
            .with_batch_rows(batch_rows);
        let started = Instant::now();
        let mut rows = 0;
        block_on(async {
            while let flagpost::sink::worker::Pass::Sent { rows: n } = worker.step().await.unwrap()
            {
                rows += n;
            }
        });
        let took = started.elapsed();
        assert_eq!(rows, total);
        assert_eq!(outbox.entries(None).unwrap().count(), 0);
        println!(
            "worker, batches of {batch_rows}: {rows} events in {took:?}, {:.0} events/s; \
             reading and encoding alone {:.0} events/s",
            rows as f64 / took.as_secs_f64(),
            rows as f64 / build.as_secs_f64()
        );
    }
}

/// Events per variant and round in [`insert_options`].
const OPTIONS_EVENTS: usize = 100_000;

/// Ways of sending the same events, measured side by side in one run: the sink's
/// earlier way (batches of 10k, encoded then inserted), larger batches, encoding the next
/// batch while the previous insert is in flight, and the body gzipped or not over a
/// plain connection of its own.
#[derive(Debug, Clone, Copy)]
enum Variant {
    Serial(usize),
    Pipelined(usize),
    Plain,
    Gzip,
}

fn insert_options() {
    use std::sync::Arc;
    let ch = ClickHouse::start("sink_insert_options");
    let mut dest = destination(&ch);
    let shape = dest.shape();
    let sql = Table::Event.insert_sql(shape);
    let all = Arc::new(events(OPTIONS_EVENTS));
    let variants = [
        Variant::Serial(BATCH),
        Variant::Serial(5 * BATCH),
        Variant::Pipelined(BATCH),
        Variant::Pipelined(5 * BATCH),
        Variant::Plain,
        Variant::Gzip,
    ];
    let mut took = vec![Duration::ZERO; variants.len()];
    for round in 0..ROUNDS {
        for (v, variant) in variants.iter().enumerate() {
            let salt = (round * variants.len() + v + 1) as u128;
            let started = Instant::now();
            match *variant {
                Variant::Serial(size) => block_on(async {
                    for batch in all.chunks(size) {
                        let rows = row_binary(shape, batch, salt);
                        dest.client().insert(&sql, rows, &[]).await.unwrap();
                    }
                }),
                Variant::Pipelined(size) => block_on(async {
                    let encode = |i: usize| {
                        let all = all.clone();
                        tokio::task::spawn_blocking(move || {
                            let end = (i + size).min(all.len());
                            row_binary(shape, &all[i..end], salt)
                        })
                    };
                    let mut next = Some(encode(0));
                    for i in (0..all.len()).step_by(size) {
                        let rows = next.take().unwrap().await.unwrap();
                        if i + size < all.len() {
                            next = Some(encode(i + size));
                        }
                        dest.client().insert(&sql, rows, &[]).await.unwrap();
                    }
                }),
                Variant::Plain | Variant::Gzip => {
                    let path =
                        format!("/?database={}&query={}", ch.database, util::urlencode(&sql));
                    for batch in all.chunks(BATCH) {
                        let rows = row_binary(shape, batch, salt);
                        let gzip = matches!(variant, Variant::Gzip);
                        let body = if gzip { gzip_fast(&rows) } else { rows };
                        let mut req = util::Req::post(&path, body);
                        if gzip {
                            req = req.header("Content-Encoding", "gzip");
                        }
                        let basic = util::base64(
                            format!("{}:{}", server::USER, server::PASSWORD).as_bytes(),
                        );
                        req = req.header("Authorization", &format!("Basic {basic}"));
                        let resp = util::send(ch.addr, req);
                        assert_eq!(resp.status, 200, "{}", resp.text());
                    }
                }
            }
            took[v] += started.elapsed();
        }
    }
    let per_variant = (ROUNDS * OPTIONS_EVENTS) as u64;
    assert_eq!(
        ch.query("SELECT count() FROM events"),
        format!("{}\n", per_variant * variants.len() as u64)
    );
    for (variant, took) in variants.iter().zip(took) {
        println!(
            "{variant:?}: {:.0} events/s",
            per_variant as f64 / took.as_secs_f64()
        );
    }
}

/// The fastest gzip level: anything slower costs more than the loopback saves.
fn gzip_fast(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}
