//! The ClickHouse sink's pace (`--scenario sink`): batches with persons offered at a
//! steady rate (`--rate`, 100,000 events/s unless given) to flagpost twice, first
//! without the sink and then with it, sending to a `clickhouse-server` the harness
//! starts on loopback with the tests' own starter (`tests/integration/sink/server.rs`,
//! Debian's package, as `.ci/run` installs it). From flagpost's `/metrics` and
//! `/proc`, sampled a few times a second: events per second the compactor applied
//! and the sink had acknowledged, the sink's largest lag, and the CPU each process
//! used. Then how long the sink took to send what was left, and ClickHouse's own
//! count of the events checked against flagpost's count of those it acknowledged.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::clickhouse::{self, ClickHouse};
use crate::client::{self, Load, Measurement};
use crate::payloads::Scenario;
use crate::target::{Options, Target};

pub const NAME: &str = "sink";
/// The rate the sink is asked to keep up with when `--rate` is not given.
pub const DEFAULT_RATE: f64 = 100_000.0;
/// The database the sink writes, created afresh on the harness's own server.
const DATABASE: &str = "flagpost_load";
/// How often `/metrics` and `/proc` are read.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// A backlog the sink has not sent after this long is reported as not sent.
const DRAIN_LIMIT: Duration = Duration::from_secs(180);

/// What the scenario needs from the command line.
pub struct Settings {
    pub rate: f64,
    pub connections: usize,
    pub warmup: Duration,
    pub measure: Duration,
    pub clickhouse_nice: i32,
}

/// One reading of the counters.
#[derive(Clone)]
struct Sample {
    at: Instant,
    applied: f64,
    /// Event rows ClickHouse acknowledged, and the sink's lag (with the sink only).
    sent: Option<f64>,
    lag_seconds: Option<f64>,
    /// CPU seconds used so far by flagpost and by clickhouse-server.
    flagpost_cpu: f64,
    /// flagpost's CPU seconds by thread name (`compactor`, `tokio-rt-worker`, ...).
    threads: BTreeMap<String, f64>,
    clickhouse_cpu: Option<f64>,
    /// The harness itself: the load client's share of the same cores.
    client_cpu: f64,
    /// Every process on the machine, from `/proc/stat`.
    machine_cpu: f64,
}

/// One flagpost under the offered load.
pub struct Run {
    pub ingest: Measurement,
    /// Events per second the compactor applied inside the measured window.
    pub applied: f64,
    /// Cores flagpost kept busy on average inside the window (1.0 is one core).
    pub flagpost_cores: f64,
    /// The same by thread name, busiest first.
    pub threads: Vec<(String, f64)>,
    /// Cores the load client (this harness) kept busy.
    pub client_cores: f64,
    /// Cores the whole machine kept busy: what is left after flagpost, ClickHouse
    /// and the client was taken by other processes (a build, say).
    pub machine_cores: f64,
    /// With the sink: event rows per second ClickHouse acknowledged, the largest lag,
    /// and the cores clickhouse-server kept busy.
    pub sent: Option<f64>,
    pub max_lag_seconds: Option<f64>,
    pub clickhouse_cores: Option<f64>,
}

pub struct Report {
    pub rate: f64,
    pub without: Run,
    pub with: Run,
    /// From the end of the load until the sink had sent every event: the events
    /// still to send then, and the seconds it took.
    pub drained: Result<Drained, String>,
    /// Events flagpost acknowledged, and ClickHouse's `count()` and distinct uuids
    /// of them under `FINAL`.
    pub accepted: u64,
    pub in_clickhouse: u64,
    pub distinct_uuids: u64,
    pub clickhouse_version: String,
    pub clickhouse_peak_kib: Option<u64>,
}

/// The whole scenario; `data_dir` holds the flag files, `dir` the databases.
pub fn run(
    runtime: &tokio::runtime::Runtime,
    settings: &Settings,
    data_dir: &Path,
    dir: &Path,
) -> Result<Report, String> {
    let ch = start_clickhouse(DATABASE, settings.clickhouse_nice)?;
    let load = Load {
        scenario: Scenario::Compactor,
        bodies: Scenario::Compactor.bodies().into(),
        connections: settings.connections,
        warmup: settings.warmup,
        measure: settings.measure,
        interval: Some(Duration::from_secs_f64(
            settings.connections as f64 * crate::payloads::BATCH_EVENTS as f64 / settings.rate,
        )),
    };

    let mut plain = Target::flagpost(data_dir, &dir.join("sink-off-db"))?;
    let without = runtime.block_on(measure(&plain, None, &load))?;
    plain.stop()?;

    let mut sinking = Target::flagpost_with(
        "flagpost",
        Path::new(env!("CARGO_BIN_EXE_flagpost")),
        data_dir,
        &dir.join("sink-on-db"),
        &options(&ch),
    )?;
    let with = runtime.block_on(measure(&sinking, Some(ch.pid()), &load))?;
    let drained = runtime.block_on(drain(sinking.addr));
    let accepted = runtime.block_on(client::metric(
        sinking.addr,
        "flagpost_events_accepted_total",
    ))?;
    sinking.stop()?;

    let counts = ch.query("SELECT count(), uniqExact(uuid) FROM events FINAL");
    let mut counts = counts.split_whitespace().map(str::parse::<u64>);
    let (Some(Ok(in_clickhouse)), Some(Ok(distinct_uuids))) = (counts.next(), counts.next()) else {
        return Err("ClickHouse's count of the events does not parse".into());
    };
    Ok(Report {
        rate: settings.rate,
        without,
        with,
        drained,
        accepted: accepted as u64,
        in_clickhouse,
        distinct_uuids,
        clickhouse_version: ch.query("SELECT version()").trim().to_string(),
        clickhouse_peak_kib: crate::target::status_kib(ch.pid(), "VmHWM").ok(),
    })
}

