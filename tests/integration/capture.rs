//! Capture end to end: every intake path and encoding, every error and drop, CORS,
//! and durability across a hard kill.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::util::*;

const PATHS: [&str; 12] = [
    "/e",
    "/e/",
    "/i/v0/e",
    "/i/v0/e/",
    "/capture",
    "/capture/",
    "/track",
    "/track/",
    "/engage",
    "/engage/",
    "/batch",
    "/batch/",
];

fn event(name: &str) -> Value {
    json!({"event": name, "distinct_id": "user-1", "api_key": KEY_ONE,
           "properties": {"$current_url": "https://example.com/ü"}})
}

fn events_by_name(events: &[Value]) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for e in events {
        *seen
            .entry(e["event"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    seen
}

/// Unix milliseconds of an RFC 3339 time from the API.
fn ms(v: &Value) -> i64 {
    flagpost::capture::timestamp::parse_ms(v.as_str().unwrap()).unwrap()
}

#[test]
fn every_path_and_encoding_is_stored() {
    let mut server = Server::start();
    let lz64: HashMap<String, String> =
        serde_json::from_str(include_str!("../fixtures/lz64_capture.json")).unwrap();
    let mut expected = Vec::new();
    for path in PATHS {
        let plain = serde_json::to_vec(&event(&format!("plain {path}"))).unwrap();
        let r = server.post(path, plain);
        assert_eq!(
            (r.status, r.json()),
            (200, json!({"status": 1})),
            "plain {path}"
        );

        // gzip announced by the header, and by the query string (posthog-js gzip-js
        // sends raw gzip as text/plain).
        let body = serde_json::to_vec(&[event(&format!("gzip-header {path}"))]).unwrap();
        let r = server.request(Req::post(path, gzip(&body)).header("Content-Encoding", "gzip"));
        assert_eq!(r.status, 200, "gzip header {path}: {}", r.text());
        let body = serde_json::to_vec(&[event(&format!("gzip-js {path}"))]).unwrap();
        let r = server.request(
            Req::post(
                &format!("{path}?compression=gzip-js&ver=1.150.0"),
                gzip(&body),
            )
            .header("Content-Type", "text/plain"),
        );
        assert_eq!(r.status, 200, "gzip-js {path}: {}", r.text());
        // gzip recognised by its magic bytes with no hint at all.
        let body = serde_json::to_vec(&event(&format!("gzip-magic {path}"))).unwrap();
        assert_eq!(
            server.post(path, gzip(&body)).status,
            200,
            "gzip magic {path}"
        );

        // base64 in a form body, as posthog-js sends it.
        let body = serde_json::to_vec(&[event(&format!("base64-form {path}"))]).unwrap();
        let form = format!("data={}&compression=base64", urlencode(&base64(&body)));
        let r = server.request(
            Req::post(path, form).header("Content-Type", "application/x-www-form-urlencoded"),
        );
        assert_eq!(r.status, 200, "base64 form {path}: {}", r.text());

        // lz64 in a form body (older posthog-js), from the real LZ-String library.
        let form = format!("data={}&compression=lz64", urlencode(&lz64[path]));
        let r = server.request(
            Req::post(path, form).header("Content-Type", "application/x-www-form-urlencoded"),
        );
        assert_eq!(r.status, 200, "lz64 {path}: {}", r.text());

        // GET with the payload in data= (base64).
        let body = serde_json::to_vec(&event(&format!("get {path}"))).unwrap();
        let r = server.get(&format!("{path}?data={}", urlencode(&base64(&body))));
        assert_eq!(r.status, 200, "GET {path}: {}", r.text());

        for kind in [
            "plain",
            "gzip-header",
            "gzip-js",
            "gzip-magic",
            "base64-form",
            "get",
            "lz64",
        ] {
            expected.push(format!("{kind} {path}"));
        }
    }
    let events = server.settle(1);
    let seen = events_by_name(&events);
    for name in &expected {
        assert_eq!(seen.get(name), Some(&1), "{name} stored once");
    }
    assert_eq!(seen.values().sum::<usize>(), expected.len());
    // The lz64 payload's unicode survived UTF-16 decoding.
    let lz = events
        .iter()
        .find(|e| e["event"] == "lz64 /batch/")
        .unwrap();
    assert_eq!(lz["properties"]["text"], "ünïcødé ✓ 😀");
    assert_eq!(lz["distinct_id"], "user-lz64");
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn batch_shapes_keys_and_fields() {
    let mut server = Server::start();
    // posthog-python: batch envelope, distinct_id inside properties, historical flag.
    let batch = json!({"api_key": KEY_TWO, "historical_migration": true,
    "sent_at": "2024-01-01T00:00:10Z",
    "batch": [
        {"event": "py-1", "properties": {"distinct_id": "p1"}, "timestamp": "2024-01-01T00:00:05Z",
         "uuid": "0190f7b4-6a36-7c5d-8b8e-4c6a2d5e9f01"},
        {"event": "py-2", "distinct_id": 77, "properties": {}}
    ]});
    assert_eq!(server.post("/batch/", batch.to_string()).status, 200);
    // posthog-js: an array with offsets and the key in properties.token.
    let js = json!([{"event": "js-1", "offset": 1500,
        "properties": {"distinct_id": "anon-1", "token": KEY_ONE}}]);
    let r = server.post("/e/?ip=1&_=1700000000000&ver=1.200.0", js.to_string());
    assert_eq!(r.status, 200);
    // /engage without an event name is an $identify.
    let engage = json!({"$set": {"email": "a@example.com"}, "distinct_id": "p9", "token": KEY_ONE});
    assert_eq!(server.post("/engage/", engage.to_string()).status, 200);
    // A beacon gets 204 with no body.
    let r = server.post("/e/?beacon=1", event("beacon").to_string());
    assert_eq!((r.status, r.body.len()), (204, 0));

    let one = server.settle(1);
    let two = server.settle(2);
    let by: HashMap<&str, &Value> = one
        .iter()
        .chain(&two)
        .map(|e| (e["event"].as_str().unwrap(), e))
        .collect();
    let py1 = by["py-1"];
    assert_eq!(py1["distinct_id"], "p1");
    assert_eq!(py1["id"], "0190f7b4-6a36-7c5d-8b8e-4c6a2d5e9f01");
    // Sent 5 s after the event by the client's clock: stored 5 s before arrival.
    assert_eq!(ms(&py1["timestamp"]), ms(&py1["created_at"]) - 5000);
    assert_eq!(by["py-2"]["distinct_id"], "77");
    assert_eq!(two.len(), 2, "the batch key put both events in project 2");
    let js1 = by["js-1"];
    assert_eq!(ms(&js1["timestamp"]), ms(&js1["created_at"]) - 1500);
    assert_eq!(js1["properties"]["$ip"], "127.0.0.1");
    assert_eq!(by["$identify"]["distinct_id"], "p9");
    assert!(by.contains_key("beacon"));
    assert_eq!(one.len(), 3);
    // The historical batch went through its own lane.
    let metrics = server.get("/metrics").text();
    let line = "flagpost_compactor_routed_total{lane=\"historical\"} 2";
    assert!(metrics.contains(line), "{line} in {metrics}");
    // Everything applied, from the one log segment written so far.
    for line in ["flagpost_log_depth 0", "flagpost_log_segments 1"] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn errors_have_status_and_json_body() {
    let server = Server::start_with(&[
        "--max-body-bytes",
        "100000",
        "--max-decompressed-bytes",
        "200000",
    ]);
    let check = |r: Resp, status: u16, code: &str| {
        assert_eq!(r.status, status, "{code}: {}", r.text());
        let body = r.json();
        assert_eq!(body["code"], code, "{body}");
        assert!(body["type"].is_string() && body["detail"].as_str().is_some_and(|d| !d.is_empty()));
    };
    let no_key = json!({"event": "e", "distinct_id": "d"});
    check(
        server.post("/capture/", no_key.to_string()),
        401,
        "missing_api_key",
    );
    let unknown = json!({"event": "e", "distinct_id": "d", "api_key": "phc_nope"});
    check(
        server.post("/capture/", unknown.to_string()),
        401,
        "invalid_api_key",
    );
    let personal = json!({"event": "e", "distinct_id": "d", "api_key": PERSONAL_ONE});
    check(
        server.post("/capture/", personal.to_string()),
        401,
        "invalid_api_key",
    );
    let long = json!({"event": "e", "distinct_id": "d", "api_key": "k".repeat(65)});
    check(
        server.post("/capture/", long.to_string()),
        401,
        "invalid_api_key",
    );
    check(
        server.post("/capture/", "{\"event\": "),
        400,
        "invalid_payload",
    );
    check(
        server.post("/capture/", "not json at all"),
        400,
        "invalid_payload",
    );
    check(
        server.request(Req::post("/capture/", "nope").header("Content-Encoding", "gzip")),
        400,
        "invalid_payload",
    );
    check(
        server.request(
            Req::post("/e/?compression=lz64", "data=!!!!")
                .header("Content-Type", "application/x-www-form-urlencoded"),
        ),
        400,
        "invalid_payload",
    );
    let mixed = json!([{"event": "a", "distinct_id": "d", "api_key": KEY_ONE},
                       {"event": "b", "distinct_id": "d", "api_key": KEY_TWO}]);
    check(
        server.post("/batch/", mixed.to_string()),
        400,
        "multiple_api_keys",
    );
    check(
        server.post(
            "/batch/",
            json!({"api_key": KEY_ONE, "batch": []}).to_string(),
        ),
        400,
        "empty_batch",
    );
    check(server.post("/batch/", ""), 400, "invalid_payload");
    let wrong = json!({"event": 5, "distinct_id": "d", "api_key": KEY_ONE});
    check(
        server.post("/capture/", wrong.to_string()),
        400,
        "invalid_payload",
    );
    let wrong = json!({"event": "e", "distinct_id": {"a": 1}, "api_key": KEY_ONE});
    check(
        server.post("/capture/", wrong.to_string()),
        400,
        "invalid_payload",
    );
    let wrong = json!({"event": "e", "distinct_id": "d", "properties": [], "api_key": KEY_ONE});
    check(
        server.post("/capture/", wrong.to_string()),
        400,
        "invalid_payload",
    );
    // Over the body limit, declared up front: refused before the body is read.
    check(
        server.post("/batch/", vec![b' '; 100_001]),
        413,
        "payload_too_large",
    );
    // Small on the wire, over the cap once decompressed.
    check(
        server.post("/batch/", gzip(&vec![b' '; 300_000])),
        413,
        "payload_too_large",
    );
    check(
        server.request(Req::get("/capture/").method("PUT")),
        405,
        "method_not_allowed",
    );
    check(server.get("/nope"), 404, "not_found");
    // A request that failed stored nothing; the server still serves.
    let r = server.post("/capture/", event("after-errors").to_string());
    assert_eq!(r.status, 200);
}

#[test]
fn dropped_events_succeed_and_are_counted() {
    let mut server = Server::start();
    let batch = json!({"api_key": KEY_ONE, "batch": [
        {"properties": {"distinct_id": "d"}},
        {"event": "", "properties": {"distinct_id": "d"}},
        {"event": "no-id"},
        {"event": "empty-id", "distinct_id": ""},
        {"event": "kept", "distinct_id": "d"}
    ]});
    let r = server.post("/batch/", batch.to_string());
    assert_eq!((r.status, r.json()), (200, json!({"status": 1})));
    // Every event dropped: still 200.
    let r = server.post(
        "/batch/",
        json!({"api_key": KEY_ONE, "batch": [{"event": "x"}]}).to_string(),
    );
    assert_eq!(r.status, 200);
    let metrics = server.get("/metrics").text();
    for (reason, n) in [
        ("missing_event_name", 2),
        ("missing_distinct_id", 2),
        ("empty_distinct_id", 1),
    ] {
        let line = format!("flagpost_events_dropped_total{{reason=\"{reason}\"}} {n}");
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
    assert!(
        metrics.contains("flagpost_events_accepted_total 1"),
        "{metrics}"
    );
    let names: Vec<Value> = server
        .settle(1)
        .into_iter()
        .map(|e| e["event"].clone())
        .collect();
    assert_eq!(names, ["kept"]);
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn cors_preflight_and_headers() {
    let server = Server::start();
    let r = server.request(
        Req::get("/e/")
            .method("OPTIONS")
            .header("Origin", "https://app.example.com")
            .header("Access-Control-Request-Method", "POST")
            .header("Access-Control-Request-Headers", "content-type, x-custom"),
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(
        r.header("access-control-allow-methods"),
        Some("GET, POST, OPTIONS")
    );
    assert_eq!(
        r.header("access-control-allow-headers"),
        Some("content-type, x-custom")
    );
    // Actual requests, successful or not, carry the origin too.
    let r = server.request(
        Req::post("/e/", event("cors").to_string()).header("Origin", "https://app.example.com"),
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    let r = server.request(Req::post("/e/", "{").header("Origin", "https://x.example"));
    assert_eq!(r.status, 400);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://x.example")
    );
}

#[test]
fn health_endpoints() {
    let mut server = Server::start();
    let r = server.get("/_liveness");
    assert_eq!((r.status, r.text().as_str()), (200, "ok"));
    let r = server.get("/_readiness");
    assert_eq!((r.status, r.text().as_str()), (200, "ready"));
    assert_eq!(server.stop(), Some(0));
    assert!(server.log().contains("stopped cleanly"));
}

#[test]
fn acknowledged_events_survive_a_hard_kill() {
    let server = Server::start();
    let addr = server.addr;
    let acked: Vec<String> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..8)
            .map(|w| {
                s.spawn(move || {
                    let mut acked = Vec::new();
                    for i in 0..40 {
                        let uuid = uuid::Uuid::now_v7().to_string();
                        let batch = json!({"api_key": KEY_ONE, "batch": [
                            {"event": "durable", "uuid": uuid, "properties": {"distinct_id": format!("w{w}"), "i": i}}
                        ]});
                        let r = send(addr, Req::post("/batch/", batch.to_string()));
                        if r.status == 200 {
                            acked.push(uuid);
                        }
                    }
                    acked
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    assert_eq!(acked.len(), 320);
    // SIGKILL: nothing gets a chance to flush on the way out. The store opens
    // again and every acknowledged event is there, once.
    let server = server.restart_hard();
    assert_eq!(server.get("/_readiness").status, 200);
    let stored: Vec<String> = server
        .settle(1)
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    let unique: std::collections::HashSet<&String> = stored.iter().collect();
    assert_eq!(unique.len(), stored.len(), "no event stored twice");
    for uuid in &acked {
        assert!(unique.contains(uuid), "acknowledged event {uuid} lost");
    }
    assert_eq!(stored.len(), acked.len());
}

#[test]
fn sighup_reloads_projects_and_keeps_them_on_a_bad_file() {
    let server = Server::start();
    let fresh = json!({"event": "e", "distinct_id": "d", "api_key": "phc_added_later"}).to_string();
    assert_eq!(server.post("/capture/", fresh.clone()).status, 401);
    let projects = server.data().join("projects.json");
    let mut file: Value = serde_json::from_slice(&std::fs::read(&projects).unwrap()).unwrap();
    file["projects"]
        .as_array_mut()
        .unwrap()
        .push(json!({"id": 3, "api_key": "phc_added_later"}));
    std::fs::write(&projects, file.to_string()).unwrap();
    server.sighup();
    wait_for("the new key to be accepted", || {
        (server.post("/capture/", fresh.clone()).status == 200).then_some(())
    });
    // A broken file is reported and the loaded projects stay.
    std::fs::write(&projects, "{ broken").unwrap();
    server.sighup();
    wait_for("the reload failure to be logged", || {
        server.log().contains("projects not reloaded").then_some(())
    });
    assert_eq!(server.post("/capture/", fresh).status, 200);
}
