//! What the harness prints: the conditions of the run (so a number is never read
//! without them), the side-by-side table, and both servers' peak memory.

use hyper::StatusCode;

use crate::client::Measurement;
use crate::payloads::Scenario;
use crate::Config;

/// One scenario's result.
pub enum Row {
    /// flagpost, the baseline build if any, then the reference.
    Measured(Scenario, Measurement, Option<Measurement>, Measurement),
    /// flagpost does not serve the scenario yet; it answered the probe with this.
    Skipped(Scenario, StatusCode),
    /// The compactor's pace, flagpost alone.
    Compactor(Scenario, crate::compactor::Report),
}

pub fn preamble(config: &Config) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut scenarios: String = config
        .scenarios
        .iter()
        .map(|s| format!(" --scenario {}", s.name()))
        .collect();
    if config.sink.is_some() {
        scenarios += &format!(" --scenario {}", crate::sink::NAME);
    }
    if config.wrk.is_some() {
        scenarios += &format!(" --scenario {}", crate::wrk::NAME);
    }
    if config.with_sink {
        scenarios += " --with-sink";
    }
    if config.baseline_first {
        scenarios += " --baseline-first";
    }
    if config.rounds > 1 {
        scenarios += &format!(" --rounds {}", config.rounds);
    }
    if config.clickhouse_nice != 0 {
        scenarios += &format!(" --clickhouse-nice {}", config.clickhouse_nice);
    }
    if let Some(d) = &config.disk {
        scenarios += &format!(
            " --scenario {} --disk-events {} --disk-persons {}",
            crate::disk::NAME,
            d.events,
            d.persons
        );
    }
    if let Some(m) = &config.memory {
        scenarios += &format!(
            " --scenario {} --memory-events {} --soak-seconds {}",
            crate::memory::NAME,
            m.events,
            m.soak.as_secs()
        );
    }
    println!("flagpost load harness");
    println!(
        "machine: {cores} cores, shared by the load client and the server under test \
         (the same for both targets)"
    );
    println!(
        "load: {} keep-alive connections{}, {} ms warm-up, {} s measured per scenario and target",
        config.connections,
        config.rate.map_or_else(
            || " sending back to back".into(),
            |r| format!(" offering {r:.0} events/s")
        ),
        config.warmup.as_millis(),
        config.measure.as_secs()
    );
    println!(
        "reproduce: cargo bench --bench load -- --seconds {} --connections {} --warmup-ms {}{}{scenarios}",
        config.measure.as_secs(),
        config.connections,
        config.warmup.as_millis(),
        config.rate.map_or_else(String::new, |r| format!(" --rate {r:.0}"))
    );
    if config.with_sink {
        println!(
            "sink: flagpost sends to ClickHouse; baseline is {} without the sink, measured {}",
            if config.baseline.is_some() {
                "--baseline"
            } else {
                "this build"
            },
            match (config.rounds > 1, config.baseline_first) {
                (true, _) => "before and after it by turns",
                (false, true) => "before it",
                (false, false) => "after it",
            }
        );
    }
    println!(
        "note: flagpost fsyncs before every 2xx (group commit); the reference stores nothing, \
         so ingest ratios include the disk's flush latency"
    );
}

