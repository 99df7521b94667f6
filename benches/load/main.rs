//! Load harness: measures flagpost side by side with a trivial reference server in one
//! run, so a throughput number always comes with the ceiling of the same machine, the
//! same hyper and tokio, and the same client.
//!
//! `cargo bench --bench load [-- --seconds 5 --connections 32 --scenario capture]`
//!
//! The harness starts the release `flagpost` binary on a temporary data dir and
//! database, and re-executes itself with `--reference-server` to start the reference
//! (`reference`: reads the body, answers `{"status":1}`) in its own process. For each
//! scenario (`payloads`) it drives both targets in turn with its own keep-alive client
//! (`client`) and prints one table (`report`). Process handling lives in `target`, the
//! 50-flag definitions file written for `/decide` in `flags`.

#[allow(dead_code)]
#[path = "../../tests/integration/sink/server.rs"]
mod clickhouse;
mod client;
#[path = "../common/mod.rs"]
mod common;
mod compactor;
mod console;
mod disk;
mod edge;
mod flags;
mod forward;
mod forward_cpu;
mod forward_drain;
mod forward_report;
mod memory;
mod payloads;
mod person_events;
mod reference;
mod report;
mod scale;
mod scale_events;
mod scale_lookups;
mod sink;
mod target;
mod threads;
/// The tests' HTTP helpers, which the ClickHouse starter uses.
#[allow(dead_code)]
#[path = "../../tests/integration/util.rs"]
mod util;
mod wrk;

use std::process::ExitCode;
use std::time::Duration;

use argh::FromArgs;

use payloads::Scenario;
use report::Row;
use target::Target;

/// Long enough for a stable rate and p99 on a noisy shared VM, short enough that the
/// whole run (3 scenarios x 2 targets) stays under a minute.
const DEFAULT_SECONDS: u64 = 5;
/// Enough concurrency for group commit to share fsyncs, modest for a 2-core machine.
const DEFAULT_CONNECTIONS: usize = 32;
/// Lets connections open, caches warm and the log's writer settle before measuring.
const DEFAULT_WARMUP_MS: u64 = 1000;

