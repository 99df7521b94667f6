//! ClickHouse stopped while flagpost keeps capturing (issue 19): changes wait in the
//! outbox, `flagpost_sink_lag_seconds` grows while it is down, and once it is back
//! every acknowledged event is there exactly once and the lag falls back to 0.

use serde_json::{json, Value};

use super::end_to_end::{capture, start, wait_for_events};
use super::*;
use crate::util::*;

/// Events captured per request.
const REQUEST_EVENTS: usize = 200;
/// Captured before ClickHouse is stopped.
const BEFORE: usize = 1_000;
/// The lag the test waits to see while ClickHouse is down: more than the outbox's
/// linger (1 s), so it can only come from the outage.
const DOWN_LAG_SECONDS: f64 = 2.0;

/// A value of `/metrics`, by the name of its line.
pub(super) fn metric(server: &Server, name: &str) -> f64 {
    let text = server.get("/metrics").text();
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Capture `REQUEST_EVENTS` pageviews numbered from `first`; their uuids.
fn pageviews(server: &Server, first: usize) -> Vec<uuid::Uuid> {
    let uuids: Vec<uuid::Uuid> = (first..first + REQUEST_EVENTS)
        .map(|n| uuid::Uuid::from_u128(0x7a6e_0000 + n as u128))
        .collect();
    let batch: Vec<Value> = uuids
        .iter()
        .enumerate()
        .map(|(i, u)| {
            json!({"event": "$pageview", "uuid": u,
                   "properties": {"distinct_id": format!("user-{}", (first + i) % 50)}})
        })
        .collect();
    capture(server, Value::Array(batch));
    uuids
}

#[test]
#[ignore = "needs clickhouse-server: run by .ci/run, cargo test -- --include-ignored"]
fn clickhouse_stopped_mid_run_gets_everything_once() {
    let mut ch = ClickHouse::start("sink_outage");
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), server::PASSWORD).unwrap();
    let server = start(&ch, secret.path());
    let mut acknowledged = Vec::new();
    while acknowledged.len() < BEFORE {
        acknowledged.extend(pageviews(&server, acknowledged.len()));
    }
    wait_for_events(&ch, BEFORE);
    wait_for("no lag", || {
        (metric(&server, "flagpost_sink_lag_seconds") == 0.0).then_some(())
    });

    ch.stop();
    let errors_before = metric(&server, "flagpost_sink_errors_total");
    // Keep capturing while it is down, until the sink reports falling behind.
    let down_lag = wait_for("the lag to grow while ClickHouse is down", || {
        acknowledged.extend(pageviews(&server, acknowledged.len()));
        std::thread::sleep(std::time::Duration::from_millis(100));
        let lag = metric(&server, "flagpost_sink_lag_seconds");
        (lag >= DOWN_LAG_SECONDS).then_some(lag)
    });
    assert!(metric(&server, "flagpost_sink_errors_total") > errors_before);
    let captured_while_down = acknowledged.len() - BEFORE;
    eprintln!("lag {down_lag} s with {captured_while_down} events captured while down");

    ch.resume();
    wait_for_events(&ch, acknowledged.len());
    wait_for("the lag to fall back", || {
        (metric(&server, "flagpost_sink_lag_seconds") == 0.0).then_some(())
    });
    let mut want: Vec<String> = acknowledged.iter().map(|u| format!("{u}\n")).collect();
    want.sort();
    assert_eq!(
        ch.query("SELECT toString(uuid) AS u FROM events FINAL ORDER BY u"),
        want.concat()
    );
    ch.merge("events");
    assert_eq!(
        ch.query("SELECT count(), uniqExact(uuid) FROM events"),
        format!("{0}\t{0}\n", acknowledged.len())
    );
}
