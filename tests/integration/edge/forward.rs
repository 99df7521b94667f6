//! The event forwarder end to end: an edge flagpost (`--upstream`) in front of a
//! recording [`Fake`], itself in front of a second flagpost where it matters. Every
//! accepted event reaches upstream, once in a clean run and byte-identical in every
//! resend, through outages, SIGKILLs, throttling, poison events, refused keys and old
//! events.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::{json, Value};

mod bisect;
mod clients;
mod ip;
mod sink;

use super::fake::{Act, Fake};
use crate::util::{wait_for, Server, KEY_ONE, KEY_TWO};

/// How long a whole delivery may take in these tests (debug builds, shared cores).
const LONG: Duration = Duration::from_secs(300);

/// Capture `n` events for `key`, in batches, each with its own uuid; returns the uuids.
fn capture(edge: &Server, key: &str, n: usize, tag: &str) -> Vec<String> {
    let mut all = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let uuids: Vec<String> = chunk
            .iter()
            .map(|_| uuid::Uuid::now_v7().to_string())
            .collect();
        let batch: Vec<Value> = uuids
            .iter()
            .zip(chunk)
            .map(|(u, i)| {
                json!({"event": tag, "distinct_id": format!("user-{}", i % 97), "uuid": u,
                       "properties": {"i": i, "$set": {"plan": "pro"}}})
            })
            .collect();
        let r = edge.post(
            "/batch/",
            json!({"api_key": key, "batch": batch}).to_string(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        all.extend(uuids);
    }
    all
}

/// Wait until the fake kept every one of `uuids`.
fn wait_kept(fake: &Fake, edge: &Server, uuids: &[String]) -> HashMap<String, Vec<String>> {
    let deadline = std::time::Instant::now() + LONG;
    loop {
        let kept = fake.kept();
        let missing = uuids.iter().filter(|u| !kept.contains_key(*u)).count();
        if missing == 0 {
            return kept;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{missing} of {} events never reached upstream; the edge's log ends:\n{}",
            uuids.len(),
            tail(&edge.log())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// A metric's value from `/metrics`, 0 when absent.
fn metric(server: &Server, line_start: &str) -> f64 {
    server
        .get("/metrics")
        .text()
        .lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Every resent copy of an event is the same text.
fn assert_identical_copies(kept: &HashMap<String, Vec<String>>) -> usize {
    let mut resent = 0;
    for (uuid, copies) in kept {
        assert!(
            copies.iter().all(|c| c == &copies[0]),
            "copies of {uuid} differ: {copies:?}"
        );
        resent += copies.len() - 1;
    }
    resent
}

#[test]
fn every_event_reaches_upstream_once_as_the_edge_stored_it() {
    const N: usize = 100_000;
    let upstream = Server::start();
    let fake = Fake::start(Some(upstream.addr));
    let edge = Server::start_with(&["--upstream", &fake.url()]);
    let started = std::time::Instant::now();
    let sent = capture(&edge, KEY_ONE, N, "bulk");
    let captured = started.elapsed();
    let kept = wait_kept(&fake, &edge, &sent);
    eprintln!(
        "{N} events: captured in {captured:?}, all upstream after {:?}",
        started.elapsed()
    );
    assert_eq!(kept.len(), N, "nothing but what was captured");
    for (uuid, copies) in &kept {
        assert_eq!(
            copies.len(),
            1,
            "{uuid} delivered {} times in a clean run",
            copies.len()
        );
    }
    // What went is what the edge stored: uuid, timestamp, event, distinct id, properties.
    // Forwarded means stored, so one read sees them all.
    let stored = edge.stored_events(1);
    assert_eq!(stored.len(), N);
    for s in &stored {
        let id = s["id"].as_str().unwrap();
        let went: Value = serde_json::from_str(&kept[id][0]).unwrap();
        for (a, b) in [
            ("uuid", "id"),
            ("event", "event"),
            ("distinct_id", "distinct_id"),
            ("timestamp", "timestamp"),
            ("properties", "properties"),
        ] {
            assert_eq!(went[a], s[b], "{a} of {id}");
        }
    }
    // The upstream flagpost took each batch (the fake checks its 200) and stores each
    // event once.
    wait_for("upstream's log to be compacted", || {
        (metric(&upstream, "flagpost_log_depth ") == 0.0).then_some(())
    });
    let there = upstream.stored_events(1);
    let ids: HashSet<&str> = there.iter().map(|e| e["id"].as_str().unwrap()).collect();
    let missing = sent
        .iter()
        .filter(|u| !ids.contains(u.as_str()))
        .take(3)
        .collect::<Vec<_>>();
    assert_eq!(
        (there.len(), ids.len()),
        (N, N),
        "missing upstream, e.g. {missing:?}"
    );
    assert!(fake.with(|s| s
        .deliveries
        .iter()
        .all(|d| d.api_key == KEY_ONE && !d.historical)));
    wait_for("the backlog to read 0", || {
        (metric(&edge, "flagpost_upstream_forward_backlog_events ") == 0.0).then_some(())
    });
    assert!(
        metric(
            &edge,
            "flagpost_upstream_requests_total{endpoint=\"batch\",status=\"200\"}"
        ) >= (N / 1000) as f64
    );
}

#[test]
fn an_outage_and_kills_mid_forward_lose_nothing_and_resend_identical_bytes() {
    let fake = Fake::start(None);
    fake.with(|s| s.down = true);
    let mut edge = Server::start_with(&["--upstream", &fake.url()]);
    let mut sent = capture(&edge, KEY_ONE, 3000, "during-outage");
    sent.extend(capture(&edge, KEY_TWO, 500, "during-outage"));
    // The edge keeps serving and says what it owes.
    wait_for("a backlog", || {
        (metric(&edge, "flagpost_upstream_forward_backlog_events ") >= 3500.0).then_some(())
    });
    assert_eq!(edge.get("/_readiness").status, 200);
    assert!(metric(&edge, "flagpost_upstream_forward_lag_seconds ") >= 0.0);
    // Upstream back, slow, and the edge killed at random points while it sends.
    fake.with(|s| {
        s.down = false;
        s.slow = Some(Duration::from_millis(30));
        s.script.push_back(Act::CommitThenReset);
        s.script.push_back(Act::Status(503, None));
        s.script.push_back(Act::Status(429, Some(1)));
    });
    for round in 0..4 {
        let pause = 200 + (uuid::Uuid::new_v4().as_u128() % 1200) as u64;
        std::thread::sleep(Duration::from_millis(pause));
        edge = edge.restart_hard();
        sent.extend(capture(&edge, KEY_ONE, 300, &format!("round-{round}")));
    }
    wait_kept(&fake, &edge, &sent);
    // Every event has a copy upstream once the reset batch was kept, but the edge owes
    // that batch until its resend is answered: only a drained backlog says it was sent.
    wait_for("the backlog to drain", || {
        (metric(&edge, "flagpost_upstream_forward_backlog_events ") == 0.0).then_some(())
    });
    let kept = fake.kept();
    let resent = assert_identical_copies(&kept);
    assert!(resent >= 1, "the batch kept before the reset came again");
    assert_eq!(kept.len(), sent.len());
    let statuses = edge.get("/metrics").text();
    assert!(statuses.contains("endpoint=\"batch\""), "{statuses}");
}

#[test]
fn a_poison_event_is_dead_lettered_and_its_batch_mates_arrive() {
    let fake = Fake::start(None);
    let poison = uuid::Uuid::now_v7().to_string();
    fake.with(|s| {
        s.poison = vec![poison.clone()];
        // Too large past 64 events: requests are split down to that.
        s.max_events = Some(64);
    });
    let edge = Server::start_with(&["--upstream", &fake.url()]);
    let mut sent = capture(&edge, KEY_ONE, 150, "mates");
    let body = json!({"api_key": KEY_ONE, "event": "poison", "distinct_id": "p", "uuid": poison});
    assert_eq!(edge.post("/capture/", body.to_string()).status, 200);
    sent.extend(capture(&edge, KEY_ONE, 150, "mates"));
    let kept = wait_kept(&fake, &edge, &sent);
    assert!(!kept.contains_key(&poison));
    let file = edge.dir.join("db/upstream/dead-letter.ndjson");
    let text = wait_for("the dead letter", || std::fs::read_to_string(&file).ok());
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert_eq!(lines[0]["event"]["uuid"], poison.as_str());
    assert_eq!(lines[0]["event"]["event"], "poison");
    assert_eq!(lines[0]["project"], 1);
    assert!(
        lines[0]["reason"].as_str().unwrap().contains("400"),
        "{text}"
    );
    assert!(lines[0]["at"].is_string());
    assert_eq!(metric(&edge, "flagpost_upstream_dead_letters_total "), 1.0);
    assert!(fake.with(|s| s
        .deliveries
        .iter()
        .filter(|d| d.kept)
        .all(|d| d.events.len() <= 64)));
}

#[test]
fn old_events_travel_apart_as_historical_migration() {
    let fake = Fake::start(None);
    let edge = Server::start_with(&["--upstream", &fake.url()]);
    let old =
        flagpost::support::clock::format_ms(flagpost::support::clock::now_ms() - 3 * 86_400_000);
    let (old_id, new_id) = (
        uuid::Uuid::now_v7().to_string(),
        uuid::Uuid::now_v7().to_string(),
    );
    let batch = json!({"api_key": KEY_ONE, "batch": [
        {"event": "then", "distinct_id": "d", "uuid": old_id, "timestamp": old},
        {"event": "now", "distinct_id": "d", "uuid": new_id},
    ]});
    assert_eq!(edge.post("/batch/", batch.to_string()).status, 200);
    wait_kept(&fake, &edge, &[old_id.clone(), new_id.clone()]);
    let deliveries = fake.with(|s| s.deliveries.clone());
    let with = |id: &str| {
        deliveries
            .iter()
            .find(|d| d.events.iter().any(|(u, _)| u == id))
            .unwrap()
            .clone()
    };
    assert!(with(&old_id).historical);
    assert!(!with(&new_id).historical);
    assert_eq!(
        with(&old_id).events.len(),
        1,
        "old events go in requests of their own"
    );
}

#[test]
fn a_refused_key_pauses_its_project_until_it_is_fixed() {
    let fake = Fake::start(None);
    fake.with(|s| s.keys = Some(vec![KEY_TWO.to_string(), "phc_fixed".to_string()]));
    let edge = Server::start_with(&["--upstream", &fake.url()]);
    let one = capture(&edge, KEY_ONE, 20, "refused");
    let two = capture(&edge, KEY_TWO, 20, "fine");
    // The other project goes on while this one waits.
    wait_kept(&fake, &edge, &two);
    wait_for("a 401", || {
        (metric(
            &edge,
            "flagpost_upstream_requests_total{endpoint=\"batch\",status=\"401\"}",
        ) >= 1.0)
            .then_some(())
    });
    wait_for("the log to say so", || {
        edge.log()
            .contains("upstream refuses this project's events")
            .then_some(())
    });
    assert!(fake.kept().keys().all(|u| !one.contains(u)));
    assert_eq!(edge.get("/_readiness").status, 200);
    // The key fixed in projects.json: the kept events go at once.
    let projects = edge.data().join("projects.json");
    let text = std::fs::read_to_string(&projects)
        .unwrap()
        .replace(KEY_ONE, "phc_fixed");
    crate::util::write_atomically(&projects, text);
    let kept = wait_kept(&fake, &edge, &one);
    assert_eq!(kept.len(), 40);
    wait_for("the log to say it resumed", || {
        edge.log()
            .contains("takes this project's events again")
            .then_some(())
    });
}