#[derive(FromArgs)]
/// Measure flagpost against a trivial hyper server under the same load.
struct Args {
    /// seconds to measure each scenario against each target [default 5]
    #[argh(option, default = "DEFAULT_SECONDS")]
    seconds: u64,
    /// keep-alive connections, each sending requests back to back [default 32]
    #[argh(option, default = "DEFAULT_CONNECTIONS")]
    connections: usize,
    /// milliseconds of unmeasured load before each measurement [default 1000]
    #[argh(option, default = "DEFAULT_WARMUP_MS")]
    warmup_ms: u64,
    /// scenario to run: capture, batch, decide, compactor, compactor-anon, memory (an
    /// ingest of --memory-events, then a soak), disk (--disk-events from
    /// --disk-persons, then the database's size at rest, per tree), sink (the ClickHouse sink at --rate,
    /// default 100000 events/s; needs clickhouse-server), console (batch and decide
    /// alone, then beside console users), scale (--scale-events from --scale-persons,
    /// figures for each tenth, then disk at rest, restarts and lookups), wrk (capture and decide under Debian's
    /// `wrk -t1 -c64`, for --seconds, --rounds times) or forward (an edge in front of an
    /// upstream flagpost: --forward-events drained, wrk capture with forwarding on and
    /// off, an outage of --outage-seconds at --forward-rate); repeat for several [default all
    /// but memory, disk, sink, console, scale, wrk and forward]
    #[argh(option)]
    scenario: Vec<String>,
    /// forward scenario: events captured while upstream is down, then drained
    /// [default 200000]
    #[argh(option, default = "200_000")]
    forward_events: usize,
    /// forward scenario: seconds upstream is down while capture goes on at
    /// --forward-rate [default 60]
    #[argh(option, default = "60")]
    outage_seconds: u64,
    /// forward scenario: events/s captured at the edge through the outage and its
    /// drain [default 5000]
    #[argh(option, default = "forward::DEFAULT_RATE")]
    forward_rate: f64,
    /// disk scenario: events to ingest before measuring the database at rest
    /// [default 200000]
    #[argh(option, default = "200_000")]
    disk_events: usize,
    /// disk scenario: distinct persons sending them, a multiple of 100 [default 20000]
    #[argh(option, default = "20_000")]
    disk_persons: usize,
    /// scale scenario: events to send [default 20000000]
    #[argh(option, default = "20_000_000")]
    scale_events: u64,
    /// scale scenario: persons sending them [default 1000000]
    #[argh(option, default = "1_000_000")]
    scale_persons: u64,
    /// scale scenario: copy each target's data dir and database at rest (after its
    /// clean stop) to DIR/<target>/{data,db}, to measure reads on them later
    #[argh(option)]
    scale_keep: Option<std::path::PathBuf>,
    /// memory scenario: events to ingest from 100,000 persons before reading the
    /// resident set [default 1000000]
    #[argh(option, default = "1_000_000")]
    memory_events: usize,
    /// memory scenario: seconds of steady load afterwards, sampling the resident set
    /// every 30 s; --rate sets its events/s (default 2000) [default 600]
    #[argh(option, default = "600")]
    soak_seconds: u64,
    /// offered load in events per second (requests per second for decide), spread over
    /// the connections; without it every connection sends back to back
    #[argh(option)]
    rate: Option<f64>,
    /// another flagpost binary (say, a build of an earlier commit) to measure beside
    /// this one, on its own database
    #[argh(option)]
    baseline: Option<std::path::PathBuf>,
    /// measure flagpost with its ClickHouse sink on, into a clickhouse-server the
    /// harness starts; without --baseline, the same build without the sink is the
    /// baseline
    #[argh(switch)]
    with_sink: bool,
    /// in the wrk scenario, also measure the decide cases at an edge (`serve --upstream`
    /// in front of another flagpost on the same rules)
    #[argh(switch)]
    edge: bool,
    /// measure each scenario this many times (the compactor ones once), the baseline
    /// going first in every other round, and print the geometric mean of flagpost /
    /// baseline [default 1]
    #[argh(option, default = "1")]
    rounds: usize,
    /// the nice value, 0 to 19, of the clickhouse-server the harness starts (for
    /// --with-sink and the sink scenario) [default 0]
    #[argh(option, default = "0")]
    clickhouse_nice: i32,
    /// console scenario: each console user's pause after each answer, in milliseconds
    /// (0: back to back; 500 is a person reading pages with the live tail on) [default 0]
    #[argh(option, default = "0")]
    console_pause_ms: u64,
    /// measure the baseline before flagpost in each scenario (the default is after),
    /// to see what the order does to a comparison
    #[argh(switch)]
    baseline_first: bool,
    /// internal: serve as the reference server (the harness starts it itself)
    #[argh(switch)]
    reference_server: bool,
    /// ignored; `cargo bench` passes it
    #[argh(switch)]
    #[allow(dead_code)]
    bench: bool,
}

/// Validated settings of one harness run.
struct Config {
    measure: Duration,
    warmup: Duration,
    rate: Option<f64>,
    connections: usize,
    scenarios: Vec<Scenario>,
    baseline: Option<std::path::PathBuf>,
    /// flagpost sinks into ClickHouse (`--with-sink`).
    with_sink: bool,
    baseline_first: bool,
    rounds: usize,
    clickhouse_nice: i32,
    /// The memory scenario's settings, when it was asked for.
    memory: Option<memory::Settings>,
    /// The disk scenario's settings, when it was asked for.
    disk: Option<disk::Settings>,
    /// The sink scenario's settings, when it was asked for.
    sink: Option<sink::Settings>,
    /// The console scenario's settings, when it was asked for.
    console: Option<console::Settings>,
    /// The wrk scenario's settings, when it was asked for.
    wrk: Option<wrk::Settings>,
    /// The scale scenario's settings, when it was asked for.
    scale: Option<scale::Settings>,
    /// The forward scenario's settings, when it was asked for.
    forward: Option<forward::Settings>,
}

