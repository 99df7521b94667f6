//! posthog-python (3.x on `/decide/?v=3`, 7.x on `/flags/?v=4`) and posthog-node (4.x
//! on `/decide/?v=3`, 5.x on `/flags/?v=2`): capture, identify, alias, group identify,
//! batches with and without gzip, flags remotely and locally from the definitions feed.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{json, Value};

use super::*;
use crate::util::*;

/// What a server-side client is expected to do.
struct Expect {
    /// Every request it makes, as "METHOD /path?query".
    requests: &'static [&'static str],
    /// The `Content-Encoding` of its batches.
    encodings: &'static [Option<&'static str>],
    /// Its events besides `$feature_flag_called`, sorted by name.
    events: &'static [&'static str],
    /// Payloads as this version returns them: parsed, or the JSON text as stored.
    parses_payloads: bool,
    /// Flags whose `$feature_flag_called` it sends without a value ([`app_events`]).
    valueless: &'static [&'static str],
}

/// The flags the clients look up payloads of (`client.py`, `client.mjs`): versions that
/// do not evaluate a flag for its payload report it without a value.
const PAYLOAD_LOOKUPS: &[&str] = &["always-on", "checkout"];

fn server_side(summary: &Value, server: &Server, prefix: &str, expect: Expect) {
    let (user, anon) = (format!("{prefix}-user"), format!("{prefix}-anon"));
    let requests = array(&summary["requests"]);
    let made: BTreeSet<String> = requests_made(server, requests).into_iter().collect();
    assert_eq!(
        made,
        expect.requests.iter().map(|s| s.to_string()).collect(),
        "requests"
    );
    let encodings: BTreeSet<Option<&str>> = requests
        .iter()
        .filter(|r| r["path"] == "/batch/")
        .map(|r| r["content_encoding"].as_str())
        .collect();
    assert_eq!(encodings, expect.encodings.iter().copied().collect());

    // Flags: remotely with stored person and group properties, then locally.
    let payload = |text: &str| {
        if expect.parses_payloads {
            serde_json::from_str(text).unwrap()
        } else {
            json!(text)
        }
    };
    assert_eq!(
        summary["remote"],
        json!({
            "always-on": true, "never": false, "pro-only": true, "pro-only stranger": false,
            "checkout": "test", "checkout payload": payload("{\"color\": \"green\"}"),
            "always-on payload": payload("{\"tier\": 1}"), "big-orgs": true,
            "all": {"always-on": true, "never": false, "pro-only": true, "checkout": "test", "big-orgs": false}
        }),
        "remote evaluation"
    );
    assert_eq!(
        summary["local"],
        json!({
            "always-on": true, "never": false, "pro-only": true, "pro-only free": false,
            "checkout": "test", "checkout payload": payload("{\"color\": \"green\"}"),
            "big-orgs": true,
            "all": {"always-on": true, "never": false, "pro-only": true, "checkout": "test", "big-orgs": true}
        }),
        "local evaluation"
    );
    let remote_paths = array(&summary["remote_paths"]);
    assert_eq!(
        remote_paths.len(),
        1,
        "one flags endpoint: {remote_paths:?}"
    );
    assert!(
        array(&summary["local_paths"])
            .iter()
            .all(|p| p == "/batch/"),
        "local evaluation asked the server: {}",
        summary["local_paths"]
    );

    // Events, persons, groups.
    let stored = stored_exactly_what_was_sent(server, requests);
    assert_eq!(app_events(&stored, expect.valueless), expect.events);
    let ids = &summary["ids"];
    let signed_up = event(&stored, &ids["signed up"]);
    assert_eq!(
        (&signed_up["event"], &signed_up["distinct_id"]),
        (&json!("signed up"), &json!(anon))
    );
    assert_eq!(signed_up["properties"]["step"], 1);
    let company = format!("{prefix}-acme");
    let order = event(&stored, &ids["order placed"]);
    assert_eq!(order["properties"]["$groups"], json!({"company": company}));
    assert_eq!(order["properties"]["amount"], 30);
    assert_eq!(event(&stored, &ids["gzipped"])["properties"]["n"], 2);
    let person = merged_person(server, &anon, &user);
    let props = person["properties"].as_object().unwrap();
    assert_eq!(props.len(), 2, "only what the client set: {person}");
    for e in stored
        .iter()
        .filter(|e| e["distinct_id"] == user.as_str() || e["distinct_id"] == anon.as_str())
    {
        assert_eq!(e["person_id"], person["id"], "{e}");
    }
    assert_eq!(
        group_properties(server, &company),
        json!({"seats": 50, "name": "Acme"})
    );
}

