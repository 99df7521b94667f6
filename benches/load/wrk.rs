//! The `wrk` scenario: flagpost and the reference server measured by Debian's `wrk`
//! (`wrk -t1 -c64`), the client users reach for, rather than the harness's own. Three
//! cases, each against both servers in turn (the order alternating between rounds):
//! `/capture/` with one `$pageview` (durable), and `/decide/?v=3` on the 50-flag file
//! for callers whose person is stored and for callers with no stored person.
//!
//! wrk sends one fixed request unless a Lua script builds them, so the harness writes
//! a script that formats a pool of bodies once (`init`) and cycles through them
//! (`request`), and prints a line the harness reads (`done`): requests, duration and
//! latency percentiles, in microseconds, and wrk's error counts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;

use crate::client;
use crate::payloads::{self, Scenario};
use crate::target::Target;

/// The scenario's name on the command line.
pub const NAME: &str = "wrk";
/// wrk's connections, as the issue of record measures: `wrk -t1 -c64`.
const CONNECTIONS: usize = 64;
/// Bodies per case; each decide body is another caller.
pub const POOL: usize = 2048;
/// Callers with no stored person get distinct ids from here on, which nothing stores.
const UNSTORED_FROM: usize = 1_000_000;
/// The compactor stores the callers' persons within this after their batches.
const STORE_LIMIT: Duration = Duration::from_secs(120);
/// Marks the line the script's `done` prints.
const RESULT: &str = "WRK_RESULT ";

/// The script wrk runs: `wrk ... -s <script> <url> -- <bodies file> <path>`.
pub const SCRIPT: &str = r#"-- Written by flagpost's load harness (benches/load/wrk.rs).
local formatted = {}
local next_one = 0
function init(args)
  local headers = {["Content-Type"] = "application/json", ["User-Agent"] = "flagpost-load-wrk"}
  for line in io.lines(args[1]) do
    if #line > 0 then
      formatted[#formatted + 1] = wrk.format("POST", args[2], headers, line)
    end
  end
end
function request()
  next_one = next_one % #formatted + 1
  return formatted[next_one]
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRK_RESULT %d %d %d %d %d %d %d %d %d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect, e.read, e.write, e.status, e.timeout))
end
"#;

/// The scenario's settings, from the command line.
pub struct Settings {
    pub measure: Duration,
    pub warmup: Duration,
    pub rounds: usize,
    /// Also measure the decide cases at an edge (`--edge`), and a case naming only the
    /// flags the edge decides.
    pub edge: bool,
}

/// What one wrk run reported.
#[derive(Clone, Copy)]
pub struct Run {
    pub rate: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Connect, read, write and timeout errors, and answers that were not 2xx or 3xx.
    pub errors: u64,
}

/// One case of one round: flagpost, then the reference.
pub struct Row {
    pub case: &'static str,
    pub round: usize,
    pub flagpost: Run,
    pub reference: Run,
    /// The same case at the edge, with `--edge`.
    pub edge: Option<Run>,
}

pub struct Case {
    pub name: &'static str,
    pub path: &'static str,
    pub bodies: PathBuf,
    /// flagpost's log is drained after each of its runs (capture leaves work behind).
    pub ingests: bool,
}