fn main() -> ExitCode {
    let args: Args = argh::from_env();
    if args.reference_server {
        return match reference::run() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("reference server: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match config(args).and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("load: {e}");
            ExitCode::FAILURE
        }
    }
}

fn config(args: Args) -> Result<Config, String> {
    if args.seconds == 0 || args.connections == 0 {
        return Err("--seconds and --connections must be at least 1".into());
    }
    if !(args.forward_rate.is_finite() && args.forward_rate > 0.0) {
        return Err("--forward-rate must be a number of events/s above 0".into());
    }
    let with_memory = args.scenario.iter().any(|name| name == memory::NAME);
    let with_sink_scenario = args.scenario.iter().any(|name| name == sink::NAME);
    let with_console = args.scenario.iter().any(|name| name == console::NAME);
    let with_wrk = args.scenario.iter().any(|name| name == wrk::NAME);
    let with_disk = args.scenario.iter().any(|name| name == disk::NAME);
    let with_scale = args.scenario.iter().any(|name| name == scale::NAME);
    let with_forward = args.scenario.iter().any(|name| name == forward::NAME);
    let scenarios = if args.scenario.is_empty() {
        Scenario::ALL.to_vec()
    } else {
        args.scenario
            .iter()
            .filter(|name| {
                ![
                    memory::NAME,
                    sink::NAME,
                    console::NAME,
                    wrk::NAME,
                    disk::NAME,
                    scale::NAME,
                    forward::NAME,
                ]
                .contains(&name.as_str())
            })
            .map(|name| Scenario::parse(name))
            .collect::<Result<_, _>>()?
    };
    let memory = with_memory.then(|| memory::Settings {
        events: args.memory_events.max(1),
        connections: args.connections,
        soak: Duration::from_secs(args.soak_seconds),
        soak_rate: args.rate.filter(|r| *r > 0.0).unwrap_or(2000.0),
    });
    if !(0..=19).contains(&args.clickhouse_nice) {
        return Err("--clickhouse-nice must be 0 to 19".into());
    }
    let sink = with_sink_scenario.then(|| sink::Settings {
        rate: args.rate.filter(|r| *r > 0.0).unwrap_or(sink::DEFAULT_RATE),
        connections: args.connections,
        warmup: Duration::from_millis(args.warmup_ms),
        measure: Duration::from_secs(args.seconds),
        clickhouse_nice: args.clickhouse_nice,
    });
    if args.baseline_first && args.baseline.is_none() && !args.with_sink {
        return Err("--baseline-first needs a baseline: --baseline or --with-sink".into());
    }
    Ok(Config {
        measure: Duration::from_secs(args.seconds),
        warmup: Duration::from_millis(args.warmup_ms),
        rate: args.rate.filter(|r| *r > 0.0),
        connections: args.connections,
        scenarios,
        baseline: args.baseline.clone(),
        with_sink: args.with_sink,
        baseline_first: args.baseline_first,
        rounds: args.rounds.max(1),
        clickhouse_nice: args.clickhouse_nice,
        memory,
        disk: with_disk.then(|| disk::Settings {
            events: args.disk_events.max(1),
            persons: args.disk_persons.max(payloads::BATCH_EVENTS),
            connections: args.connections,
        }),
        sink,
        console: with_console.then(|| console::Settings {
            connections: args.connections,
            warmup: Duration::from_millis(args.warmup_ms),
            measure: Duration::from_secs(args.seconds),
            pause: Duration::from_millis(args.console_pause_ms),
        }),
        scale: with_scale.then(|| scale::Settings {
            events: args.scale_events.max(1),
            persons: args.scale_persons.max(1),
            keep: args.scale_keep.clone(),
            connections: args.connections,
        }),
        forward: with_forward.then(|| forward::Settings {
            events: args.forward_events.max(payloads::BATCH_EVENTS),
            outage: Duration::from_secs(args.outage_seconds.max(1)),
            rate: args.forward_rate,
            connections: args.connections,
            measure: Duration::from_secs(args.seconds),
            warmup: Duration::from_millis(args.warmup_ms),
            rounds: args.rounds.max(1),
            baseline: args.baseline.clone(),
        }),
        wrk: with_wrk.then(|| wrk::Settings {
            measure: Duration::from_secs(args.seconds),
            warmup: Duration::from_millis(args.warmup_ms),
            rounds: args.rounds.max(1),
            edge: args.edge,
        }),
    })
}

