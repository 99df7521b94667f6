//! Edge mode's ingest: the keys fixed in each event before the log's fsync (read back
//! through the read API), session recordings spooled and forwarded to upstream `/s/`
//! across an outage and a hard restart, and posthog-js's start-up answers (remote
//! config, surveys, early access) taken from a flagpost upstream and still served once
//! it is down, after a restart too.

mod fake;

use serde_json::{json, Value};

use crate::util::*;
use fake::Fake;

const HOUR: i64 = 3_600_000;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn iso(ms: i64) -> String {
    flagpost::support::clock::format_ms(ms)
}

fn ms(v: &Value) -> i64 {
    flagpost::capture::timestamp::parse_ms(v.as_str().unwrap()).unwrap()
}

/// An upstream URL nothing listens on: these tests need none to answer.
fn nowhere() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

fn named<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == name).collect()
}

#[test]
fn keys_are_fixed_in_each_event_before_it_is_stored() {
    let edge = Server::start_with(&["--upstream", &nowhere()]);
    let before = now_ms();
    let id = "0190f7b4-6a36-7c5d-8b8e-4c6a2d5e9f01";
    let retried = json!({"api_key": KEY_ONE, "batch": [
        {"event": "retried", "distinct_id": "d1", "uuid": id, "timestamp": iso(before - 5000)}
    ]});
    // The client's retry: the same event, same uuid, twice.
    for _ in 0..2 {
        assert_eq!(edge.post("/batch/", retried.to_string()).status, 200);
    }
    let no_uuid = json!({"api_key": KEY_ONE, "event": "no-uuid", "distinct_id": "d2"});
    assert_eq!(edge.post("/e/", no_uuid.to_string()).status, 200);
    // A client whose clock is an hour fast; the event happened 2 s before sending.
    let fast = before + HOUR;
    let skewed = json!({"api_key": KEY_ONE, "sent_at": iso(fast), "batch": [
        {"event": "skewed", "distinct_id": "d3", "timestamp": iso(fast - 2000)}
    ]});
    assert_eq!(edge.post("/batch/", skewed.to_string()).status, 200);
    // Three clients behind the trusted proxy (127.0.0.1), each with its own address.
    let clients = ["198.51.100.1", "198.51.100.2", "2001:db8::3"];
    for (i, ip) in clients.iter().enumerate() {
        let body = json!({"api_key": KEY_ONE, "event": "client", "distinct_id": format!("c{i}")});
        let r = edge.request(Req::post("/i/v0/e/", body.to_string()).header("X-Forwarded-For", ip));
        assert_eq!(r.status, 200);
    }
    let engage = json!({"api_key": KEY_ONE, "distinct_id": "d4", "$set": {"plan": "pro"}});
    assert_eq!(edge.post("/engage/", engage.to_string()).status, 200);
    let after = now_ms();
    let events = edge.settle(1);

    let retried = named(&events, "retried");
    assert_eq!(retried.len(), 1, "a retry is stored once");
    assert_eq!(retried[0]["id"], id);
    assert_eq!(ms(&retried[0]["timestamp"]), before - 5000);
    assert_eq!(
        retried[0]["properties"],
        json!({"$ip": "127.0.0.1", "$ignore_sent_at": true})
    );

    let minted = named(&events, "no-uuid");
    assert_eq!(minted.len(), 1);
    let minted_id = uuid::Uuid::parse_str(minted[0]["id"].as_str().unwrap()).unwrap();
    assert_eq!(minted_id.get_version_num(), 7);

    let skewed = named(&events, "skewed");
    let corrected = ms(&skewed[0]["timestamp"]);
    assert!(
        (before - 2000..=after - 2000).contains(&corrected),
        "{corrected} not within [{}, {}]",
        before - 2000,
        after - 2000
    );
    assert_eq!(skewed[0]["properties"]["$sent_at"], iso(fast));
    assert_eq!(skewed[0]["properties"]["$ignore_sent_at"], true);

    let mut ips: Vec<(String, String)> = named(&events, "client")
        .iter()
        .map(|e| {
            let who = e["distinct_id"].as_str().unwrap().to_string();
            (who, e["properties"]["$ip"].as_str().unwrap().to_string())
        })
        .collect();
    ips.sort();
    let expected: Vec<(String, String)> = clients
        .iter()
        .enumerate()
        .map(|(i, ip)| (format!("c{i}"), ip.to_string()))
        .collect();
    assert_eq!(ips, expected);

    let identify = named(&events, "$identify");
    assert_eq!(identify[0]["properties"]["$ignore_sent_at"], true);
    assert_eq!(identify[0]["properties"]["$set"], json!({"plan": "pro"}));

    // Outside edge mode the stored event is as sent, as before.
    let plain = Server::start();
    assert_eq!(plain.post("/e/", no_uuid.to_string()).status, 200);
    let stored = plain.settle(1);
    assert_eq!(
        named(&stored, "no-uuid")[0]["properties"],
        json!({"$ip": "127.0.0.1"})
    );
}