/// Runs the scenario on a flagpost of its own and a reference server.
pub fn run(
    runtime: &tokio::runtime::Runtime,
    settings: &Settings,
    data_dir: &Path,
    dir: &Path,
) -> Result<Vec<Row>, String> {
    check_wrk()?;
    let work = dir.join("wrk");
    std::fs::create_dir_all(&work).map_err(|e| format!("cannot create {work:?}: {e}"))?;
    let script = work.join("bodies.lua");
    std::fs::write(&script, SCRIPT).map_err(|e| format!("cannot write the script: {e}"))?;
    let write = |name: &str, bodies: Vec<Bytes>| -> Result<PathBuf, String> {
        let path = work.join(name);
        let mut text = Vec::new();
        for body in bodies.iter().take(POOL) {
            text.extend_from_slice(body);
            text.push(b'\n');
        }
        std::fs::write(&path, text).map_err(|e| format!("cannot write {path:?}: {e}"))?;
        Ok(path)
    };
    let cases = [
        Case {
            name: "capture",
            path: Scenario::Capture.path(),
            bodies: write("capture.txt", Scenario::Capture.bodies())?,
            ingests: true,
        },
        Case {
            name: "decide, person stored",
            path: Scenario::Decide.path(),
            bodies: write("decide-stored.txt", payloads::decide_bodies(0, POOL))?,
            ingests: false,
        },
        Case {
            name: "decide, no person",
            path: Scenario::Decide.path(),
            bodies: write(
                "decide-unstored.txt",
                payloads::decide_bodies(UNSTORED_FROM, POOL),
            )?,
            ingests: false,
        },
    ];
    let mut cases = Vec::from(cases);
    if settings.edge {
        let bodies = super::edge::conclusive(&payloads::decide_bodies(0, POOL))?;
        cases.push(Case {
            name: "decide, edge decides",
            path: Scenario::Decide.path(),
            bodies: write("decide-conclusive.txt", bodies)?,
            ingests: false,
        });
    }
    let mut flagpost = Target::flagpost(data_dir, &dir.join("wrk-db"))?;
    let mut reference = Target::reference()?;
    runtime.block_on(store_persons(flagpost.addr))?;
    let mut edge = match settings.edge {
        true => Some(super::edge::start(data_dir, dir)?),
        false => None,
    };
    if let Some((upstream, edge)) = &edge {
        runtime.block_on(store_persons(upstream.addr))?;
        runtime.block_on(store_persons(edge.addr))?;
    }
    let edge_addr = edge.as_ref().map(|(_, e)| e.addr);

    let measure = |addr: SocketAddr, case: &Case, duration: Duration| {
        let run = wrk(addr, &script, case, duration)?;
        if case.ingests && addr == flagpost.addr {
            runtime.block_on(client::settle(addr));
        }
        Ok::<Run, String>(run)
    };
    let warmup = settings.warmup.max(Duration::from_secs(1));
    for case in &cases {
        measure(flagpost.addr, case, warmup)?;
        measure(reference.addr, case, warmup)?;
        if let Some(addr) = edge_addr.filter(|_| !case.ingests) {
            measure(addr, case, warmup)?;
        }
    }
    let mut rows = Vec::new();
    for round in 0..settings.rounds {
        for case in &cases {
            // Rounds take turns at going first, so the order's advantage cancels out.
            let (ours, theirs) = if round % 2 == 0 {
                let ours = measure(flagpost.addr, case, settings.measure)?;
                (ours, measure(reference.addr, case, settings.measure)?)
            } else {
                let theirs = measure(reference.addr, case, settings.measure)?;
                (measure(flagpost.addr, case, settings.measure)?, theirs)
            };
            let at_edge = match edge_addr {
                Some(addr) if !case.ingests => Some(measure(addr, case, settings.measure)?),
                _ => None,
            };
            rows.push(Row {
                case: case.name,
                round,
                flagpost: ours,
                reference: theirs,
                edge: at_edge,
            });
        }
    }
    flagpost.stop()?;
    reference.stop()?;
    if let Some((mut upstream, mut edge)) = edge.take() {
        edge.stop()?;
        upstream.stop()?;
    }
    Ok(rows)
}

/// wrk is Debian's package, not a crate: say how to get it rather than fail obscurely.
pub fn check_wrk() -> Result<(), String> {
    match Command::new("wrk").arg("--version").output() {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(
            "the wrk scenario needs Debian's wrk, which is not installed: apt-get install -y wrk"
                .into(),
        ),
        Err(e) => Err(format!("cannot run wrk: {e}")),
    }
}

/// Persons for the stored callers (`distinct_id` 0 to `POOL`), through batches of page
/// views, applied by the compactor before any measurement.
async fn store_persons(addr: SocketAddr) -> Result<(), String> {
    let mut sender = client::connect(addr)
        .await
        .map_err(|e| format!("cannot connect to flagpost: {e}"))?;
    for body in payloads::person_batches(POOL.div_ceil(payloads::BATCH_EVENTS)) {
        let request = client::request(Scenario::Batch, addr, body);
        let status = client::send(&mut sender, request)
            .await
            .map_err(|e| format!("storing the callers' persons: {e}"))?;
        if !status.is_success() {
            return Err(format!(
                "storing the callers' persons: flagpost answered {status}"
            ));
        }
    }
    client::wait_for_empty_log(addr, STORE_LIMIT).await?;
    // The two decide cases must differ in what they claim to: ask the read API.
    let last = crate::common::distinct_id(POOL - 1);
    let unstored = crate::common::distinct_id(UNSTORED_FROM);
    match (persons(addr, &last).await?, persons(addr, &unstored).await?) {
        (1, 0) => Ok(()),
        (found, unexpected) => Err(format!(
            "after storing the callers' persons the read API finds {found} for {last} \
             and {unexpected} for {unstored} (expected 1 and 0)"
        )),
    }
}