fn run(config: Config) -> Result<(), String> {
    report::preamble(&config);
    // Under the target dir rather than /tmp, which is often tmpfs: there fsync costs
    // nothing and capture would look faster than it is on the disk it will run on.
    let dir = tempfile::Builder::new()
        .prefix("flagpost-load-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .map_err(|e| format!("cannot create a temporary dir: {e}"))?;
    let data_dir = dir.path().join("data");
    flags::write_data_dir(&data_dir).map_err(|e| format!("cannot write the data dir: {e}"))?;
    println!(
        "databases: under {} (removed at the end)",
        dir.path().display()
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the client runtime: {e}"))?;
    if !config.scenarios.is_empty() {
        compare(&config, &runtime, &data_dir, dir.path())?;
    }
    if let Some(settings) = &config.memory {
        // A server of its own, so the volume is exactly what this scenario sent.
        let mut flagpost = Target::flagpost(&data_dir, &dir.path().join("memory-db"))?;
        let bodies: std::sync::Arc<[bytes::Bytes]> = memory::bodies().into();
        let report = runtime.block_on(memory::measure(
            flagpost.addr,
            flagpost.pid(),
            bodies,
            settings,
        ))?;
        report::memory_scenario(&report);
        flagpost.stop()?;
    }
    if let Some(settings) = &config.disk {
        let this_build = std::path::Path::new(env!("CARGO_BIN_EXE_flagpost"));
        let mut targets = vec![("flagpost", this_build, "disk-db")];
        if let Some(binary) = &config.baseline {
            targets.push(("baseline", binary.as_path(), "disk-baseline-db"));
        }
        for (name, binary, db) in targets {
            let report = disk::run(
                &runtime,
                settings,
                name,
                binary,
                &data_dir,
                &dir.path().join(db),
            )?;
            disk::report(&report);
        }
    }
    if let Some(settings) = &config.scale {
        let this_build = std::path::Path::new(env!("CARGO_BIN_EXE_flagpost"));
        let mut targets = vec![("flagpost", this_build, "scale-db")];
        if let Some(binary) = &config.baseline {
            targets.push(("baseline", binary.as_path(), "scale-baseline-db"));
        }
        for (name, binary, db) in targets {
            let report = scale::run(
                &runtime,
                settings,
                name,
                binary,
                &data_dir,
                &dir.path().join(db),
            )?;
            scale::report(&report);
        }
    }
    if let Some(settings) = &config.console {
        let rows = console::run(&runtime, settings, &data_dir, dir.path())?;
        console::report(&rows, settings.pause);
    }
    if let Some(settings) = &config.wrk {
        let rows = wrk::run(&runtime, settings, &data_dir, dir.path())?;
        wrk::report(&rows);
    }
    if let Some(settings) = &config.forward {
        let report = forward::run(&runtime, settings, &data_dir, dir.path())?;
        forward::report(&report);
        if let Some(failed) = report.failures() {
            return Err(format!("the forward scenario did not finish: {failed}"));
        }
    }
    if let Some(settings) = &config.sink {
        let report = sink::run(&runtime, settings, &data_dir, &dir.path().join("sink"))?;
        report::sink_scenario(&report);
    }
    Ok(())
}

/// The side-by-side scenarios: flagpost, the baseline if any, and the reference.
fn compare(
    config: &Config,
    runtime: &tokio::runtime::Runtime,
    data_dir: &std::path::Path,
    dir: &std::path::Path,
) -> Result<(), String> {
    let this_build = std::path::Path::new(env!("CARGO_BIN_EXE_flagpost"));
    // With the sink, ClickHouse runs (idle, or taking what flagpost sends) through
    // every measurement, as it would beside a production flagpost.
    let clickhouse = match config.with_sink {
        true => Some(sink::start_clickhouse(
            "flagpost_load",
            config.clickhouse_nice,
        )?),
        false => None,
    };
    let options = clickhouse.as_ref().map(sink::options).unwrap_or_default();
    let mut flagpost =
        Target::flagpost_with("flagpost", this_build, data_dir, &dir.join("db"), &options)?;
    let baseline_binary = match (&config.baseline, config.with_sink) {
        (Some(binary), _) => Some(binary.as_path()),
        (None, true) => Some(this_build),
        (None, false) => None,
    };
    let mut baseline = match baseline_binary {
        Some(binary) => Some(Target::flagpost_at(
            "baseline",
            binary,
            data_dir,
            &dir.join("baseline-db"),
        )?),
        None => None,
    };
    let mut reference = Target::reference()?;
    let sinking = config.with_sink;

    let mut rows = Vec::new();
    for scenario in &config.scenarios {
        let load = client::Load {
            scenario: *scenario,
            bodies: scenario.bodies().into(),
            connections: config.connections,
            warmup: config.warmup,
            measure: config.measure,
            // Events per second become requests per second per connection.
            interval: config.rate.map(|rate| {
                let per_request = scenario.events_per_request().unwrap_or(1) as f64;
                Duration::from_secs_f64(config.connections as f64 * per_request / rate)
            }),
        };
        let measured = runtime.block_on(async {
            let status = client::probe(flagpost.addr, &load).await?;
            if status == hyper::StatusCode::NOT_FOUND {
                return Ok::<_, String>(vec![Row::Skipped(*scenario, status)]);
            }
            if scenario.is_compactor() {
                let report = compactor::measure(flagpost.addr, &load).await?;
                if sinking {
                    sink::settle(flagpost.addr).await;
                }
                return Ok(vec![Row::Compactor(*scenario, report)]);
            }
            // One target at a time, so each has the cores to itself (the other idles).
            // Each flagpost's compactor finishes its backlog before the next target
            // is measured, so it does not take the next one's share of the cores.
            // With the sink, flagpost also waits for it to send what the load left.
            let run_ours = || async {
                let m = load.run(flagpost.addr).await;
                client::settle(flagpost.addr).await;
                if sinking {
                    sink::settle(flagpost.addr).await;
                }
                m
            };
            let run_baseline = || async {
                match &baseline {
                    Some(b) => {
                        let m = load.run(b.addr).await;
                        client::settle(b.addr).await;
                        Some(m)
                    }
                    None => None,
                }
            };
            // Rounds take turns at going first, so the order's advantage cancels out.
            let mut rounds = Vec::new();
            for round in 0..config.rounds {
                let (ours, before) = if config.baseline_first != (round % 2 == 1) {
                    let before = run_baseline().await;
                    (run_ours().await, before)
                } else {
                    let ours = run_ours().await;
                    (ours, run_baseline().await)
                };
                let theirs = load.run(reference.addr).await;
                rounds.push(Row::Measured(*scenario, ours, before, theirs));
            }
            Ok(rounds)
        })?;
        rows.extend(measured);
    }

    report::table(&rows);
    report::memory(&[
        ("flagpost", flagpost.peak_rss()),
        ("baseline", baseline.as_ref().and_then(Target::peak_rss)),
        ("reference", reference.peak_rss()),
    ]);
    flagpost.stop()?;
    if let Some(b) = &mut baseline {
        b.stop()?;
    }
    reference.stop()
}
