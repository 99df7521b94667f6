//! A request with two poison events, bisected by the forwarder while the edge is
//! killed with SIGKILL again and again: the first kill lands once one refused event is
//! in the dead-letter file and the other is still being looked for, the next ones at
//! random. Every restart bisects the same request from the start and finds the same
//! events, and the dead-letter file still holds each of them once.

use std::time::Duration;

use serde_json::{json, Value};

use super::{assert_identical_copies, metric, wait_kept};
use crate::edge::fake::Fake;
use crate::util::{wait_for, Server, KEY_ONE};

/// Events in the one request, two of them refused.
const EVENTS: usize = 800;
/// Kills after the first.
const MORE_KILLS: usize = 3;

fn dead_letters(edge: &Server) -> Vec<Value> {
    let file = edge.dir.join("db/upstream/dead-letter.ndjson");
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The fake's refusals so far.
fn refusals(fake: &Fake) -> usize {
    fake.with(|s| s.deliveries.iter().filter(|d| !d.kept).count())
}

#[test]
fn kills_mid_bisect_leave_each_refused_event_once_in_the_dead_letter_file() {
    let fake = Fake::start(None);
    let poison: Vec<String> = (0..2).map(|_| uuid::Uuid::now_v7().to_string()).collect();
    fake.with(|s| {
        s.poison = poison.clone();
        // Slow enough that a bisection takes seconds: the kills land inside one.
        s.slow = Some(Duration::from_millis(100));
    });
    let mut edge = Server::start_with(&["--upstream", &fake.url()]);
    let uuids: Vec<String> = (0..EVENTS)
        .map(|i| match i {
            200 => poison[0].clone(),
            600 => poison[1].clone(),
            _ => uuid::Uuid::now_v7().to_string(),
        })
        .collect();
    let batch: Vec<Value> = uuids
        .iter()
        .enumerate()
        .map(|(i, u)| json!({"event": "mate", "distinct_id": format!("d{}", i % 7), "uuid": u}))
        .collect();
    let r = edge.post(
        "/batch/",
        json!({"api_key": KEY_ONE, "batch": batch}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());

    // One refused event kept, the other not yet found: killed mid-bisect.
    wait_for("the first dead letter", || {
        (dead_letters(&edge).len() == 1).then_some(())
    });
    edge = edge.restart_hard();
    for _ in 0..MORE_KILLS {
        let seen = refusals(&fake);
        wait_for("a refusal after the restart", || {
            (refusals(&fake) > seen).then_some(())
        });
        let pause = (uuid::Uuid::new_v4().as_u128() % 1500) as u64;
        std::thread::sleep(Duration::from_millis(pause));
        edge = edge.restart_hard();
    }

    let mates: Vec<String> = uuids
        .iter()
        .filter(|u| !poison.contains(u))
        .cloned()
        .collect();
    let kept = wait_kept(&fake, &edge, &mates);
    wait_for("the backlog to drain", || {
        (metric(&edge, "flagpost_upstream_forward_backlog_events ") == 0.0).then_some(())
    });
    assert_identical_copies(&kept);
    assert!(poison.iter().all(|p| !kept.contains_key(p)));
    // The first one was refused on its own more than once: found again after a kill.
    let alone = fake.with(|s| {
        s.deliveries
            .iter()
            .filter(|d| !d.kept && d.events.len() == 1 && d.events[0].0 == poison[0])
            .count()
    });
    assert!(alone >= 2, "refused alone {alone} times");
    let letters = dead_letters(&edge);
    let mut kept_once: Vec<&str> = letters
        .iter()
        .map(|l| l["event"]["uuid"].as_str().unwrap())
        .collect();
    kept_once.sort();
    let mut want: Vec<&str> = poison.iter().map(String::as_str).collect();
    want.sort();
    assert_eq!(kept_once, want, "each refused event once");
    assert!(letters
        .iter()
        .all(|l| l["project"] == 1 && l["reason"].as_str().unwrap().contains("400")));
}
