//! Keys used where they do not belong, regexes built to backtrack, and what error
//! bodies may say.

use std::time::{Duration, Instant};

use serde_json::json;

use super::*;

#[test]
fn keys_used_where_they_do_not_belong() {
    let s = Server::start();
    // A personal key never ingests, nor evaluates flags.
    hostile(
        &s,
        s.post(
            "/capture/",
            event(json!({"api_key": PERSONAL_ONE})).to_string(),
        ),
        401,
        "invalid_api_key",
    );
    let batch = json!({"api_key": PERSONAL_ONE, "batch": [{"event": "e", "distinct_id": "d"}]});
    hostile(
        &s,
        s.post("/batch/", batch.to_string()),
        401,
        "invalid_api_key",
    );
    hostile(
        &s,
        s.post(
            "/decide/?v=3",
            json!({"token": PERSONAL_ONE, "distinct_id": "d"}).to_string(),
        ),
        401,
        "invalid_api_key",
    );
    // A project key never reads.
    for path in [
        "/api/projects/1/events/",
        "/api/projects/1/persons/?distinct_id=d",
        "/api/projects/1/groups/?group_type_index=0&group_key=g",
        "/api/feature_flag/local_evaluation/?token=phc_test_one",
    ] {
        hostile(&s, s.api(path, KEY_ONE), 401, "not_authenticated");
        hostile(&s, s.get(path), 401, "not_authenticated");
        // Another project's personal key reads nothing of this one.
        hostile(&s, s.api(path, PERSONAL_TWO), 403, "permission_denied");
    }
    // Whether the project exists or not.
    hostile(
        &s,
        s.api("/api/projects/999/events/", PERSONAL_ONE),
        403,
        "permission_denied",
    );
    still_serving(&s);
}

#[test]
fn catastrophic_regex_is_answered_fast() {
    let tmp = data_dir();
    let flag = |id: u32, key: &str, pattern: &str| {
        json!({"id": id, "key": key, "active": true, "filters": {"groups": [{
            "properties": [{"key": "email", "type": "person", "value": pattern, "operator": "regex"}],
            "rollout_percentage": 100}]}})
    };
    let flags = json!({"flags": [
        flag(1, "backtrack", "(a+)+$"),
        flag(2, "nested", "^(a|aa)+$"),
        flag(3, "huge", "(a{1000}){1000}"),
    ], "group_type_mapping": {}, "cohorts": {}});
    std::fs::write(tmp.path().join("data/flags/1.json"), flags.to_string()).unwrap();
    let s = Server::spawn(tmp.path(), &[]);
    let decide = |email: &str| {
        let body =
            json!({"token": KEY_ONE, "distinct_id": "d", "person_properties": {"email": email}});
        let started = Instant::now();
        let r = s.post("/decide/?v=3", body.to_string());
        assert_eq!(r.status, 200, "{}", r.text());
        (r.json()["featureFlags"].clone(), started.elapsed())
    };
    let hostile = format!("{}!", "a".repeat(100_000));
    let (flags, elapsed) = decide(&hostile);
    assert_eq!(
        flags,
        json!({"backtrack": false, "nested": false, "huge": false})
    );
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    // The flags are live, not just broken: a matching value turns them on.
    let (flags, _) = decide("aaaa");
    assert_eq!(
        flags,
        json!({"backtrack": true, "nested": true, "huge": false})
    );
    still_serving(&s);
}

/// One of every error the server can give, scanned for anything about internals.
#[test]
fn error_bodies_leak_nothing() {
    let s = Server::start_with(&["--max-body-bytes", "1000"]);
    let answers = [
        s.post("/capture/", "{\"event\": \u{1F4A5}"),
        s.post("/capture/", vec![0xffu8; 8]),
        s.post(
            "/capture/",
            r#"{"api_key":"phc_test_one","event":5,"distinct_id":"d"}"#,
        ),
        s.post("/capture/", r#"{"event":"e","distinct_id":"d"}"#),
        s.post(
            "/capture/",
            r#"{"api_key":"phc_unknown","event":"e","distinct_id":"d"}"#,
        ),
        s.post(
            "/capture/",
            r#"[{"api_key":"phc_test_one","event":"e"},{"api_key":"phc_test_two","event":"e"}]"#,
        ),
        s.post("/capture/", r#"{"api_key":"phc_test_one","batch":[]}"#),
        s.post("/capture/", "a".repeat(2000)),
        s.request(Req::post("/capture/?compression=gzip", "not gzip")),
        s.request(Req::post("/capture/?compression=lz64", "@@@@")),
        s.request(Req::post("/capture/?compression=base64", "!!!!")),
        s.post("/capture/", ""),
        s.request(Req::get("/capture/").method("DELETE")),
        s.post("/decide/", r#"{"distinct_id":"d"}"#),
        s.post("/decide/", r#"{"token":"phc_test_one"}"#),
        s.post("/decide/", r#"{"token":"phc_nobody","distinct_id":"d"}"#),
        s.get("/nowhere"),
        s.get("/api/projects/1/events/"),
        s.api("/api/projects/1/events/", PERSONAL_TWO),
        s.api("/api/projects/1/events/?limit=lots", PERSONAL_ONE),
        s.api("/api/projects/1/events/?after=yesterday", PERSONAL_ONE),
        s.api(
            "/api/projects/1/groups/?group_type_index=0&group_key=none",
            PERSONAL_ONE,
        ),
        s.api("/flags/definitions?token=phc_test_two", PERSONAL_ONE),
    ];
    for r in &answers {
        assert!((400..500).contains(&r.status), "{} {}", r.status, r.text());
        assert_clean(r);
        let body = r.json();
        assert!(body["detail"].is_string(), "{body}");
    }
    still_serving(&s);
}
