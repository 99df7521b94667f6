//! The `forward` scenario's figures, printed with what issue 40 asks of each: every
//! phase that finished, and for one that did not, why.

use std::time::Duration;

use crate::forward::{Outage, Report};
use crate::forward_cpu::summary;
use crate::forward_drain::Drain;

/// Seconds, never zero, to divide by.
fn secs(d: Duration) -> f64 {
    d.as_secs_f64().max(f64::MIN_POSITIVE)
}

/// The figures, with what the issue asks of each.
pub fn report(r: &Report) {
    println!();
    println!(
        "forward: an edge flagpost in front of an upstream flagpost on loopback (load average {} before, {} after)",
        r.load_average.0, r.load_average.1
    );
    for (build, upstream, d) in &r.drains {
        println!("drain, {build} as the edge, into {}:", upstream.label());
        match d {
            Ok(d) => drain(d),
            Err(e) => println!("not measured: {e}"),
        }
    }
    rounds(r);
    match &r.outage {
        Ok(o) => outage(o),
        Err(e) => println!("outage: not measured: {e}"),
    }
}

fn drain(d: &Drain) {
    println!(
        "backlog of {:.0} events captured and counted in {:.1} s ({:.0} events/s)",
        d.events,
        d.built.as_secs_f64(),
        d.events / secs(d.built)
    );
    println!(
        "drained in {:.1} s from upstream's start ({:.0} events/s), {:.1} s from the first delivery ({:.0} events/s; target 100000)",
        d.from_start.as_secs_f64(),
        d.events / secs(d.from_start),
        d.from_first.as_secs_f64(),
        d.events / secs(d.from_first),
    );
    println!("CPU meanwhile, the edge: {}", summary(&d.cpu[0]));
    if !d.cpu[1].is_empty() {
        println!("            the upstream: {}", summary(&d.cpu[1]));
    }
}

fn rounds(r: &Report) {
    println!(
        "{:<8} {:>12} {:>9} {:>12} {:>9} {:>7} {:>7}",
        "round", "off req/s", "off p99", "on req/s", "on p99", "on/off", "errors"
    );
    let mut logs = Vec::new();
    for (i, (off, on)) in r.wrk.iter().enumerate() {
        let (off, on) = (&off.run, &on.run);
        let ratio = on.rate / off.rate.max(f64::MIN_POSITIVE);
        logs.push(ratio.ln());
        println!(
            "{:<8} {:>12.0} {:>9.2} {:>12.0} {:>9.2} {:>7.3} {:>7}",
            i + 1,
            off.rate,
            off.p99_ms,
            on.rate,
            on.p99_ms,
            ratio,
            off.errors + on.errors
        );
    }
    for (i, (off, on)) in r.wrk.iter().enumerate() {
        println!(
            "round {} CPU, edge mode off: during wrk {}",
            i + 1,
            summary(&off.during)
        );
        println!("    then until settled {}", summary(&off.after));
        println!(
            "round {} CPU, forwarding on: during wrk {}",
            i + 1,
            summary(&on.during)
        );
        println!("    then until drained {}", summary(&on.after));
    }
    if let Some(e) = &r.wrk_failed {
        println!("wrk rounds stopped after {}: {e}", r.wrk.len());
    }
    if !logs.is_empty() {
        let mean = (logs.iter().sum::<f64>() / logs.len() as f64).exp();
        let mut sorted = logs.iter().map(|l| l.exp()).collect::<Vec<_>>();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        println!(
            "capture with forwarding on / edge mode off: {mean:.3} over {} round(s), median {median:.3} (target at least 0.90)",
            logs.len()
        );
        println!(
            "forwarded meanwhile to the counting sink: {} requests, {:.1} MB gzip'd",
            r.forwarded.0,
            r.forwarded.1 as f64 / 1e6
        );
    }
}

fn outage(o: &Outage) {
    let length = secs(o.length);
    println!(
        "outage of {length:.0} s at {:.0} events/s offered: {:.0} events/s accepted, {} requests refused; a backlog of {:.0} events",
        o.offered, o.accepted, o.refused, o.backlog
    );
    match &o.drain {
        Ok((from_start, from_first)) => println!(
            "drained, capture going on ({:.0} events/s accepted meanwhile), in {:.1} s from upstream's return: {:.1}x faster than it built (target 5x); {:.1} s from the first delivery ({:.1}x)",
            o.accepted_draining,
            from_start.as_secs_f64(),
            length / secs(*from_start),
            from_first.as_secs_f64(),
            length / secs(*from_first),
        ),
        Err(e) => println!(
            "not drained ({:.0} events/s accepted meanwhile): {e}",
            o.accepted_draining
        ),
    }
}