fn snapshot_batch() -> Value {
    json!([{"event": "$snapshot", "properties": {
        "$snapshot_data": [{"type": 2, "data": {"node": {"id": 1}}, "timestamp": 1}],
        "$session_id": "s1", "$window_id": "w1", "distinct_id": "d",
        "token": KEY_ONE, "$lib": "web", "$lib_version": "1.200.0"
    }}])
}

#[test]
fn recordings_reach_upstream_intact_across_an_outage_and_a_restart() {
    let upstream = Fake::start(503);
    let edge = Server::start_with(&["--upstream", &upstream.url()]);
    let body = gzip(snapshot_batch().to_string().as_bytes());
    let target = "/s/?compression=gzip-js&ver=1.200.0&_=1700000000000";
    let r = edge.request(
        Req::post(target, body.clone())
            .header("Content-Type", "text/plain")
            .header("X-Forwarded-For", "198.51.100.9"),
    );
    assert_eq!((r.status, r.json()), (200, json!({"status": 1})));
    let spool = edge.dir.join("db/upstream/recordings");
    assert_eq!(
        std::fs::read_dir(&spool).unwrap().count(),
        1,
        "kept before the 200"
    );
    // Upstream is down: the edge tries, keeps the file, and is killed mid-outage.
    wait_for("a try upstream", || {
        (!upstream.seen().is_empty()).then_some(())
    });
    let edge = edge.restart_hard();
    upstream.answer(200);
    wait_for("the spool to empty", || {
        let empty = std::fs::read_dir(&spool).unwrap().count() == 0;
        empty.then_some(())
    });
    let seen = upstream.seen();
    let delivered: Vec<_> = seen.iter().filter(|s| s.status == 200).collect();
    assert_eq!(delivered.len(), 1, "deleted only after the one 2xx");
    assert!(seen.iter().all(|s| s.target == target && s.body == body));
    let d = delivered[0];
    assert_eq!(d.headers["x-forwarded-for"], "198.51.100.9");
    assert_eq!(d.headers["content-type"], "text/plain");
    let mut sent = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&d.body[..]), &mut sent).unwrap();
    let sent: Value = serde_json::from_slice(&sent).unwrap();
    assert_eq!(sent[0]["properties"]["$lib"], "web");
    let metrics = edge.get("/metrics").text();
    assert!(
        metrics.contains(r#"flagpost_upstream_requests_total{endpoint="s",status="200"} 1"#),
        "{metrics}"
    );
    // Not product events.
    assert!(named(&edge.settle(1), "$snapshot").is_empty());
    // Refusals as capture's: a key of no project, a body that is not JSON.
    let unknown =
        json!([{"event": "$snapshot", "properties": {"token": "phc_nobody", "distinct_id": "d"}}]);
    assert_eq!(edge.post("/s/", unknown.to_string()).status, 401);
    assert_eq!(edge.post("/s/", "not json").status, 400);
    assert_eq!(std::fs::read_dir(&spool).unwrap().count(), 0);
    // The edge before the restart took the recording; this one counts its own
    // requests under their route, not under the paths flagpost does not keep.
    let r = edge.post("/s/", gzip(snapshot_batch().to_string().as_bytes()));
    assert_eq!(r.status, 200);
    let metrics = edge.get("/metrics").text();
    for counted in [
        r#"flagpost_http_requests_total{route="recordings",status="200"} 1"#,
        r#"flagpost_http_requests_total{route="recordings",status="401"} 1"#,
        r#"flagpost_http_requests_total{route="recordings",status="400"} 1"#,
    ] {
        assert!(metrics.contains(counted), "{counted} in {metrics}");
    }
    assert!(!metrics.contains(r#"route="not_kept""#), "{metrics}");
    // Outside edge mode, /s/ is not kept, as before, and counted so.
    let plain = Server::start();
    assert_eq!(plain.post("/s/", snapshot_batch().to_string()).status, 404);
    let metrics = plain.get("/metrics").text();
    assert!(
        metrics.contains(r#"flagpost_http_requests_total{route="not_kept",status="404"} 1"#),
        "{metrics}"
    );
}

/// A flagpost upstream whose project one has heatmaps on, a survey and a feature.
fn upstream_with_config() -> Server {
    let tmp = data_dir();
    let data = tmp.path().join("data");
    let projects = format!(
        r#"{{"projects": [{{"id": 1, "name": "one", "api_key": "{KEY_ONE}",
            "personal_api_keys": ["{PERSONAL_ONE}"], "remote_config": {{"heatmaps": true}}}},
            {{"id": 2, "name": "two", "api_key": "{KEY_TWO}"}}]}}"#
    );
    std::fs::write(data.join("projects.json"), projects).unwrap();
    std::fs::create_dir_all(data.join("surveys")).unwrap();
    let survey = json!({"surveys": [{"id": "s1", "name": "NPS", "type": "popover",
        "questions": [{"id": "q1", "type": "open", "question": "Why?"}],
        "start_date": "2026-01-05T09:00:00Z", "end_date": null}]});
    std::fs::write(data.join("surveys/1.json"), survey.to_string()).unwrap();
    std::fs::create_dir_all(data.join("early_access")).unwrap();
    let features = json!({"earlyAccessFeatures": [
        {"id": "f1", "name": "Dark mode", "stage": "beta", "flagKey": "dark-mode"}]});
    std::fs::write(data.join("early_access/1.json"), features.to_string()).unwrap();
    let mut server = Server::spawn(tmp.path(), &[]);
    server.keep(tmp);
    server
}