pub fn table(rows: &[Row]) {
    println!();
    println!(
        "{:<10} {:<10} {:>10} {:>10} {:>8} {:>8} {:>7}",
        "scenario", "target", "req/s", "events/s", "p50 ms", "p99 ms", "errors"
    );
    for row in rows {
        match row {
            Row::Measured(scenario, ours, before, theirs) => {
                measured(*scenario, "flagpost", ours);
                if let Some(before) = before {
                    measured(*scenario, "baseline", before);
                }
                measured(*scenario, "reference", theirs);
                ratio(*scenario, "ratio", ours, theirs);
                if let Some(before) = before {
                    ratio(*scenario, "base ratio", before, theirs);
                    ratio(*scenario, "vs base", ours, before);
                }
            }
            Row::Compactor(scenario, report) => {
                measured(*scenario, "ingest", &report.ingest);
                let drain = match report.drain {
                    crate::compactor::Drain::Nothing => "no backlog left".to_string(),
                    crate::compactor::Drain::Drained { rate, seconds } => {
                        format!("backlog drained at {rate:.0} events/s alone ({seconds:.1} s)")
                    }
                    crate::compactor::Drain::NotDrained { seconds } => {
                        format!("backlog not drained within {seconds:.0} s")
                    }
                };
                println!(
                    "{:<10} {:<10} applied {:.0} events/s under load, max lag {:.2} s; {drain}",
                    scenario.name(),
                    "compactor",
                    report.applied_under_load,
                    report.max_lag_seconds,
                );
            }
            Row::Skipped(scenario, status) => println!(
                "{:<10} skipped: server answers {}",
                scenario.name(),
                status.as_u16()
            ),
        }
    }
    println!("ratio = flagpost / reference: below 1 is slower for req/s, above 1 for latency");
    if rows
        .iter()
        .any(|r| matches!(r, Row::Measured(_, _, Some(_), _)))
    {
        println!("vs base = flagpost / baseline, read the same way");
        rounds(rows);
    }
}

