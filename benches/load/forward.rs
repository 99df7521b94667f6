//! The `forward` scenario: edge mode's forwarder on loopback, an edge flagpost
//! (`serve --upstream`) in front of an upstream flagpost, both started here. Three
//! phases, one figure each, as issue 40 asks for them:
//! - drain: `--forward-events` captured while upstream is down, then upstream
//!   started; the events/s from its start (and from the first delivery) until the
//!   edge's backlog is empty, into an upstream flagpost as it runs, the same with
//!   its compactor at nice 19, and a counting sink, each with `--baseline` as the
//!   edge too when given ([`forward_drain`]);
//! - capture under `wrk -t1 -c64` at the edge with forwarding on, beside the same
//!   binary with edge mode off, the order alternating between `--rounds`; upstream
//!   is then a sink in this process that takes every request and only counts it, so
//!   the rounds weigh the edge's own forwarding, not an upstream flagpost parsing and
//!   compacting the same events on the same cores;
//! - outage: capture at `--forward-rate` events/s for `--outage-seconds` with
//!   upstream down, then upstream started again while capture goes on at the same
//!   rate; the outage's length over the time from upstream's return until the
//!   backlog is drained (the issue: at least 5x after ten minutes).
//!
//! Each phase runs whatever became of the one before, and the report prints every
//! phase that finished and why one did not ([`forward_report`]), so a run that fails
//! late still yields its earlier figures. The backlog is the edge's
//! `flagpost_upstream_forward_backlog_events`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::client::{self, Load};
use crate::forward_cpu::{self as cpu, Threads};
use crate::forward_drain::{
    drains, free_port, time_drain, wait_until, Drain, Sink, Upstream, BACKLOG, LIMIT,
};
pub use crate::forward_report::report;
use crate::payloads::{Scenario, BATCH_EVENTS};
use crate::target::{Options, Target};
use crate::wrk;

/// The scenario's name on the command line.
pub const NAME: &str = "forward";
/// Events/s captured at the edge through the outage and its drain, without
/// `--forward-rate`: a large site's steady traffic (430 million events a day), which
/// one edge on two cores captures with most of them to spare for forwarding.
pub const DEFAULT_RATE: f64 = 5_000.0;
/// While capture goes on, the backlog counts as drained below this many seconds of
/// it: what the compactor and one forwarder pass hold at any time.
const DRAINED_SECONDS: f64 = 1.0;
const ACCEPTED: &str = "flagpost_events_accepted_total";

/// The scenario's settings, from the command line.
pub struct Settings {
    pub events: usize,
    pub outage: Duration,
    /// Events/s captured during the outage and its drain.
    pub rate: f64,
    pub connections: usize,
    pub measure: Duration,
    pub warmup: Duration,
    pub rounds: usize,
    /// Another build, drained beside this one.
    pub baseline: Option<PathBuf>,
}

/// The outage phase: what capture did while upstream was down, and the drain.
pub struct Outage {
    pub length: Duration,
    pub offered: f64,
    /// Events/s the edge accepted while upstream was down, and requests refused.
    pub accepted: f64,
    pub refused: u64,
    /// The forward backlog when upstream came back.
    pub backlog: f64,
    /// From upstream's return and from the first delivery until drained, or why not.
    pub drain: Result<(Duration, Duration), String>,
    /// Events/s the edge accepted while it drained (capture going on).
    pub accepted_draining: f64,
}

/// One `wrk` run of a round, and the CPU its server's threads took.
pub struct Side {
    pub run: wrk::Run,
    /// During the run, and after it until its work was done (the compactor's, and at
    /// the edge the forwarder's).
    pub during: Threads,
    pub after: Threads,
}