#[test]
fn start_up_answers_come_from_upstream_and_outlive_it() {
    let mut upstream = upstream_with_config();
    let assets = tempfile::tempdir().unwrap();
    std::fs::write(assets.path().join("array.js"), "/* library */").unwrap();
    let edge = Server::start_with(&[
        "--upstream",
        &format!("http://{}", upstream.addr),
        "--static-dir",
        assets.path().to_str().unwrap(),
    ]);
    let paths = [
        format!("/array/{KEY_ONE}/config"),
        format!("/array/{KEY_ONE}/config.js"),
        format!("/api/surveys/?token={KEY_ONE}"),
        format!("/api/early_access_features/?token={KEY_ONE}"),
    ];
    let from_upstream: Vec<String> = paths
        .iter()
        .map(|p| {
            let r = upstream.get(p);
            assert_eq!(r.status, 200, "{p}");
            r.text()
        })
        .collect();
    let check = |edge: &Server, when: &str| {
        for (p, expected) in paths.iter().zip(&from_upstream) {
            let r = edge.request(Req::get(p).header("Origin", "https://app.example"));
            assert_eq!((r.status, &r.text()), (200, expected), "{p} {when}");
            assert_eq!(
                r.header("access-control-allow-origin"),
                Some("https://app.example")
            );
        }
    };
    check(&edge, "with upstream up");
    // array.js: the edge's own library, then upstream's config script.
    let array = edge.get(&format!("/array/{KEY_ONE}/array.js"));
    assert_eq!(array.status, 200, "{}", array.text());
    assert!(
        array.text() == format!("/* library */\n\n{}", from_upstream[1]),
        "{}",
        array.text()
    );
    let config: Value = serde_json::from_str(&from_upstream[0]).unwrap();
    assert_eq!(
        config["heatmaps"], true,
        "upstream's switch, not the edge's own"
    );
    assert_eq!(
        edge.get(&format!("/array/{KEY_TWO}/config")).json()["heatmaps"],
        false
    );
    // `/flags?config=true` ends with upstream's client config too.
    let flags_heatmaps = |edge: &Server| {
        let body = json!({"token": KEY_ONE, "distinct_id": "u"}).to_string();
        let r = edge.post("/flags/?v=2&config=true", body);
        assert_eq!(r.status, 200);
        let answer = r.json();
        (answer["heatmaps"] == true).then_some(answer)
    };
    let answer = wait_for("upstream's config in /flags", || flags_heatmaps(&edge));
    assert_eq!(
        answer["supportedCompression"],
        config["supportedCompression"]
    );
    assert!(answer.get("token").is_none() && answer.get("hasFeatureFlags").is_none());
    // Upstream goes away: the copies in memory, then on disk after a hard restart.
    upstream.stop();
    check(&edge, "with upstream down");
    let edge = edge.restart_hard();
    check(&edge, "after a restart with upstream down");
    wait_for("upstream's config in /flags from disk", || {
        flags_heatmaps(&edge)
    });
    // A key of no project is the edge's own refusal.
    assert_eq!(edge.get("/array/phc_nobody/config").status, 401);
    assert_eq!(edge.get("/api/surveys/?token=phc_nobody").status, 401);
}
