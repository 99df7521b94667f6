//! The real binary with `--clickhouse-url` against the real server: events captured
//! over HTTP arrive in ClickHouse with the persons, links and groups they imply, the
//! same person ids as the read API, the elements chain PostHog would build, and still
//! exactly once after flagpost is killed with SIGKILL and started again, five times
//! over, with small log segments.

use serde_json::{json, Value};

use super::*;
use crate::util::*;

pub(super) fn capture(server: &Server, batch: Value) {
    let r = server.post(
        "/batch/",
        json!({"api_key": KEY_ONE, "batch": batch}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

pub(super) fn start(ch: &ClickHouse, password: &std::path::Path) -> Server {
    let args = sink_args(ch, password);
    Server::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The options that point a flagpost binary at `ch`'s database as the test user.
pub(super) fn sink_args(ch: &ClickHouse, password: &std::path::Path) -> Vec<String> {
    [
        "--clickhouse-url",
        &ch.url(),
        "--clickhouse-database",
        &ch.database,
        "--clickhouse-user",
        server::USER,
        "--clickhouse-password-file",
        password.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec()
}

pub(super) fn wait_for_events(ch: &ClickHouse, n: usize) {
    let want = format!("{n}\n");
    wait_for(&format!("{n} events in ClickHouse"), || {
        let resp = ch.try_query("SELECT count() FROM events FINAL");
        (resp.status == 200 && resp.text() == want).then_some(())
    });
}

#[test]
#[ignore = "needs clickhouse-server: run by .ci/run, cargo test -- --include-ignored"]
fn captured_events_persons_and_groups_arrive_once() {
    let ch = ClickHouse::start("sink_end_to_end");
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), format!("{}\n", server::PASSWORD)).unwrap();
    let server = start(&ch, secret.path());
    capture(
        &server,
        json!([
            {"event": "$pageview", "properties": {"distinct_id": "anon-7", "$current_url": "https://shop/"}},
            {"event": "$identify", "properties": {"distinct_id": "ada@example.com", "$anon_distinct_id": "anon-7", "$set": {"email": "ada@example.com"}}},
            {"event": "$groupidentify", "properties": {"distinct_id": "ada@example.com", "$group_type": "company", "$group_key": "acme", "$group_set": {"seats": 12}}},
            {"event": "order placed", "properties": {"distinct_id": "anon-7", "$groups": {"company": "acme"}, "amount": 30}},
            {"event": "$autocapture", "properties": {"distinct_id": "anon-7", "$event_type": "click", "$elements": [
                {"tag_name": "a", "$el_text": "Pricing", "attr__class": "btn btn-sm", "attr__href": "/pricing", "nth_child": 1, "nth_of_type": 2},
                {"tag_name": "div", "nth_child": 1, "nth_of_type": 1}
            ]}}
        ]),
    );
    wait_for_events(&ch, 5);
    let stored = server.wait_for_events(1, 5);
    let person = stored[0]["person_id"].as_str().unwrap().to_string();
    assert_eq!(
        ch.query(
            "SELECT event, distinct_id, toString(person_id), team_id, `$group_0` FROM events \
             FINAL ORDER BY event"
        ),
        format!(
            "$autocapture\tanon-7\t{person}\t1\t\n\
             $groupidentify\tada@example.com\t{person}\t1\t\n$identify\tada@example.com\t{person}\t1\t\n\
             $pageview\tanon-7\t{person}\t1\t\norder placed\tanon-7\t{person}\t1\tacme\n"
        )
    );
    // `$elements` becomes the chain PostHog's ingestion builds, and leaves the
    // properties as it does there; the read API still has it as sent.
    assert_eq!(
        ch.query(
            "SELECT elements_chain, visitParamExtractString(properties, '$event_type'), \
             position(properties, '$elements') FROM events FINAL WHERE event = '$autocapture'"
        ),
        "a.btn.btn-sm:attr__class=\"btn btn-sm\"attr__href=\"/pricing\"href=\"/pricing\"\
         nth-child=\"1\"nth-of-type=\"2\"text=\"Pricing\";div:nth-child=\"1\"nth-of-type=\"1\"\tclick\t0\n"
    );
    let autocapture = stored
        .iter()
        .find(|e| e["event"] == "$autocapture")
        .unwrap();
    assert_eq!(
        autocapture["properties"]["$elements"][0]["$el_text"],
        "Pricing"
    );
    assert_eq!(
        ch.query(
            "SELECT toString(id), visitParamExtractString(properties, 'email'), is_deleted \
             FROM person FINAL"
        ),
        format!("{person}\tada@example.com\t0\n")
    );
    assert_eq!(
        ch.query(
            "SELECT distinct_id, toString(person_id), is_deleted FROM person_distinct_id2 FINAL \
             ORDER BY distinct_id"
        ),
        format!("ada@example.com\t{person}\t0\nanon-7\t{person}\t0\n")
    );
    assert_eq!(
        ch.query("SELECT team_id, group_type_index, group_key, group_properties FROM groups FINAL"),
        "1\t0\tacme\t{\"seats\":12}\n"
    );
    let metrics = server.get("/metrics").text();
    assert!(
        metrics.contains("flagpost_sink_rows_total{table=\"events\"} 5"),
        "{metrics}"
    );
    assert!(metrics.contains("flagpost_sink_lag_seconds 0"), "{metrics}");

    // Killed with everything sent, started again, one more event: nothing twice.
    let server = server.restart_hard();
    capture(
        &server,
        json!([{"event": "$pageview", "properties": {"distinct_id": "ada@example.com"}}]),
    );
    wait_for_events(&ch, 6);
    ch.merge("events");
    assert_eq!(
        ch.query("SELECT count(), uniqExact(uuid) FROM events"),
        "6\t6\n"
    );
}

/// Events captured in requests of this many.
const REQUEST_EVENTS: usize = 500;
/// Events captured between two kills; each kill lands once ClickHouse has taken some
/// of them, while the sink is sending or has just sent.
const ROUND_EVENTS: usize = 8_000;
/// How many times flagpost is killed with SIGKILL.
const KILLS: usize = 5;

#[test]
#[ignore = "needs clickhouse-server: run by .ci/run, cargo test -- --include-ignored"]
fn kills_while_sending_lose_nothing_and_duplicate_nothing() {
    let ch = ClickHouse::start("sink_crash");
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), server::PASSWORD).unwrap();
    // Small log segments, so segments are released and recycled between the kills.
    let mut args = sink_args(&ch, secret.path());
    args.extend(["--log-segment-mb".to_string(), "1".to_string()]);
    let mut server = Server::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut acknowledged = 0;
    for kill in 0..KILLS {
        // Before the sink's first start has created the table, nothing is there.
        let before = ch.try_query("SELECT count() FROM events");
        let before = if before.status == 200 {
            before.text()
        } else {
            "0\n".to_string()
        };
        for r in 0..ROUND_EVENTS / REQUEST_EVENTS {
            let batch: Vec<Value> = (0..REQUEST_EVENTS)
                .map(|i| {
                    let n = acknowledged + r * REQUEST_EVENTS + i;
                    json!({"event": "$pageview", "uuid": uuid::Uuid::from_u128(0x5eed_0000 + n as u128),
                           "properties": {"distinct_id": format!("user-{}", n % 100), "n": n}})
                })
                .collect();
            // Asserts the 200: every event counted here was acknowledged.
            capture(&server, Value::Array(batch));
        }
        acknowledged += ROUND_EVENTS;
        wait_for("the sink to send some of this round", || {
            let resp = ch.try_query("SELECT count() FROM events");
            (resp.status == 200 && resp.text() != before).then_some(())
        });
        eprintln!(
            "kill {}: {} rows in ClickHouse, {acknowledged} events acknowledged",
            kill + 1,
            ch.query("SELECT count() FROM events").trim()
        );
        server = server.restart_hard();
    }
    wait_for_events(&ch, acknowledged);
    // Rows sent twice (a batch in flight at a kill) are there until a merge; FINAL
    // collapses them, and so does the merge.
    let want = format!(
        "{acknowledged}\t{acknowledged}\t0\t{}\t{}\n",
        acknowledged - 1,
        acknowledged * (acknowledged - 1) / 2
    );
    let counts = "SELECT count(), uniqExact(uuid), min(visitParamExtractUInt(properties, 'n')), \
                  max(visitParamExtractUInt(properties, 'n')), \
                  sum(visitParamExtractUInt(properties, 'n')) FROM events";
    assert_eq!(
        ch.query(&counts.replace("FROM events", "FROM events FINAL")),
        want
    );
    eprintln!(
        "rows before merging: {}",
        ch.query("SELECT count() FROM events").trim()
    );
    ch.merge("events");
    assert_eq!(ch.query(counts), want);
    // Each uuid is the one its event was sent with.
    assert_eq!(
        ch.query(
            "SELECT count() FROM events WHERE toString(uuid) != concat('00000000-0000-0000-0000-0000', \
             lower(hex(toUInt32(1592590336 + visitParamExtractUInt(properties, 'n')))))"
        ),
        "0\n"
    );
    drop(server);
}