/// A clickhouse-server of the harness's own with `database` created, at nice value
/// `nice`; an error saying how to install it if it is not there.
pub fn start_clickhouse(database: &str, nice: i32) -> Result<ClickHouse, String> {
    if clickhouse::binary().is_none() {
        return Err(
            "this needs clickhouse-server: apt-get install clickhouse-server \
                    (or set CLICKHOUSE_SERVER to its path)"
                .into(),
        );
    }
    let ch = ClickHouse::start_niced(database, nice);
    println!(
        "clickhouse-server: {} on {} at nice {nice}, started in {:.2} s",
        ch.query("SELECT version()").trim(),
        ch.addr,
        ch.started_in.as_secs_f64()
    );
    Ok(ch)
}

/// The options that send a flagpost's sink to `ch` (the password in the environment,
/// as it is never given on the command line).
pub fn options(ch: &ClickHouse) -> Options {
    Options {
        args: [
            "--clickhouse-url",
            &ch.url(),
            "--clickhouse-database",
            &ch.database,
            "--clickhouse-user",
            clickhouse::USER,
        ]
        .map(String::from)
        .to_vec(),
        env: vec![(
            "FLAGPOST_CLICKHOUSE_PASSWORD".into(),
            clickhouse::PASSWORD.into(),
        )],
    }
}

/// Drive `target` with `load` while sampling; `clickhouse` is the server's pid when
/// the target sinks into it.
async fn measure(target: &Target, clickhouse: Option<u32>, load: &Load) -> Result<Run, String> {
    let (addr, pid) = (target.addr, target.pid());
    let (ingest, inside) = client::run_sampled(
        load,
        addr,
        SAMPLE_EVERY,
        move || sample(addr, pid, clickhouse),
        |s| s.at,
    )
    .await?;
    let (Some(a), Some(b)) = (inside.first(), inside.last()) else {
        return Err("too few samples inside the window".into());
    };
    let seconds = (b.at - a.at).as_secs_f64();
    if seconds <= 0.0 {
        return Err("too few samples inside the window".into());
    }
    let per_second = |x: Option<f64>, y: Option<f64>| Some((y? - x?) / seconds);
    Ok(Run {
        ingest,
        applied: (b.applied - a.applied) / seconds,
        flagpost_cores: (b.flagpost_cpu - a.flagpost_cpu) / seconds,
        threads: by_thread(&a.threads, &b.threads, seconds),
        client_cores: (b.client_cpu - a.client_cpu) / seconds,
        machine_cores: (b.machine_cpu - a.machine_cpu) / seconds,
        sent: per_second(a.sent, b.sent),
        max_lag_seconds: inside.iter().filter_map(|s| s.lag_seconds).reduce(f64::max),
        clickhouse_cores: per_second(a.clickhouse_cpu, b.clickhouse_cpu),
    })
}

async fn sample(addr: SocketAddr, pid: u32, clickhouse: Option<u32>) -> Result<Sample, String> {
    let c = counters(addr).await?;
    Ok(Sample {
        at: Instant::now(),
        applied: c.applied,
        sent: c.sent.filter(|_| clickhouse.is_some()),
        lag_seconds: c.lag_seconds.filter(|_| clickhouse.is_some()),
        flagpost_cpu: cpu_seconds(pid)?,
        threads: thread_seconds(pid),
        clickhouse_cpu: clickhouse.map(cpu_seconds).transpose()?,
        client_cpu: cpu_seconds(std::process::id())?,
        machine_cpu: machine_busy_seconds()?,
    })
}

/// flagpost's own counters, from its `/metrics`.
struct Counters {
    applied: f64,
    accepted: f64,
    sent: Option<f64>,
    lag_seconds: Option<f64>,
}

