//! Memory at scale: flagpost's resident set after it has ingested and compacted a large
//! volume (by default one million events from 100,000 persons), then over a soak at a
//! steady rate, sampled at intervals, to show whether it stays flat.
//!
//! The ingest goes as fast as flagpost accepts it; the harness then waits until the
//! compactor has emptied the log (`flagpost_log_depth` 0), so the figure is the
//! server at rest holding the whole volume. The soak sends the same persons' events
//! at the offered rate and reads `VmRSS` from `/proc` every `SOAK_SAMPLE`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::task::JoinSet;

use crate::client::{self, Load};
use crate::payloads::{self, Scenario};

/// The scenario's name on the command line.
pub const NAME: &str = "memory";
/// Distinct persons: each batch body holds 100 of them, and the bodies cover them all.
pub const PERSONS: usize = 100_000;
/// How long the compactor may take to empty the log after the ingest.
const DRAIN_LIMIT: Duration = Duration::from_secs(600);
/// How often the soak reads the resident set.
const SOAK_SAMPLE: Duration = Duration::from_secs(30);

pub struct Settings {
    /// Events to ingest before the first reading.
    pub events: usize,
    pub connections: usize,
    /// Soak length; zero skips the soak.
    pub soak: Duration,
    /// Offered events per second during the soak.
    pub soak_rate: f64,
}

pub struct Report {
    pub events: usize,
    pub ingest_seconds: f64,
    pub drain_seconds: f64,
    /// KiB resident once the log was empty.
    pub at_rest_kib: u64,
    /// (seconds into the soak, KiB resident).
    pub soak: Vec<(f64, u64)>,
    pub soak_errors: u64,
}

/// The `VmRSS` of a process in KiB.
fn resident_kib(pid: u32) -> Result<u64, String> {
    crate::target::status_kib(pid, "VmRSS")
}

/// The batch bodies of the run: `PERSONS / 100` bodies, one distinct id per event.
pub fn bodies() -> Vec<Bytes> {
    payloads::person_batches(PERSONS / payloads::BATCH_EVENTS)
}

pub async fn measure(
    addr: SocketAddr,
    pid: u32,
    bodies: Arc<[Bytes]>,
    settings: &Settings,
) -> Result<Report, String> {
    let requests = settings.events.div_ceil(payloads::BATCH_EVENTS);
    let started = Instant::now();
    ingest(addr, &bodies, requests, settings.connections).await?;
    let ingest_seconds = started.elapsed().as_secs_f64();
    println!(
        "memory: ingested {} events in {ingest_seconds:.1} s; waiting for the compactor",
        requests * payloads::BATCH_EVENTS
    );

    let drain_seconds = client::wait_for_empty_log(addr, DRAIN_LIMIT)
        .await
        .map_err(|e| format!("after the ingest: {e}"))?
        .as_secs_f64();
    // Let background work that follows a drain (sled's own flushing) settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let at_rest_kib = resident_kib(pid)?;
    println!(
        "memory: log empty after {drain_seconds:.1} s; resident {:.1} MiB",
        at_rest_kib as f64 / 1024.0
    );

    let mut soak = Vec::new();
    let mut soak_errors = 0;
    if !settings.soak.is_zero() {
        let load = Load {
            scenario: Scenario::Compactor,
            bodies,
            connections: settings.connections,
            warmup: Duration::ZERO,
            measure: settings.soak,
            interval: Some(Duration::from_secs_f64(
                settings.connections as f64 * payloads::BATCH_EVENTS as f64 / settings.soak_rate,
            )),
        };
        let soak_started = Instant::now();
        let length = settings.soak;
        let sampler = tokio::spawn(async move {
            let mut samples = Vec::new();
            while soak_started.elapsed() + SOAK_SAMPLE <= length {
                tokio::time::sleep(SOAK_SAMPLE).await;
                let at = soak_started.elapsed().as_secs_f64();
                if let Ok(kib) = resident_kib(pid) {
                    println!(
                        "memory: soak {at:>5.0} s: resident {:.1} MiB",
                        kib as f64 / 1024.0
                    );
                    samples.push((at, kib));
                }
            }
            samples
        });
        soak_errors = load.run(addr).await.errors;
        soak = sampler
            .await
            .map_err(|e| format!("soak sampler failed: {e}"))?;
    }
    Ok(Report {
        events: requests * payloads::BATCH_EVENTS,
        ingest_seconds,
        drain_seconds,
        at_rest_kib,
        soak,
        soak_errors,
    })
}

/// Send `requests` batches from the pool over `connections` keep-alive connections as
/// fast as they are accepted; any failure ends the run with an error.
pub async fn ingest(
    addr: SocketAddr,
    bodies: &Arc<[Bytes]>,
    requests: usize,
    connections: usize,
) -> Result<(), String> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for _ in 0..connections {
        let (next, bodies) = (next.clone(), bodies.clone());
        tasks.spawn(async move {
            let mut sender = client::connect(addr).await.map_err(|e| e.to_string())?;
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= requests {
                    return Ok::<_, String>(());
                }
                let body = bodies[n % bodies.len()].clone();
                let request = client::request(Scenario::Compactor, addr, body);
                match client::send(&mut sender, request).await {
                    Ok(status) if status.is_success() => {}
                    Ok(status) => return Err(format!("batch {n} answered {status}")),
                    Err(e) => return Err(format!("batch {n} failed: {e}")),
                }
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| format!("an ingest connection failed: {e}"))??;
    }
    Ok(())
}
