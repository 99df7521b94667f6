//! The compactor's pace: while batches arrive as fast as flagpost accepts them, how many
//! events per second the compactor applies and how far behind it falls (its lag); then,
//! with the load stopped, how fast it drains what is left on its own. Read from
//! flagpost's own `/metrics`, sampled a few times a second.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::client::{self, Load, Measurement};

/// How often `/metrics` is read.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// A backlog that takes longer than this to drain is reported as not drained.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

/// One reading of the compactor's counters.
#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    applied: f64,
    lag_seconds: f64,
    depth: f64,
}

pub struct Report {
    /// The ingest side, as for any scenario.
    pub ingest: Measurement,
    /// Events applied per second during the measured window, under load.
    pub applied_under_load: f64,
    /// The largest lag seen during the measured window.
    pub max_lag_seconds: f64,
    /// What was left when the load stopped.
    pub drain: Drain,
}

pub enum Drain {
    /// The compactor had kept up: nothing was waiting.
    Nothing,
    /// Events applied per second until the log was empty, and how long that took.
    Drained { rate: f64, seconds: f64 },
    /// Still not empty after this long.
    NotDrained { seconds: f64 },
}

async fn sample(addr: SocketAddr) -> Result<Sample, String> {
    let text = client::get_text(addr, "/metrics").await?;
    let read = |name: &str| {
        client::metric_in(&text, name).ok_or_else(|| format!("{name} missing from /metrics"))
    };
    Ok(Sample {
        at: Instant::now(),
        applied: read("flagpost_compactor_applied_total")?,
        lag_seconds: read("flagpost_compactor_lag_seconds")?,
        depth: read("flagpost_log_depth")?,
    })
}

pub async fn measure(addr: SocketAddr, load: &Load) -> Result<Report, String> {
    let (ingest, inside) =
        client::run_sampled(load, addr, SAMPLE_EVERY, move || sample(addr), |s| s.at).await?;
    let (applied_under_load, max_lag_seconds) = match (inside.first(), inside.last()) {
        (Some(a), Some(b)) if b.at > a.at => (
            (b.applied - a.applied) / (b.at - a.at).as_secs_f64(),
            inside.iter().map(|s| s.lag_seconds).fold(0.0, f64::max),
        ),
        _ => return Err("too few /metrics samples inside the window".into()),
    };

    let first = sample(addr).await?;
    let mut last = first;
    while last.depth > 0.0 && first.at.elapsed() < DRAIN_LIMIT {
        tokio::time::sleep(SAMPLE_EVERY / 2).await;
        last = sample(addr).await?;
    }
    let seconds = (last.at - first.at).as_secs_f64();
    let drained = last.applied - first.applied;
    let drain = if last.depth > 0.0 {
        Drain::NotDrained { seconds }
    } else if drained > 0.0 && seconds > 0.0 {
        Drain::Drained {
            rate: drained / seconds,
            seconds,
        }
    } else {
        Drain::Nothing
    };
    Ok(Report {
        ingest,
        applied_under_load,
        max_lag_seconds,
        drain,
    })
}