pub struct Report {
    /// Each drain: the edge's build, what upstream was, and the figures or why not.
    pub drains: Vec<(&'static str, Upstream, Result<Drain, String>)>,
    /// Each round's capture at the edge with edge mode off, then on: those finished.
    pub wrk: Vec<(Side, Side)>,
    /// Why the rounds stopped short, if they did.
    pub wrk_failed: Option<String>,
    /// Requests and bytes the counting sink took during the rounds.
    pub forwarded: (u64, u64),
    pub outage: Result<Outage, String>,
    pub load_average: (String, String),
}

impl Report {
    /// Every phase that did not finish, with why: the run's error once all is printed.
    pub fn failures(&self) -> Option<String> {
        let failed: Vec<String> = [
            self.drains.iter().find_map(|(b, u, d)| {
                d.as_ref()
                    .err()
                    .map(|e| format!("drain of {b} into {u:?}: {e}"))
            }),
            self.wrk_failed.as_ref().map(|e| format!("wrk rounds: {e}")),
            match &self.outage {
                Err(e) => Some(format!("outage: {e}")),
                Ok(o) => o.drain.as_ref().err().map(|e| format!("outage drain: {e}")),
            },
        ]
        .into_iter()
        .flatten()
        .collect();
        (!failed.is_empty()).then(|| failed.join("; "))
    }
}

/// Runs the scenario on databases of its own under `dir`. An error only when the
/// targets cannot start; a phase's failure is in the report.
pub fn run(
    runtime: &tokio::runtime::Runtime,
    settings: &Settings,
    data_dir: &Path,
    dir: &Path,
) -> Result<Report, String> {
    wrk::check_wrk()?;
    let load_before = load_average();
    let binary = Path::new(env!("CARGO_BIN_EXE_flagpost"));
    let port = free_port()?;
    let upstream_listen = format!("127.0.0.1:{port}");
    let start_upstream = || {
        let db = dir.join("forward-upstream-db");
        Target::flagpost_on(
            "upstream",
            binary,
            data_dir,
            &db,
            &upstream_listen,
            &Options::default(),
        )
    };
    let options = Options {
        args: vec!["--upstream".into(), format!("http://{upstream_listen}")],
        env: Vec::new(),
    };
    let edge_db = dir.join("forward-edge-db");
    let mut edge = Target::flagpost_with("edge", binary, data_dir, &edge_db, &options)?;
    let mut plain = Target::flagpost_at("plain", binary, data_dir, &dir.join("forward-plain-db"))?;
    let bodies: Arc<[Bytes]> = Scenario::Batch.bodies().into();

    let mut builds = vec![("this build", binary)];
    if let Some(other) = &settings.baseline {
        builds.push(("baseline", other.as_path()));
    }
    let drained = (settings.events, settings.connections);
    let drains = drains(runtime, &builds, drained, data_dir, dir);

    let (mut rounds, mut forwarded) = (Vec::new(), (0, 0));
    let wrk_failed = match runtime.block_on(Sink::start(&upstream_listen)) {
        Ok(sink) => {
            let servers = [(edge.addr, edge.pid()), (plain.addr, plain.pid())];
            let done = capture_rounds(runtime, settings, dir, servers, &mut rounds);
            forwarded = sink.stop();
            done.err()
        }
        Err(e) => Some(e),
    };
    announce("wrk rounds", &wrk_failed.clone().map_or(Ok(()), Err));

    let outage = runtime.block_on(outage(settings, &bodies, edge.addr, start_upstream));
    announce("outage", &outage);
    let stopped = [edge.stop(), plain.stop()];
    let report = Report {
        drains,
        wrk: rounds,
        wrk_failed,
        forwarded,
        outage,
        load_average: (load_before, load_average()),
    };
    stopped.into_iter().collect::<Result<(), String>>()?;
    Ok(report)
}

/// Say on stderr, as it happens, that a phase failed, so a long run shows it early.
fn announce<T>(phase: &str, outcome: &Result<T, String>) {
    if let Err(e) = outcome {
        eprintln!("forward: the {phase} phase failed: {e}");
    }
}

/// Capture at the settings' rate with upstream down for the outage, then start it
/// while capture goes on, and time the drain.
async fn outage(
    settings: &Settings,
    bodies: &Arc<[Bytes]>,
    addr: SocketAddr,
    start_upstream: impl Fn() -> Result<Target, String>,
) -> Result<Outage, String> {
    let load = Load {
        scenario: Scenario::Batch,
        bodies: bodies.clone(),
        connections: settings.connections,
        warmup: Duration::ZERO,
        measure: settings.outage,
        interval: Some(Duration::from_secs_f64(
            settings.connections as f64 * BATCH_EVENTS as f64 / settings.rate,
        )),
    };
    let started = Instant::now();
    let down = load.run(addr).await;
    let length = started.elapsed();
    let backlog = client::metric(addr, BACKLOG).await?;
    // Capture goes on at the same pace until the backlog is drained.
    let during = Load {
        measure: LIMIT,
        ..load
    };
    let capturing = tokio::spawn(async move { during.run(addr).await });
    let accepted_before = client::metric(addr, ACCEPTED).await?;
    let draining = Instant::now();
    let drain = match start_upstream() {
        Ok(mut upstream) => {
            let drained = time_drain(addr, backlog, settings.rate * DRAINED_SECONDS).await;
            let stopped = upstream.stop();
            drained.and_then(|d| stopped.map(|()| d))
        }
        Err(e) => Err(e),
    };
    let accepted_draining = (client::metric(addr, ACCEPTED).await? - accepted_before)
        / draining.elapsed().as_secs_f64().max(f64::MIN_POSITIVE);
    capturing.abort();
    Ok(Outage {
        length,
        offered: settings.rate,
        accepted: down.rate() * BATCH_EVENTS as f64,
        refused: down.errors,
        backlog,
        drain,
        accepted_draining,
    })
}

/// `wrk` capture at the edge (forwarding on) and at the plain flagpost (address and
/// pid each), in turn; each finished round goes into `rounds` at once, so a failure
/// keeps those before.
fn capture_rounds(
    runtime: &tokio::runtime::Runtime,
    settings: &Settings,
    dir: &Path,
    [(edge, edge_pid), (plain, plain_pid)]: [(SocketAddr, u32); 2],
    rounds: &mut Vec<(Side, Side)>,
) -> Result<(), String> {
    let work = dir.join("forward-wrk");
    std::fs::create_dir_all(&work).map_err(|e| format!("cannot create {work:?}: {e}"))?;
    let script = work.join("bodies.lua");
    std::fs::write(&script, wrk::SCRIPT).map_err(|e| format!("cannot write the script: {e}"))?;
    let bodies: PathBuf = work.join("capture.txt");
    let mut text = Vec::new();
    for body in Scenario::Capture.bodies().iter().take(wrk::POOL) {
        text.extend_from_slice(body);
        text.push(b'\n');
    }
    std::fs::write(&bodies, text).map_err(|e| format!("cannot write {bodies:?}: {e}"))?;
    let case = wrk::Case {
        name: "capture",
        path: Scenario::Capture.path(),
        bodies,
        ingests: true,
    };
    // Each run's work (the compactor's, and at the edge the forwarder's) is done
    // before the next run starts.
    let measure = |addr: SocketAddr, duration: Duration| {
        let pid = if addr == edge { edge_pid } else { plain_pid };
        let before = cpu::read(pid);
        let run = wrk::wrk(addr, &script, &case, duration)?;
        let ran = cpu::read(pid);
        runtime.block_on(client::settle(addr));
        if addr == edge {
            runtime.block_on(wait_until(edge, |backlog| backlog == 0.0))?;
        }
        let (during, after) = (cpu::since(&before, &ran), cpu::since(&ran, &cpu::read(pid)));
        Ok::<_, String>(Side { run, during, after })
    };
    let warmup = settings.warmup.max(Duration::from_secs(1));
    measure(plain, warmup)?;
    measure(edge, warmup)?;
    for round in 0..settings.rounds {
        let pair = if round % 2 == 0 {
            let off = measure(plain, settings.measure)?;
            (off, measure(edge, settings.measure)?)
        } else {
            let on = measure(edge, settings.measure)?;
            (measure(plain, settings.measure)?, on)
        };
        rounds.push(pair);
    }
    Ok(())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}