/// Where a scenario was measured more than once: the geometric mean of flagpost /
/// baseline in req/s over its rounds, and each round's figure.
fn rounds(rows: &[Row]) {
    let mut seen: Vec<Scenario> = Vec::new();
    for row in rows {
        let Row::Measured(scenario, ..) = row else {
            continue;
        };
        if seen.contains(scenario) {
            continue;
        }
        seen.push(*scenario);
        let ratios: Vec<f64> = rows
            .iter()
            .filter_map(|r| match r {
                Row::Measured(s, ours, Some(before), _) if s == scenario && before.rate() > 0.0 => {
                    Some(ours.rate() / before.rate())
                }
                _ => None,
            })
            .collect();
        if ratios.len() < 2 {
            continue;
        }
        let mean = (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp();
        let each: Vec<String> = ratios.iter().map(|r| format!("{r:.3}")).collect();
        println!(
            "{:<10} vs base over {} rounds (taking turns at going first): {mean:.3} ({})",
            scenario.name(),
            ratios.len(),
            each.join(", ")
        );
    }
}

fn measured(scenario: Scenario, target: &str, m: &Measurement) {
    let events = scenario.events_per_request().map(|n| m.rate() * n as f64);
    println!(
        "{:<10} {:<10} {:>10.1} {:>10} {:>8} {:>8} {:>7}",
        scenario.name(),
        target,
        m.rate(),
        number(events, 1),
        number(m.percentile_ms(0.50), 2),
        number(m.percentile_ms(0.99), 2),
        m.errors
    );
}

fn ratio(scenario: Scenario, label: &str, ours: &Measurement, theirs: &Measurement) {
    let divide = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let rate = divide(Some(ours.rate()), Some(theirs.rate()));
    let events = scenario.events_per_request().and(rate);
    let p50 = divide(ours.percentile_ms(0.50), theirs.percentile_ms(0.50));
    let p99 = divide(ours.percentile_ms(0.99), theirs.percentile_ms(0.99));
    println!(
        "{:<10} {:<10} {:>10} {:>10} {:>8} {:>8}",
        scenario.name(),
        label,
        number(rate, 3),
        number(events, 3),
        number(p50, 2),
        number(p99, 2)
    );
}

/// A value with `decimals`, or `-` where there is none.
fn number(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".into(), |v| format!("{v:.decimals$}"))
}

/// Peak resident memory of each target that ran, in KiB.
pub fn memory(peaks: &[(&str, Option<u64>)]) {
    let shown: Vec<String> = peaks
        .iter()
        .filter_map(|(name, kib)| kib.map(|k| format!("{name} {:.1} MiB", k as f64 / 1024.0)))
        .collect();
    println!();
    println!("peak RSS (VmHWM): {}", shown.join(", "));
}

/// The memory scenario: the resident set at rest after the ingest, then over the soak.
pub fn memory_scenario(report: &crate::memory::Report) {
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!();
    println!(
        "memory: {} events from {} persons ingested in {:.1} s, compacted {:.1} s later",
        report.events,
        report.events.min(crate::memory::PERSONS),
        report.ingest_seconds,
        report.drain_seconds
    );
    println!(
        "memory: resident at rest {:.1} MiB",
        mib(report.at_rest_kib)
    );
    if let (Some(first), Some(last)) = (report.soak.first(), report.soak.last()) {
        let low = report.soak.iter().map(|s| s.1).min().unwrap_or(first.1);
        let high = report.soak.iter().map(|s| s.1).max().unwrap_or(first.1);
        println!(
            "memory: soak {:.0} s, {} samples: first {:.1} MiB, last {:.1} MiB, \
             range {:.1}-{:.1} MiB, {} failed requests",
            last.0,
            report.soak.len(),
            mib(first.1),
            mib(last.1),
            mib(low),
            mib(high),
            report.soak_errors
        );
    }
}

/// The sink scenario: flagpost without and with the sink at the same offered rate.
pub fn sink_scenario(report: &crate::sink::Report) {
    let machine = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let share = |cores: f64| {
        format!(
            "{cores:.2} cores ({:.0}% of the machine)",
            100.0 * cores / machine
        )
    };
    println!();
    println!(
        "sink: {:.0} events/s offered in batches of 100 with persons, ClickHouse {} on the same machine",
        report.rate, report.clickhouse_version
    );
    for (label, run) in [("sink off", &report.without), ("sink on", &report.with)] {
        println!(
            "sink: {label:<8} accepted {:.0} events/s ({} failed requests), applied {:.0} events/s, \
             flagpost {}, load client {:.2} cores, machine busy {}",
            run.ingest.rate() * crate::payloads::BATCH_EVENTS as f64,
            run.ingest.errors,
            run.applied,
            share(run.flagpost_cores),
            run.client_cores,
            share(run.machine_cores)
        );
    }
    for (label, run) in [("sink off", &report.without), ("sink on", &report.with)] {
        let busiest: Vec<String> = run
            .threads
            .iter()
            .filter(|(_, cores)| *cores >= 0.01)
            .map(|(name, cores)| format!("{name} {cores:.2}"))
            .collect();
        println!(
            "sink: {label:<8} flagpost's threads, cores: {}",
            busiest.join(", ")
        );
    }
    let with = &report.with;
    println!(
        "sink: into ClickHouse {} events/s under load, largest lag {} s, clickhouse-server {}",
        number(with.sent, 0),
        number(with.max_lag_seconds, 2),
        with.clickhouse_cores.map_or_else(|| "-".into(), share)
    );
    println!(
        "sink: flagpost's CPU with the sink / without: {:.2}",
        with.flagpost_cores / report.without.flagpost_cores
    );
    match &report.drained {
        Ok(d) => println!(
            "sink: {:.0} events still to send when the load stopped, all sent {:.1} s later \
             ({:.0} events/s, the compactor finishing its own backlog meanwhile)",
            d.backlog,
            d.seconds,
            d.backlog / d.seconds.max(0.001)
        ),
        Err(e) => println!("sink: NOT caught up: {e}"),
    }
    let verdict =
        if report.in_clickhouse == report.accepted && report.distinct_uuids == report.accepted {
            "exactly once"
        } else {
            "MISMATCH"
        };
    println!(
        "sink: flagpost acknowledged {} events; ClickHouse holds {} (FINAL), {} distinct uuids: {verdict}",
        report.accepted, report.in_clickhouse, report.distinct_uuids
    );
    if let Some(kib) = report.clickhouse_peak_kib {
        println!(
            "sink: clickhouse-server peak RSS {:.1} MiB",
            kib as f64 / 1024.0
        );
    }
}
