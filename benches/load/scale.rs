//! Months of traffic on one VM: `--scale-events` posthog-js shaped events (default 20
//! million) from `--scale-persons` persons (default one million; see `scale_events`),
//! posted as gzip'd 100-event `/batch/` bodies over `--connections` keep-alive
//! connections as fast as they are accepted (built beforehand), a 503 sent again after
//! its `Retry-After`.
//! At each tenth of the events accepted it reads accepted and applied events/s, the
//! compactor's lag, the log's entries and bytes, the resident set and the database's
//! size; once the log is empty, the lookups' latencies (a person by distinct id, a
//! person's events, `/decide` with stored persons, and the read API's and console's
//! pages of events, persons, insights and flags: `scale_lookups`); then stops the
//! server and measures the disk at rest by kind of file and sled's file against its
//! live keys (the disk scenario's report), and restarts it: once cleanly, once after a
//! SIGKILL mid-ingest.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONTENT_ENCODING, CONTENT_TYPE, HOST, RETRY_AFTER};
use hyper::Request;
use tokio::task::JoinSet;

use crate::scale_events::Traffic;
use crate::scale_lookups::{self, Latency};
use crate::target::Target;
use crate::{client, disk, payloads};

/// The scenario's name on the command line.
pub const NAME: &str = "scale";
/// How long the compactor may take to empty the log after the ingest.
const DRAIN_LIMIT: Duration = Duration::from_secs(3600);
/// A 503 without `Retry-After` is sent again after this long.
const DEFAULT_RETRY: Duration = Duration::from_secs(1);
/// How often the sampler looks whether another tenth was accepted.
const SAMPLE_POLL: Duration = Duration::from_millis(100);
/// How long the ingest runs before the SIGKILL.
const KILL_AFTER: Duration = Duration::from_secs(3);
/// Bytes in a MiB, as the memory columns are given.
const MIB: f64 = 1024.0 * 1024.0;
/// How long a restart may take to answer `/_readiness` 200.
const READY_LIMIT: Duration = Duration::from_secs(600);

pub struct Settings {
    pub events: u64,
    pub persons: u64,
    pub connections: usize,
    /// Where to copy each target's data dir and database at rest (`--scale-keep`).
    pub keep: Option<std::path::PathBuf>,
}

/// Where the resident set goes by the server's own counts (`/metrics`): each holder's
/// bytes (`flagpost_memory_bytes`, `sled_cache` being sled's budget, not a count).
#[derive(Default)]
pub struct Memory {
    pub holders: Vec<(String, f64)>,
}

impl Memory {
    fn read(metrics: &str) -> Memory {
        let holders = metrics
            .lines()
            .filter_map(|line| {
                let rest = line.strip_prefix("flagpost_memory_bytes{holder=\"")?;
                let (holder, value) = rest.split_once("\"} ")?;
                Some((holder.to_owned(), value.trim().parse().ok()?))
            })
            .collect();
        Memory { holders }
    }

    /// The holders' bytes together, less sled's budget (which is not a count).
    fn held(&self) -> f64 {
        self.holders
            .iter()
            .filter(|(holder, _)| holder != "sled_cache")
            .map(|(_, bytes)| bytes)
            .sum()
    }
}

/// The server at the end of one tenth of the ingest.
pub struct Tenth {
    pub seconds: f64,
    pub accepted: u64,
    pub accepted_rate: f64,
    pub applied: f64,
    pub applied_rate: f64,
    pub lag_seconds: f64,
    pub log_entries: f64,
    pub log_bytes: u64,
    pub rss_kib: u64,
    /// What the server's holders, and the allocator's pages, say of that resident set.
    pub memory: Memory,
    pub disk_bytes: u64,
    /// 503s answered so far.
    pub refused: u64,
}

