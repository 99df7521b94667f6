//! Capture's backpressure: with the compactor held (the test hook
//! `FLAGPOST_TEST_COMPACTOR_HOLD`), the log grows past `--max-log-mb`; then every
//! capture path answers 503 with `Retry-After`, the log says so once, `/metrics` and
//! the console's health page show it, and once the compactor runs again capture is
//! accepted by itself, with every acknowledged event stored exactly once. The same
//! after a SIGKILL while refusing: the restarted server starts refusing, drains the
//! log and accepts again.

use std::collections::HashMap;
use std::path::Path;

use serde_json::json;

use crate::util::*;

/// The bound under test, in MiB: a few segments of [`SEGMENT_MIB`].
const MAX_LOG_MIB: &str = "3";
const SEGMENT_MIB: &str = "1";
/// Events per batch: a few kilobytes of log each, so the bound is reached in a few
/// hundred requests.
const BATCH: usize = 50;
/// The warning said once when refusing starts, and the line when it ends.
const REFUSING: &str = "refusing new events with 503 until it catches up";
const RESUMED: &str = "accepting events again";

fn start_held(hold: &Path) -> Server {
    std::fs::write(hold, b"").unwrap();
    Server::start_env(
        &["--max-log-mb", MAX_LOG_MIB, "--log-segment-mb", SEGMENT_MIB],
        &[("FLAGPOST_TEST_COMPACTOR_HOLD", hold.as_os_str())],
    )
}

/// One `/batch/` of `BATCH` events with fresh uuids and some padding; the uuids and
/// the answer.
fn post_batch(server: &Server) -> (Vec<String>, Resp) {
    let uuids: Vec<String> = (0..BATCH)
        .map(|_| uuid::Uuid::now_v7().to_string())
        .collect();
    let batch: Vec<_> = uuids
        .iter()
        .map(|u| {
            json!({"event": "$pageview", "distinct_id": u, "uuid": u,
                   "properties": {"$current_url": format!("https://example.com/{}", "x".repeat(200))}})
        })
        .collect();
    let body = json!({"api_key": KEY_ONE, "batch": batch}).to_string();
    let r = server.post("/batch/", gzip(body.as_bytes()));
    (uuids, r)
}

/// Post batches until one is refused; the uuids of every acknowledged one.
fn fill_until_refused(server: &Server) -> Vec<String> {
    let mut acked = Vec::new();
    for _ in 0..10_000 {
        let (uuids, r) = post_batch(server);
        match r.status {
            200 => acked.extend(uuids),
            503 => {
                assert_eq!(r.header("retry-after"), Some("5"), "{}", r.text());
                return acked;
            }
            other => panic!("unexpected {other}: {}", r.text()),
        }
    }
    panic!("never refused; the server's log:\n{}", server.log());
}

/// The server's log once it holds `line`.
fn logged(server: &Server, line: &str) -> String {
    wait_for(line, || {
        let log = server.log();
        log.contains(line).then_some(log)
    })
}

