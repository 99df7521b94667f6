//! The write-ahead log (`log::writer`): appends that resolve once fdatasync'd, to the
//! log's files under the target dir (not /tmp, which is often tmpfs, where a sync is
//! free).
//! One record per append and 100 per append, each awaited before the next, show the
//! cost of one flush; 32 concurrent single-record appends show group commit sharing a
//! flush among them. Throughput is in records (encoded ~600-byte `$pageview`s).

#[path = "common/mod.rs"]
mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use flagpost::capture::{self, Context, Outcome};
use flagpost::log::{self, Wal};

use common::{pageview, NOW_MS};

/// A batch request's worth of records in one append.
const BATCH_RECORDS: usize = 100;
/// The load harness's connection count: that many requests wait on the log at once.
const CONCURRENT_APPENDS: usize = 32;
/// Distinct records cycled through, so consecutive appends differ.
const POOL: usize = 1024;
/// Each iteration waits for the disk (milliseconds, not microseconds): fewer, flat
/// samples keep a benchmark within its few seconds.
const SAMPLES: usize = 20;

/// Encoded records of ~600-byte `$pageview`s, as capture hands them to the log.
fn records() -> Vec<Vec<u8>> {
    let ctx = Context {
        project: 1,
        now: NOW_MS,
        sent_at: None,
        historical: false,
        ip: Some("81.2.69.160".parse().expect("an address")),
    };
    (0..POOL)
        .map(
            |n| match capture::normalise(object(n), &ctx).expect("valid") {
                Outcome::Keep(record) => record.encode(),
                Outcome::Drop(reason) => panic!("dropped: {}", reason.as_str()),
            },
        )
        .collect()
}

fn object(n: usize) -> serde_json::Map<String, serde_json::Value> {
    match pageview(n) {
        serde_json::Value::Object(event) => event,
        _ => unreachable!("pageview builds an object"),
    }
}

/// The log on a fresh database under the target dir; the dir is removed on drop.
struct Log {
    wal: Wal,
    writer: Option<flagpost::log::writer::Writer>,
    _dir: tempfile::TempDir,
}

impl Log {
    fn open() -> Log {
        let dir = common::target_tmpdir("flagpost-bench-wal-");
        let (appender, _, preparer) = log::open(
            dir.path(),
            1,
            None,
            flagpost::config::DEFAULT_LOG_SEGMENT_BYTES,
        )
        .expect("the log opens");
        let (wal, writer) =
            Wal::start(appender, preparer, Box::new(|_| {})).expect("the writer starts");
        Log {
            wal,
            writer: Some(writer),
            _dir: dir,
        }
    }

    /// Average records per group commit (one fsync each) so far.
    fn records_per_flush(&self) -> f64 {
        let stats = self.wal.stats();
        let records = stats.appended_records.load(Ordering::Relaxed) as f64;
        records / stats.groups.load(Ordering::Relaxed).max(1) as f64
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        if let Some(writer) = self.writer.take() {
            writer.stop();
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// `appends` per iteration, each of `per_append` records, `concurrent` at a time.
fn run(
    rt: &tokio::runtime::Runtime,
    log: &Log,
    pool: &[Vec<u8>],
    iters: u64,
    per_append: usize,
    concurrent: usize,
) -> Duration {
    let mut next = 0usize;
    let mut take = || {
        let batch: Vec<Vec<u8>> = (0..per_append)
            .map(|i| pool[(next + i) % pool.len()].clone())
            .collect();
        next += per_append;
        batch
    };
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let appends: Vec<Vec<Vec<u8>>> = (0..concurrent).map(|_| take()).collect();
        let started = Instant::now();
        rt.block_on(async {
            let tasks: Vec<_> = appends
                .into_iter()
                .map(|records| {
                    let wal = log.wal.clone();
                    tokio::spawn(async move { wal.append(records).await })
                })
                .collect();
            for task in tasks {
                task.await.expect("the task ran").expect("appended");
            }
        });
        total += started.elapsed();
    }
    total
}

fn wal(c: &mut Criterion) {
    let pool = records();
    let rt = runtime();
    let mut group = c.benchmark_group("wal/append");
    group.sampling_mode(SamplingMode::Flat).sample_size(SAMPLES);
    for (name, per_append, concurrent) in [
        ("1 record", 1, 1),
        ("100 records", BATCH_RECORDS, 1),
        ("32 concurrent x 1 record", 1, CONCURRENT_APPENDS),
    ] {
        let log = Log::open();
        group.throughput(Throughput::Elements((per_append * concurrent) as u64));
        group.bench_function(name, |b| {
            b.iter_custom(|iters| run(&rt, &log, &pool, iters, per_append, concurrent))
        });
        // Shows how many records shared each fsync, which the time alone does not.
        println!(
            "wal/append/{name}: {:.1} records per flush",
            log.records_per_flush()
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = wal
}
criterion_main!(benches);