pub struct Report {
    pub name: &'static str,
    pub tenths: Vec<Tenth>,
    pub ingest_seconds: f64,
    pub drain_seconds: f64,
    /// Events applied a second while the log drained after the ingest.
    pub drain_rate: f64,
    /// The compactor thread's CPU seconds from the server's start to the empty log.
    pub compactor_cpu_seconds: Option<f64>,
    /// The fold thread's (`layered-fold`), where folds run beside the compactor.
    pub fold_cpu_seconds: Option<f64>,
    pub rss_at_rest_kib: u64,
    /// The highest resident set from the start to then (`VmHWM`).
    pub rss_peak_kib: u64,
    /// The highest resident set once the lookups were made too (`VmHWM` after them).
    pub rss_peak_after_lookups_kib: u64,
    /// The holders at the same moment.
    pub memory_at_rest: Memory,
    pub lookups: Vec<Latency>,
    pub disk: disk::Report,
    pub restart_clean_seconds: f64,
    pub restart_killed_seconds: f64,
    /// How long the restarted server took to apply what the SIGKILL left in the log.
    pub killed_drain_seconds: f64,
}

pub fn run(
    runtime: &tokio::runtime::Runtime,
    settings: &Settings,
    name: &'static str,
    binary: &Path,
    data_dir: &Path,
    db: &Path,
) -> Result<Report, String> {
    let mut flagpost = Target::flagpost_at(name, binary, data_dir, db)?;
    let traffic = Arc::new(Traffic::new(settings.events, settings.persons, now_ms()));
    let pid = flagpost.pid();
    let (tenths, ingest_seconds) = runtime.block_on(ingest(
        flagpost.addr,
        pid,
        db,
        &traffic,
        settings.connections,
    ))?;
    println!(
        "scale: {name} ingested {} events in {ingest_seconds:.1} s; waiting for the compactor",
        settings.events
    );
    let (
        drain_seconds,
        drain_rate,
        (compactor_cpu_seconds, fold_cpu_seconds),
        lookups,
        (rss_at_rest_kib, rss_peak_kib, rss_peak_after_lookups_kib, memory_at_rest),
    ) = runtime.block_on(async {
        let before = client::metric(flagpost.addr, "flagpost_compactor_applied_total").await?;
        let drain = client::wait_for_empty_log(flagpost.addr, DRAIN_LIMIT).await?;
        let after = client::metric(flagpost.addr, "flagpost_compactor_applied_total").await?;
        let rate = (after - before) / drain.as_secs_f64().max(1e-3);
        let cpu = crate::target::thread_cpu_seconds(pid, "compactor").ok();
        let fold_cpu = crate::target::thread_cpu_seconds(pid, "layered-fold").ok();
        let rss = crate::target::status_kib(pid, "VmRSS")?;
        let peak = crate::target::status_kib(pid, "VmHWM")?;
        let memory = Memory::read(&client::get_text(flagpost.addr, "/metrics").await?);
        let lookups = scale_lookups::lookups(flagpost.addr, pid, &traffic).await?;
        let peak_after_lookups = crate::target::status_kib(pid, "VmHWM")?;
        Ok::<_, String>((
            drain.as_secs_f64(),
            rate,
            (cpu, fold_cpu),
            lookups,
            (rss, peak, peak_after_lookups, memory),
        ))
    })?;
    let running = disk::measure_dir(db)?;
    flagpost.stop()?;
    let stopped = disk::measure_dir(db)?;
    if let Some(keep) = &settings.keep {
        let to = keep.join(name);
        copy_dir(data_dir, &to.join("data"))
            .and_then(|()| copy_dir(db, &to.join("db")))
            .map_err(|e| format!("cannot copy the database to {}: {e}", to.display()))?;
        println!(
            "scale: {name}'s data dir and database kept in {}",
            to.display()
        );
    }
    let (trees, tables, blocks, size_on_disk) = disk::read_trees(db)?;
    let disk = disk::Report {
        name,
        events: settings.events as usize,
        persons: traffic.persons as usize,
        ingest_seconds,
        drain_seconds,
        running,
        stopped,
        trees,
        tables,
        blocks,
        size_on_disk,
        lookups: None,
    };

    let (mut again, restart_clean_seconds) = restart(runtime, name, binary, data_dir, db)?;
    // A SIGKILL in the middle of an ingest (the memory scenario's batches, new persons).
    let bodies: Arc<[Bytes]> = payloads::person_batches(100).into();
    let addr = again.addr;
    let connections = settings.connections;
    let load = runtime.spawn(async move {
        let _ = crate::memory::ingest(addr, &bodies, usize::MAX, connections).await;
    });
    std::thread::sleep(KILL_AFTER);
    again.kill();
    load.abort();
    let (mut killed, restart_killed_seconds) = restart(runtime, name, binary, data_dir, db)?;
    let killed_drain_seconds = runtime
        .block_on(client::wait_for_empty_log(killed.addr, DRAIN_LIMIT))?
        .as_secs_f64();
    killed.stop()?;
    Ok(Report {
        name,
        tenths,
        ingest_seconds,
        drain_seconds,
        drain_rate,
        compactor_cpu_seconds,
        fold_cpu_seconds,
        rss_at_rest_kib,
        rss_peak_kib,
        rss_peak_after_lookups_kib,
        memory_at_rest,
        lookups,
        disk,
        restart_clean_seconds,
        restart_killed_seconds,
        killed_drain_seconds,
    })
}