async fn counters(addr: SocketAddr) -> Result<Counters, String> {
    let text = client::get_text(addr, "/metrics").await?;
    let read = |name: &str| {
        client::metric_in(&text, name).ok_or_else(|| format!("{name} missing from /metrics"))
    };
    Ok(Counters {
        applied: read("flagpost_compactor_applied_total")?,
        accepted: read("flagpost_events_accepted_total")?,
        sent: client::metric_in(&text, "flagpost_sink_rows_total{table=\"events\"}"),
        lag_seconds: client::metric_in(&text, "flagpost_sink_lag_seconds"),
    })
}

/// Wait for the sink to send what a measurement left, so it does not run during the
/// next one; one that does not catch up in time is reported and the run goes on.
pub async fn settle(addr: SocketAddr) {
    if let Err(e) = drain(addr).await {
        eprintln!("load: the sink did not catch up before the next run: {e}");
    }
}

pub struct Drained {
    pub backlog: f64,
    pub seconds: f64,
}

/// Wait until ClickHouse has acknowledged every event flagpost accepted and the lag
/// is back to 0.
pub async fn drain(addr: SocketAddr) -> Result<Drained, String> {
    let started = Instant::now();
    let mut backlog = None;
    loop {
        let c = counters(addr).await?;
        let sent = c
            .sent
            .ok_or("flagpost_sink_rows_total missing from /metrics")?;
        let backlog = *backlog.get_or_insert(c.accepted - sent);
        if sent >= c.accepted && c.lag_seconds == Some(0.0) {
            return Ok(Drained {
                backlog,
                seconds: started.elapsed().as_secs_f64(),
            });
        }
        if started.elapsed() > DRAIN_LIMIT {
            return Err(format!(
                "{sent:.0} of {:.0} events sent after {DRAIN_LIMIT:?}",
                c.accepted
            ));
        }
        tokio::time::sleep(SAMPLE_EVERY / 2).await;
    }
}

/// CPU seconds a process has used so far, user and system, all its threads: fields
/// 14 and 15 of `/proc/<pid>/stat`, in clock ticks of 1/100 s (Linux's `USER_HZ`).
fn cpu_seconds(pid: u32) -> Result<f64, String> {
    cpu_seconds_of(&format!("/proc/{pid}/stat"))
}

/// The same from a `stat` file of a process or of one of its threads.
fn cpu_seconds_of(path: &str) -> Result<f64, String> {
    let stat = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    // The command name (field 2) may hold spaces; the fields after it are plain.
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| format!("{path} does not parse"))?;
    let mut fields = after_name.split_whitespace().skip(11);
    let ticks = |f: Option<&str>| f.and_then(|t| t.parse::<u64>().ok());
    match (ticks(fields.next()), ticks(fields.next())) {
        (Some(user), Some(system)) => Ok((user + system) as f64 / USER_HZ),
        _ => Err(format!("{path} does not parse")),
    }
}

/// CPU seconds of each of a process's threads so far, summed by thread name (threads
/// that ended are missing, so a name's figure is a lower bound).
fn thread_seconds(pid: u32) -> BTreeMap<String, f64> {
    let mut by_name = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return by_name;
    };
    for task in tasks.flatten() {
        let Ok(tid) = task.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if let Ok(seconds) = cpu_seconds_of(&format!("/proc/{pid}/task/{tid}/stat")) {
            *by_name.entry(comm.trim().to_string()).or_insert(0.0) += seconds;
        }
    }
    by_name
}

/// Cores per thread name between two readings, busiest first.
fn by_thread(
    a: &BTreeMap<String, f64>,
    b: &BTreeMap<String, f64>,
    seconds: f64,
) -> Vec<(String, f64)> {
    let mut cores: Vec<(String, f64)> = b
        .iter()
        .map(|(name, end)| {
            let start = a.get(name).copied().unwrap_or(0.0);
            (name.clone(), (end - start).max(0.0) / seconds)
        })
        .collect();
    cores.sort_by(|x, y| y.1.total_cmp(&x.1));
    cores
}

/// CPU seconds all cores have spent busy since boot: user, nice, system, irq and
/// softirq of the first line of `/proc/stat` (not idle, iowait or steal; guest time
/// is already inside user and nice).
fn machine_busy_seconds() -> Result<f64, String> {
    let stat = std::fs::read_to_string("/proc/stat")
        .map_err(|e| format!("cannot read /proc/stat: {e}"))?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("cpu "))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|t| t.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    if ticks.len() < 7 {
        return Err("/proc/stat does not parse".into());
    }
    let busy: u64 = [0, 1, 2, 5, 6].iter().map(|&i| ticks[i]).sum();
    Ok(busy as f64 / USER_HZ)
}

/// The unit of `/proc/<pid>/stat`'s times, fixed at 100 on Linux for user space.
const USER_HZ: f64 = 100.0;
