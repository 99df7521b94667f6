//! The ClickHouse sink and the forwarder on together, the outbox's two readers, against
//! a real `clickhouse-server` and a flagpost upstream behind the recording fake: every
//! event reaches ClickHouse once (after its collapse) and upstream once, while either
//! side is down and the other goes on, so an entry must stay until both passed it; and
//! a sink switched off for a while (a restart without it) and on again gets what was
//! captured and forwarded meanwhile, persons included; the forwarder switched off and
//! on again starts over from its checkpoint.

use std::path::Path;
use std::time::Instant;

use serde_json::{json, Value};

use super::{metric, tail, wait_kept, LONG};
use crate::edge::fake::Fake;
use crate::sink::{settings, ClickHouse};
use crate::util::*;

/// Capture `n` events for `key`, their distinct ids `<tag>-<i % 50>` with a person
/// property set; returns the uuids.
fn capture(edge: &Server, key: &str, n: usize, tag: &str) -> Vec<String> {
    let mut all = Vec::with_capacity(n);
    for start in (0..n).step_by(500) {
        let uuids: Vec<String> = (start..n.min(start + 500))
            .map(|_| uuid::Uuid::now_v7().to_string())
            .collect();
        let batch: Vec<Value> = uuids
            .iter()
            .enumerate()
            .map(|(j, u)| {
                let i = start + j;
                json!({"event": tag, "distinct_id": format!("{tag}-{}", i % 50), "uuid": u,
                       "properties": {"i": i, "$set": {"tag": tag}}})
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

/// The edge's options: the sink to `ch` and the upstream at `url` (either omitted).
fn args(ch: Option<&ClickHouse>, password: &Path, url: Option<&str>) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(ch) = ch {
        let s = settings(ch);
        args.extend([
            "--clickhouse-url".to_string(),
            s.url,
            "--clickhouse-database".to_string(),
            s.database,
            "--clickhouse-user".to_string(),
            s.user,
            "--clickhouse-password-file".to_string(),
            password.display().to_string(),
        ]);
    }
    if let Some(url) = url {
        args.extend(["--upstream".to_string(), url.to_string()]);
    }
    args
}

fn start(dir: &Path, args: &[String]) -> Server {
    Server::spawn(dir, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn password_file(ch: &ClickHouse) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), settings(ch).password).unwrap();
    file
}

/// Wait until ClickHouse's events, collapsed, are `n`.
fn wait_rows(ch: &ClickHouse, edge: &Server, n: usize) {
    let deadline = Instant::now() + LONG;
    let want = format!("{n}\n");
    loop {
        let r = ch.try_query("SELECT count() FROM events FINAL");
        if r.status == 200 && r.text() == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "ClickHouse has {} of {n} events; the edge's log ends:\n{}",
            r.text().trim(),
            tail(&edge.log())
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Every uuid in ClickHouse once after a merge, and exactly those.
fn assert_once_in_clickhouse(ch: &ClickHouse, sent: &[String]) {
    ch.merge("events");
    let n = sent.len();
    assert_eq!(
        ch.query("SELECT count(), uniqExact(uuid) FROM events"),
        format!("{n}\t{n}\n")
    );
    let there: std::collections::HashSet<String> = ch
        .query("SELECT toString(uuid) FROM events")
        .lines()
        .map(String::from)
        .collect();
    assert!(sent.iter().all(|u| there.contains(u)));
}

/// Upstream stores each of `sent` once, and every copy the fake saw is the same text.
fn assert_once_upstream(fake: &Fake, upstream: &Server, sent: &[String]) {
    for (uuid, copies) in fake.kept() {
        assert!(
            copies.iter().all(|c| c == &copies[0]),
            "copies of {uuid} differ"
        );
    }
    wait_for("upstream's log to be compacted", || {
        (metric(upstream, "flagpost_log_depth ") == 0.0).then_some(())
    });
    let mut ids: Vec<String> = [1, 2]
        .iter()
        .flat_map(|p| upstream.stored_events(*p))
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    let mut want = sent.to_vec();
    want.sort();
    assert_eq!(ids, want, "upstream stores each event once");
}

#[test]
#[ignore = "needs clickhouse-server: run by .ci/run, cargo test -- --include-ignored"]
fn each_reader_gets_every_event_once_while_the_other_is_down() {
    let mut ch = ClickHouse::start("edge_sink_and_forward");
    let password = password_file(&ch);
    let upstream = Server::start();
    let fake = Fake::start(Some(upstream.addr));
    let tmp = data_dir();
    let both = args(Some(&ch), password.path(), Some(&fake.url()));
    let mut edge = start(tmp.path(), &both);

    let mut sent = capture(&edge, KEY_ONE, 2000, "both-up");
    sent.extend(capture(&edge, KEY_TWO, 500, "both-up"));
    wait_rows(&ch, &edge, sent.len());
    wait_kept(&fake, &edge, &sent);

    // Upstream down: ClickHouse takes everything, the entries wait for the forwarder.
    fake.with(|s| s.down = true);
    sent.extend(capture(&edge, KEY_ONE, 1500, "upstream-down"));
    wait_rows(&ch, &edge, sent.len());
    wait_for("the forwarder's backlog", || {
        (metric(&edge, "flagpost_upstream_forward_backlog_events ") >= 1500.0).then_some(())
    });
    // And ClickHouse down too, the edge killed, upstream back: the forwarder sends all,
    // the entries wait for the sink.
    ch.stop();
    edge = edge.restart_hard();
    fake.with(|s| s.down = false);
    sent.extend(capture(&edge, KEY_TWO, 1000, "clickhouse-down"));
    wait_kept(&fake, &edge, &sent);
    wait_for("the forwarder's backlog to drain", || {
        (metric(&edge, "flagpost_upstream_forward_backlog_events ") == 0.0).then_some(())
    });
    ch.resume();
    wait_rows(&ch, &edge, sent.len());

    assert_once_in_clickhouse(&ch, &sent);
    assert_once_upstream(&fake, &upstream, &sent);
    // Nothing refused, nothing missing on either side.
    let metrics = edge.get("/metrics").text();
    assert!(
        !metrics.contains("flagpost_sink_missing_blocks_total 1"),
        "{metrics}"
    );
    assert_eq!(metric(&edge, "flagpost_upstream_dead_letters_total "), 0.0);
}

#[test]
#[ignore = "needs clickhouse-server: run by .ci/run, cargo test -- --include-ignored"]
fn a_sink_switched_off_and_on_again_gets_what_was_forwarded_meanwhile() {
    let ch = ClickHouse::start("edge_sink_off_and_on");
    let password = password_file(&ch);
    let upstream = Server::start();
    let fake = Fake::start(Some(upstream.addr));
    let tmp = data_dir();
    let both = args(Some(&ch), password.path(), Some(&fake.url()));
    let mut edge = start(tmp.path(), &both);
    let mut sent = capture(&edge, KEY_ONE, 1000, "before");
    wait_rows(&ch, &edge, sent.len());
    wait_kept(&fake, &edge, &sent);
    assert_eq!(edge.stop(), Some(0));

    // Without the sink: the forwarder alone reads the outbox, and its entries go.
    let forward_only = args(None, password.path(), Some(&fake.url()));
    let mut edge = start(tmp.path(), &forward_only);
    let meanwhile = capture(&edge, KEY_ONE, 1500, "meanwhile");
    wait_kept(&fake, &edge, &meanwhile);
    wait_for("the forwarder's backlog to drain", || {
        (metric(&edge, "flagpost_upstream_forward_backlog_events ") == 0.0).then_some(())
    });
    sent.extend(meanwhile);
    assert_eq!(edge.stop(), Some(0));

    // The sink back: what it missed comes as a backfill, beside what is new.
    let mut edge = start(tmp.path(), &both);
    sent.extend(capture(&edge, KEY_ONE, 500, "after"));
    wait_rows(&ch, &edge, sent.len());
    assert!(
        edge.log()
            .contains("switched off while the forwarder went on"),
        "{}",
        tail(&edge.log())
    );
    assert_once_in_clickhouse(&ch, &sent);
    // The persons made while it was off are there too.
    wait_for("the persons of the time off in ClickHouse", || {
        let q =
            "SELECT count() FROM person_distinct_id2 FINAL WHERE distinct_id LIKE 'meanwhile-%'";
        (ch.query(q) == "50\n").then_some(())
    });
    let q = "SELECT count() FROM person FINAL WHERE visitParamExtractString(properties, 'tag') = 'meanwhile'";
    assert_eq!(ch.query(q), "50\n");
    assert_once_upstream(&fake, &upstream, &sent);
    assert_eq!(edge.stop(), Some(0));
}

#[test]
#[ignore = "needs clickhouse-server: run by .ci/run, cargo test -- --include-ignored"]
fn the_forwarder_off_and_on_again_starts_over_from_its_checkpoint() {
    let ch = ClickHouse::start("edge_forward_off_and_on");
    let password = password_file(&ch);
    let fake = Fake::start(None);
    // Slow, so the edge is stopped with a run of events half sent.
    fake.with(|s| s.slow = Some(std::time::Duration::from_millis(300)));
    let tmp = data_dir();
    let both = args(Some(&ch), password.path(), Some(&fake.url()));
    let mut edge = start(tmp.path(), &both);
    let first = capture(&edge, KEY_ONE, 5000, "first");
    wait_for("a first request upstream", || {
        (!fake.kept().is_empty()).then_some(())
    });
    assert_eq!(edge.stop(), Some(0));
    assert!(fake.kept().len() < first.len(), "stopped half way");

    // Without --upstream the sink alone reads the outbox, and passes everything.
    let sink_only = args(Some(&ch), password.path(), None);
    let mut edge = start(tmp.path(), &sink_only);
    let off = capture(&edge, KEY_ONE, 500, "off");
    wait_rows(&ch, &edge, first.len() + off.len());
    assert_eq!(edge.stop(), Some(0));

    // Back: the half-sent run named entries that are gone; the forwarder starts over
    // and sends what is new, as documented (what it owed and what came meanwhile are
    // not forwarded).
    let edge = start(tmp.path(), &both);
    wait_for("the log to say it starts over", || {
        edge.log()
            .contains("a reader back after a time off starts again from its checkpoint")
            .then_some(())
    });
    let after = capture(&edge, KEY_ONE, 500, "after");
    let kept = wait_kept(&fake, &edge, &after);
    assert!(off.iter().all(|u| !kept.contains_key(u)));
    for (uuid, copies) in &kept {
        assert!(
            copies.iter().all(|c| c == &copies[0]),
            "copies of {uuid} differ"
        );
    }
    wait_for("the backlog to drain", || {
        (metric(&edge, "flagpost_upstream_forward_backlog_events ") == 0.0).then_some(())
    });
}