/// How many persons the read API finds for `distinct_id`.
async fn persons(addr: SocketAddr, distinct_id: &str) -> Result<usize, String> {
    let path = format!("/api/projects/1/persons/?distinct_id={distinct_id}");
    let attempt = async {
        let mut sender = client::connect(addr).await?;
        sender.ready().await?;
        let request = hyper::Request::get(path.as_str())
            .header(hyper::header::HOST, addr.to_string())
            .header(
                hyper::header::AUTHORIZATION,
                format!("Bearer {}", crate::flags::PERSONAL_KEY),
            )
            .body(http_body_util::Full::new(Bytes::new()))?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await?
            .to_bytes();
        Ok::<_, client::Error>((status, body))
    };
    let (status, body) = attempt
        .await
        .map_err(|e| format!("GET {path} failed: {e}"))?;
    let value: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| format!("GET {path}: {status}, not JSON: {e}"))?;
    value["results"]
        .as_array()
        .map(Vec::len)
        .ok_or_else(|| format!("GET {path}: {status} {value}"))
}

pub fn wrk(
    addr: SocketAddr,
    script: &Path,
    case: &Case,
    duration: Duration,
) -> Result<Run, String> {
    let output = Command::new("wrk")
        .arg("-t1")
        .arg(format!("-c{CONNECTIONS}"))
        .arg(format!("-d{}s", duration.as_secs().max(1)))
        .arg("-s")
        .arg(script)
        .arg(format!("http://{addr}/"))
        .arg("--")
        .arg(&case.bodies)
        .arg(case.path)
        .output()
        .map_err(|e| format!("cannot run wrk: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().find_map(|l| l.strip_prefix(RESULT));
    let (Some(line), true) = (line, output.status.success()) else {
        return Err(format!(
            "wrk failed on {} ({}): {}{}",
            case.name,
            output.status,
            stdout,
            String::from_utf8_lossy(&output.stderr)
        ));
    };
    let n: Vec<u64> = line
        .split_whitespace()
        .map(|x| x.parse().map_err(|_| format!("wrk printed {line:?}")))
        .collect::<Result<_, _>>()?;
    let [requests, micros, p50, p99, connect, read, write, status, timeout] = n[..] else {
        return Err(format!("wrk printed {line:?}"));
    };
    Ok(Run {
        rate: requests as f64 * 1e6 / micros.max(1) as f64,
        p50_ms: p50 as f64 / 1000.0,
        p99_ms: p99 as f64 / 1000.0,
        errors: connect + read + write + status + timeout,
    })
}

/// Each round's figures, then the geometric mean of the ratio per case.
pub fn report(rows: &[Row]) {
    println!();
    println!("wrk -t1 -c{CONNECTIONS}, flagpost and the reference in turn");
    println!(
        "{:<22} {:>5} {:>10} {:>8} {:>8} {:>10} {:>8} {:>7} {:>7}",
        "case", "round", "req/s", "p50 ms", "p99 ms", "ref req/s", "ref p99", "ratio", "errors"
    );
    for row in rows {
        let (ours, theirs) = (row.flagpost, row.reference);
        println!(
            "{:<22} {:>5} {:>10.0} {:>8.2} {:>8.2} {:>10.0} {:>8.2} {:>7.3} {:>7}",
            row.case,
            row.round + 1,
            ours.rate,
            ours.p50_ms,
            ours.p99_ms,
            theirs.rate,
            theirs.p99_ms,
            ours.rate / theirs.rate.max(f64::MIN_POSITIVE),
            ours.errors + theirs.errors,
        );
    }
    for row in rows {
        if let Some(edge) = row.edge {
            println!(
                "{:<22} {:>5} edge {:>10.0} req/s, p50 {:.2} ms, p99 {:.2} ms; edge / flagpost {:.3}, edge / reference {:.3}; errors {}",
                row.case,
                row.round + 1,
                edge.rate,
                edge.p50_ms,
                edge.p99_ms,
                edge.rate / row.flagpost.rate.max(f64::MIN_POSITIVE),
                edge.rate / row.reference.rate.max(f64::MIN_POSITIVE),
                edge.errors,
            );
        }
    }
    let mut cases: Vec<&str> = Vec::new();
    for row in rows {
        if !cases.contains(&row.case) {
            cases.push(row.case);
        }
    }
    for case in cases {
        let ratios: Vec<f64> = rows
            .iter()
            .filter(|r| r.case == case && r.reference.rate > 0.0)
            .map(|r| r.flagpost.rate / r.reference.rate)
            .collect();
        if ratios.is_empty() {
            continue;
        }
        let mean = (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp();
        println!(
            "{case}: ratio (flagpost / reference req/s) {mean:.3} over {} round(s)",
            ratios.len()
        );
    }
}