fn python(line: u8, expect: Expect) {
    let python = sdk_dir().join(format!(".deps/py{line}/bin/python"));
    require(&format!("posthog-python {line}.x"), &[&python]);
    let server = start();
    let host = format!("http://{}", server.addr);
    let prefix = format!("py{line}");
    let summary = run(
        &python,
        &["python/client.py", &host, KEY_ONE, PERSONAL_ONE, &prefix],
    );
    assert_eq!(summary["sdk"], "posthog-python");
    eprintln!("posthog-python {}", summary["version"]);
    server_side(&summary, &server, &prefix, expect);
}

fn node(package: &str, expect: Expect) {
    let dir = sdk_dir().join("node/node_modules").join(package);
    require(package, &[&dir]);
    let server = start();
    let host = format!("http://{}", server.addr);
    let summary = run(
        Path::new("node"),
        &[
            "node/client.mjs",
            package,
            &host,
            KEY_ONE,
            PERSONAL_ONE,
            package,
        ],
    );
    assert_eq!(summary["sdk"], "posthog-node");
    eprintln!("{package} {}", summary["version"]);
    server_side(&summary, &server, package, expect);
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_python_3_decide_v3() {
    python(
        3,
        Expect {
            requests: &[
                "GET /api/feature_flag/local_evaluation/?token=phc_test_one&send_cohorts",
                "POST /batch/",
                "POST /decide/?v=3",
            ],
            encodings: &[None, Some("gzip")],
            events: &[
                "$create_alias",
                "$groupidentify",
                "$identify",
                "$set",
                "gzipped",
                "order placed",
                "signed up",
            ],
            parses_payloads: false,
            valueless: PAYLOAD_LOOKUPS,
        },
    );
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_python_7_flags_v4() {
    python(
        7,
        Expect {
            requests: &[
                "GET /flags/definitions?token=phc_test_one&send_cohorts",
                "POST /batch/",
                "POST /flags/?v=4",
            ],
            encodings: &[None, Some("gzip")],
            events: &[
                "$create_alias",
                "$groupidentify",
                "$set",
                "gzipped",
                "order placed",
                "signed up",
            ],
            parses_payloads: true,
            valueless: &[],
        },
    );
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_node_4_decide_v3() {
    node(
        "posthog-node-v4",
        Expect {
            requests: &[
                "GET /api/feature_flag/local_evaluation?token=phc_test_one&send_cohorts",
                "POST /batch/",
                "POST /decide/?v=3",
            ],
            // posthog-node 4 never compresses.
            encodings: &[None],
            events: &[
                "$create_alias",
                "$groupidentify",
                "$identify",
                "gzipped",
                "order placed",
                "signed up",
            ],
            parses_payloads: true,
            valueless: PAYLOAD_LOOKUPS,
        },
    );
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_node_5_flags_v2() {
    node(
        "posthog-node",
        Expect {
            requests: &[
                "GET /flags/definitions?token=phc_test_one&send_cohorts",
                "POST /batch/",
                "POST /flags/?v=2",
            ],
            encodings: &[None, Some("gzip")],
            events: &[
                "$create_alias",
                "$groupidentify",
                "$identify",
                "gzipped",
                "order placed",
                "signed up",
            ],
            parses_payloads: true,
            valueless: &[],
        },
    );
}
