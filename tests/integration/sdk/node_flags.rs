//! posthog-node 4.x and 5.x through the flag endpoints beyond evaluation
//! (`tests/sdk/node/host.mjs`): `getRemoteConfigPayload`, local evaluation of a flag
//! that depends on another, and the definitions feed polled twice with its ETag.

use std::path::Path;

use serde_json::{json, Value};

use super::*;
use crate::util::*;

/// `needs-base` and `needs-off` depend on other flags by id, as PostHog's editor
/// writes them; `settings` is a remote config flag with a payload.
fn rules() -> Value {
    let depends_on = |id: &str| {
        json!({"groups": [{"properties": [
            {"key": id, "type": "flag", "value": true, "operator": "flag_evaluates_to"}],
            "rollout_percentage": 100}]})
    };
    json!({
        "flags": [
            {"id": 1, "key": "base", "active": true,
             "filters": {"groups": [{"properties": [], "rollout_percentage": 100}]}},
            {"id": 2, "key": "needs-base", "active": true, "filters": depends_on("1")},
            {"id": 3, "key": "off", "active": true,
             "filters": {"groups": [{"properties": [], "rollout_percentage": 0}]}},
            {"id": 4, "key": "needs-off", "active": true, "filters": depends_on("3")},
            {"id": 5, "key": "settings", "active": true, "is_remote_configuration": true,
             "filters": {"groups": [{"properties": [], "rollout_percentage": 100}],
                         "payloads": {"true": "{\"theme\": \"dark\"}"}}}
        ],
        "group_type_mapping": {},
        "cohorts": {}
    })
}

/// The `$feature_flag_evaluated_at` of the stored `$feature_flag_called` event of the
/// remote evaluation, and the `evaluatedAt` the server answered it with.
fn evaluated_at(server: &Server, summary: &Value) -> (Value, Value) {
    let events = wait_for("the $feature_flag_called event", || {
        let events = server.stored_events(1);
        events
            .iter()
            .any(|e| e["distinct_id"] == "remote-user")
            .then_some(events)
    });
    assert_eq!(summary["remote_base"], true);
    let called = events
        .iter()
        .find(|e| e["distinct_id"] == "remote-user" && e["event"] == "$feature_flag_called")
        .expect("a $feature_flag_called event");
    let answered = array(&summary["remote_evaluated_at"]);
    assert_eq!(answered.len(), 1, "one remote evaluation: {answered:?}");
    (
        called["properties"]["$feature_flag_evaluated_at"].clone(),
        answered[0].clone(),
    )
}

fn run_host(package: &str) -> (Server, Value) {
    let dir = sdk_dir().join("node/node_modules").join(package);
    require(package, &[&dir]);
    let server = Server::start();
    write_atomically(&server.data().join("flags/1.json"), rules().to_string());
    server.sighup();
    wait_for("the flags to load", || {
        let body = json!({"token": KEY_ONE, "distinct_id": "x"}).to_string();
        let r = server.post("/decide/?v=3", body);
        r.json()["featureFlags"].get("needs-base").map(|_| ())
    });
    let host = format!("http://{}", server.addr);
    let summary = run(
        Path::new("node"),
        &["node/host.mjs", package, &host, KEY_ONE, PERSONAL_ONE],
    );
    eprintln!("{package} {}", summary["version"]);
    (server, summary)
}

/// A flag that is missing or not a remote config flag gets PostHog's empty 404, so
/// `getRemoteConfigPayload` throws rather than handing the app a body as the
/// configuration.
fn assert_refused(summary: &Value) {
    for name in ["payload_missing", "payload_plain"] {
        let outcome = &summary[name];
        assert!(
            outcome["threw"].is_string() && outcome.get("returned").is_none(),
            "{name}: {outcome}"
        );
    }
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_node_4_remote_config_payload_and_feed() {
    let (server, s) = run_host("posthog-node-v4");
    // 4.x asks /decide?v=3, which says evaluatedAt too, but predates the property.
    let (property, answered) = evaluated_at(&server, &s);
    assert!(answered.is_i64(), "{answered}");
    assert_eq!(property, Value::Null);
    // 4.x asks for the payload without the project key and hands over the JSON
    // answer as it is: the payload's text.
    assert_eq!(s["payload"], "{\"theme\": \"dark\"}");
    assert_refused(&s);
    let paths: Vec<&Value> = array(&s["payload_requests"])
        .iter()
        .map(|r| &r["path"])
        .collect();
    assert_eq!(
        paths,
        [
            "/api/projects/@current/feature_flags/settings/remote_config/",
            "/api/projects/@current/feature_flags/no-such-flag/remote_config/",
            "/api/projects/@current/feature_flags/base/remote_config/"
        ]
    );
    // 4.x knows no flag dependencies: it cannot evaluate one locally and asks /decide.
    assert_eq!(s["dependency_local"], Value::Null);
    assert_eq!(s["dependency"], true);
    assert_eq!(s["dependency_paths"], json!(["/decide/"]));
    // Nor ETags: it downloads the feed on every poll (one at start, then the two the
    // script asks for), and gets it whole.
    let feed = array(&s["feed"]);
    assert_eq!(feed.len(), 3, "{feed:?}");
    for poll in feed {
        assert_eq!(poll["path"], "/api/feature_flag/local_evaluation");
        assert_eq!(
            (&poll["if_none_match"], &poll["status"]),
            (&Value::Null, &json!(200))
        );
    }
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_node_5_remote_config_payload_dependency_and_etag() {
    let (server, s) = run_host("posthog-node");
    let (property, answered) = evaluated_at(&server, &s);
    assert!(answered.is_i64(), "{answered}");
    assert_eq!(
        property, answered,
        "$feature_flag_evaluated_at is the server's"
    );
    // 5.x sends the project key and parses the payload's text.
    assert_eq!(s["payload"], json!({"theme": "dark"}));
    assert_refused(&s);
    let requests = array(&s["payload_requests"]);
    assert_eq!(
        requests[0],
        json!({"method": "GET", "path": "/api/projects/@current/feature_flags/settings/remote_config",
               "query": format!("token={KEY_ONE}"), "status": 200})
    );
    assert_eq!(requests.len(), 3, "{requests:?}");
    assert_eq!(
        (&requests[1]["status"], &requests[2]["status"]),
        (&json!(404), &json!(404))
    );
    // The feed's dependency chains let it evaluate dependent flags itself.
    assert_eq!(s["dependency_local"], true);
    assert_eq!(s["dependency_local_off"], false);
    assert_eq!(s["dependency_local_paths"], json!([]));
    assert_eq!(s["dependency"], true);
    assert_eq!(s["dependency_paths"], json!([]), "no server round trip");
    // The second poll sends the ETag and gets 304.
    let feed = array(&s["feed"]);
    assert_eq!(feed.len(), 2, "{feed:?}");
    let etag = feed[0]["etag"].as_str().expect("an ETag");
    assert_eq!(
        (&feed[0]["if_none_match"], &feed[0]["status"]),
        (&Value::Null, &json!(200))
    );
    assert_eq!(
        feed[1],
        json!({"path": "/flags/definitions", "if_none_match": etag, "status": 304, "etag": etag})
    );
}