/// Copy the directory `from` to `to` (made), files and directories.
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Start the server on `db` again; the seconds from spawning it to `/_readiness` 200.
fn restart(
    runtime: &tokio::runtime::Runtime,
    name: &'static str,
    binary: &Path,
    data_dir: &Path,
    db: &Path,
) -> Result<(Target, f64), String> {
    let started = Instant::now();
    let target = Target::flagpost_at(name, binary, data_dir, db)?;
    runtime.block_on(async {
        loop {
            if readiness(target.addr).await == Some(hyper::StatusCode::OK) {
                return Ok(());
            }
            if started.elapsed() > READY_LIMIT {
                return Err(format!("{name} not ready {READY_LIMIT:?} after a restart"));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })?;
    Ok((target, started.elapsed().as_secs_f64()))
}

/// Every batch body of `traffic`, built on every core before the clock starts: built
/// while sending, they would take the cores the server is measured on (one thread
/// builds about 25,000 events a second).
fn build(traffic: &Arc<Traffic>) -> Arc<[(u64, Bytes)]> {
    let started = Instant::now();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let batches = traffic.batches();
    let per = batches.div_ceil(threads);
    let now = now_ms();
    let parts: Vec<Vec<(u64, Bytes)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    (t * per..((t + 1) * per).min(batches))
                        .map(|b| ((traffic.events - b * 100).min(100), traffic.body(b, now)))
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a body maker panicked"))
            .collect()
    });
    let bodies: Arc<[(u64, Bytes)]> = parts.into_iter().flatten().collect();
    let bytes: usize = bodies.iter().map(|(_, b)| b.len()).sum();
    println!(
        "scale: {} bodies built ({:.1} MB gzip'd) in {:.1} s",
        bodies.len(),
        bytes as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    bodies
}

/// Post every batch of `traffic`, a refused one again after its `Retry-After`; one
/// reading of the server at the end of each tenth.
async fn ingest(
    addr: SocketAddr,
    pid: u32,
    db: &Path,
    traffic: &Arc<Traffic>,
    connections: usize,
) -> Result<(Vec<Tenth>, f64), String> {
    let bodies = build(traffic);
    let next = Arc::new(AtomicUsize::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut senders = JoinSet::new();
    for _ in 0..connections {
        let (next, bodies) = (next.clone(), bodies.clone());
        let (accepted, refused) = (accepted.clone(), refused.clone());
        senders.spawn(async move {
            let mut sender = client::connect(addr).await.map_err(|e| e.to_string())?;
            loop {
                let Some((events, body)) = bodies.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    return Ok::<_, String>(());
                };
                let events = *events;
                loop {
                    let request = batch_request(addr, body.clone());
                    sender.ready().await.map_err(|e| e.to_string())?;
                    let response = sender
                        .send_request(request)
                        .await
                        .map_err(|e| e.to_string())?;
                    let status = response.status();
                    let wait = retry_after(response.headers());
                    response
                        .into_body()
                        .collect()
                        .await
                        .map_err(|e| e.to_string())?;
                    if status.is_success() {
                        accepted.fetch_add(events, Ordering::Relaxed);
                        break;
                    }
                    if status != hyper::StatusCode::SERVICE_UNAVAILABLE {
                        return Err(format!("a batch answered {status}"));
                    }
                    refused.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(wait).await;
                }
            }
        });
    }
    let total = traffic.events;
    let sampler = {
        let (accepted, refused, db) = (accepted.clone(), refused.clone(), db.to_path_buf());
        tokio::spawn(async move {
            let mut tenths: Vec<Tenth> = Vec::new();
            let (mut last_at, mut last_accepted, mut last_applied) = (0.0, 0, 0.0);
            for tenth in 1..=10u64 {
                while accepted.load(Ordering::Relaxed) < total * tenth / 10 {
                    tokio::time::sleep(SAMPLE_POLL).await;
                }
                let seconds = started.elapsed().as_secs_f64();
                let n = accepted.load(Ordering::Relaxed);
                let metrics = client::get_text(addr, "/metrics").await?;
                let read = |name: &str| client::metric_in(&metrics, name).unwrap_or(f64::NAN);
                let applied = read("flagpost_compactor_applied_total");
                let dir = {
                    let db = db.clone();
                    tokio::task::spawn_blocking(move || disk::measure_dir(&db))
                        .await
                        .map_err(|e| e.to_string())??
                };
                let span = (seconds - last_at).max(1e-3);
                let t = Tenth {
                    seconds,
                    accepted: n,
                    accepted_rate: (n - last_accepted) as f64 / span,
                    applied,
                    applied_rate: (applied - last_applied) / span,
                    lag_seconds: read("flagpost_compactor_lag_seconds"),
                    log_entries: read("flagpost_log_depth"),
                    log_bytes: dir.log.allocated,
                    rss_kib: crate::target::status_kib(pid, "VmRSS")?,
                    memory: Memory::read(&metrics),
                    disk_bytes: dir.total().allocated,
                    refused: refused.load(Ordering::Relaxed),
                };
                print_tenth(tenth, &t);
                (last_at, last_accepted, last_applied) = (seconds, n, applied);
                tenths.push(t);
            }
            Ok::<_, String>(tenths)
        })
    };
    while let Some(joined) = senders.join_next().await {
        joined.map_err(|e| format!("an ingest connection failed: {e}"))??;
    }
    let ingest_seconds = started.elapsed().as_secs_f64();
    let tenths = sampler
        .await
        .map_err(|e| format!("sampler failed: {e}"))??;
    Ok((tenths, ingest_seconds))
}

/// `/_readiness`'s status, `None` while the server does not answer.
async fn readiness(addr: SocketAddr) -> Option<hyper::StatusCode> {
    let mut sender = client::connect(addr).await.ok()?;
    let request = Request::get("/_readiness")
        .header(HOST, addr.to_string())
        .body(Full::new(Bytes::new()))
        .expect("static request parts are valid");
    client::send(&mut sender, request).await.ok()
}

fn batch_request(addr: SocketAddr, body: Bytes) -> Request<Full<Bytes>> {
    Request::post("/batch/")
        .header(HOST, addr.to_string())
        .header(CONTENT_TYPE, "application/json")
        .header(CONTENT_ENCODING, "gzip")
        .body(Full::new(body))
        .expect("static request parts are valid")
}

fn retry_after(headers: &hyper::HeaderMap) -> Duration {
    headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
        .map_or(DEFAULT_RETRY, Duration::from_secs)
}

fn now_ms() -> i64 {
    let nanos = time::OffsetDateTime::now_utc().unix_timestamp_nanos();
    i64::try_from(nanos / 1_000_000).expect("the current time fits in i64 milliseconds")
}

fn print_tenth(tenth: u64, t: &Tenth) {
    if tenth == 1 {
        println!(
            "{:>6} {:>8} {:>11} {:>10} {:>11} {:>10} {:>8} {:>10} {:>9} {:>8} {:>8} {:>9} {:>8}",
            "tenth",
            "seconds",
            "accepted",
            "acc/s",
            "applied",
            "appl/s",
            "lag s",
            "log entr",
            "log MB",
            "RSS MB",
            "held MB",
            "disk MB",
            "503s"
        );
    }
    println!(
        "{:>6} {:>8.1} {:>11} {:>10.0} {:>11.0} {:>10.0} {:>8.1} {:>10.0} {:>9.1} {:>8.1} {:>8.1} {:>9.1} {:>8}",
        tenth,
        t.seconds,
        t.accepted,
        t.accepted_rate,
        t.applied,
        t.applied_rate,
        t.lag_seconds,
        t.log_entries,
        t.log_bytes as f64 / 1e6,
        t.rss_kib as f64 / 1024.0,
        t.memory.held() / MIB,
        t.disk_bytes as f64 / 1e6,
        t.refused
    );
}

pub fn report(r: &Report) {
    println!();
    println!(
        "scale, {}: {} events from {} persons accepted in {:.1} s ({:.0} events/s), log empty {:.1} s later (compactor {:.0} events/s meanwhile)",
        r.name, r.disk.events, r.disk.persons, r.ingest_seconds,
        r.disk.events as f64 / r.ingest_seconds.max(1e-3), r.drain_seconds, r.drain_rate
    );
    for (n, t) in r.tenths.iter().enumerate() {
        print_tenth(n as u64 + 1, t);
    }
    if let Some(cpu) = r.compactor_cpu_seconds {
        println!(
            "compactor thread's CPU from the start to the empty log: {cpu:.1} s, {:.1} us an event",
            cpu * 1e6 / r.disk.events.max(1) as f64
        );
    }
    if let Some(cpu) = r.fold_cpu_seconds {
        println!(
            "fold thread's CPU from the start to the empty log: {cpu:.1} s, {:.1} us an event",
            cpu * 1e6 / r.disk.events.max(1) as f64
        );
    }
    println!(
        "resident at rest: {:.1} MiB (the highest from the start to then: {:.1} MiB)",
        r.rss_at_rest_kib as f64 / 1024.0,
        r.rss_peak_kib as f64 / 1024.0
    );
    let m = &r.memory_at_rest;
    let holders: Vec<String> = m
        .holders
        .iter()
        .map(|(holder, bytes)| format!("{holder} {:.1}", bytes / MIB))
        .collect();
    println!(
        "  then, MiB: held {:.1} ({})",
        m.held() / MIB,
        holders.join(", "),
    );
    println!(
        "the highest resident set once the lookups below were made too: {:.1} MiB",
        r.rss_peak_after_lookups_kib as f64 / 1024.0
    );
    println!(
        "{:<26} {:>9} {:>9} {:>9} {:>7} {:>6}  other threads' CPU meanwhile",
        "lookup", "p50 ms", "p99 ms", "max ms", "errors", "made"
    );
    for l in &r.lookups {
        println!(
            "{:<26} {:>9.2} {:>9.2} {:>9.2} {:>7} {:>6}  {}",
            l.what,
            l.p50_ms,
            l.p99_ms,
            l.max_ms,
            l.errors,
            l.count,
            crate::threads::line(&l.beside)
        );
    }
    println!(
        "restart: clean {:.2} s to ready; after a SIGKILL mid-ingest {:.2} s to ready, its log applied {:.1} s later",
        r.restart_clean_seconds, r.restart_killed_seconds, r.killed_drain_seconds
    );
    disk::report(&r.disk);
}