fn metric(server: &Server, name: &str) -> Option<i64> {
    let text = server.get("/metrics").text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Every capture path refuses, each with `Retry-After`.
fn assert_every_path_refuses(server: &Server) {
    let event = json!({"api_key": KEY_ONE, "event": "e", "distinct_id": "d"}).to_string();
    let paths = [
        "/capture/",
        "/e/",
        "/i/v0/e/",
        "/batch/",
        "/track/",
        "/engage/",
        "/i/v0/ai/batch/",
    ];
    for path in paths {
        let r = server.post(path, event.clone());
        assert_eq!(r.status, 503, "{path}: {}", r.text());
        assert_eq!(r.header("retry-after"), Some("5"), "{path}");
    }
    for path in ["/i/v1/analytics/events", "/i/v1/analytics/events/"] {
        let r = server.request(
            Req::post(path, event.clone())
                .header("Authorization", &format!("Bearer {KEY_ONE}"))
                .header("Content-Type", "application/json"),
        );
        assert_eq!(r.status, 503, "{path}: {}", r.text());
        assert!(r.header("retry-after").is_some(), "{path}");
    }
}

/// Each uuid stored exactly once.
fn assert_stored_once(server: &Server, acked: &[String]) {
    let stored = server.settle(1);
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for e in &stored {
        *counts.entry(e["id"].as_str().unwrap()).or_default() += 1;
    }
    for u in acked {
        assert_eq!(counts.get(u.as_str()), Some(&1), "acknowledged {u}");
    }
    assert_eq!(stored.len(), acked.len(), "nothing but the acknowledged");
}

#[test]
fn a_held_compactor_turns_capture_away_until_it_catches_up() {
    let tmp = tempfile::tempdir().unwrap();
    let hold = tmp.path().join("hold");
    let server = start_held(&hold);
    assert_eq!(metric(&server, "flagpost_log_backpressure"), Some(0));
    let mut acked = fill_until_refused(&server);
    assert!(acked.len() >= BATCH, "some batches were accepted first");
    assert_every_path_refuses(&server);
    assert_eq!(metric(&server, "flagpost_log_backpressure"), Some(1));
    let bytes = metric(&server, "flagpost_log_bytes").unwrap();
    assert!(bytes > 3 << 20, "log of {bytes} bytes is over the bound");
    assert_eq!(server.get("/_readiness").status, 503);

    let console = crate::console::sign_in(&server, PERSONAL_ONE);
    let health = server
        .request(Req::get("/console/api/health").header("Cookie", &console.cookie))
        .json();
    assert_eq!(health["log"]["backpressure"], true, "{health}");
    assert_eq!(health["log"]["max_bytes"], 3 << 20, "{health}");
    assert_eq!(health["accepts_writes"], false, "{health}");
    // The server's stderr is copied by a thread of the test's: wait for the line.
    let log = logged(&server, REFUSING);
    assert_eq!(log.matches(REFUSING).count(), 1, "said once: {log}");

    std::fs::remove_file(&hold).unwrap();
    wait_for("capture accepted again", || {
        let (uuids, r) = post_batch(&server);
        match r.status {
            200 => {
                acked.extend(uuids);
                Some(())
            }
            503 => {
                std::thread::sleep(std::time::Duration::from_millis(50));
                None
            }
            other => panic!("unexpected {other}: {}", r.text()),
        }
    });
    assert_eq!(metric(&server, "flagpost_log_backpressure"), Some(0));
    let log = logged(&server, RESUMED);
    assert_eq!(log.matches(REFUSING).count(), 1, "said once");
    assert_eq!(log.matches(RESUMED).count(), 1);
    assert_stored_once(&server, &acked);
}

#[test]
fn a_sigkill_while_refusing_loses_nothing_and_the_restart_drains_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let hold = tmp.path().join("hold");
    let server = start_held(&hold);
    let acked = fill_until_refused(&server);
    // Restarted without the hold: the same flags, no test hook.
    let restarted = server.restart_hard();
    wait_for("the restarted server to accept", || {
        let event = json!({"api_key": KEY_ONE, "event": "probe", "distinct_id": "p"});
        let r = restarted.post("/capture/", event.to_string());
        assert!(r.status == 200 || r.status == 503, "{}", r.text());
        (r.status == 200).then_some(())
    });
    let stored = restarted.settle(1);
    let probes = stored.iter().filter(|e| e["event"] == "probe").count();
    assert_eq!(probes, 1, "only the accepted probe is stored");
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for e in &stored {
        *counts.entry(e["id"].as_str().unwrap()).or_default() += 1;
    }
    for u in &acked {
        assert_eq!(counts.get(u.as_str()), Some(&1), "acknowledged {u}");
    }
    assert_eq!(stored.len(), acked.len() + 1);
}
