//! posthog-js in Chromium and posthog-node, unchanged, pointed at an edge that forwards
//! to a flagpost upstream (and syncs its flags from it): they get their flags from the
//! edge, and upstream ends up storing exactly the events that went over the wire to
//! the edge, with the persons and groups they imply, as if the clients had sent them
//! there. The same scripts and checks as `sdk/`, with the edge in between.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{json, Value};

use super::metric;
use crate::edge::sync;
use crate::sdk::{
    app_events, array, group_properties, js_events_stored, js_flags_identified, merged_person,
    requests_made, require, rules, run, sdk_dir, stored_exactly_what_was_sent,
};
use crate::util::*;

/// A flagpost upstream with the SDK tests' flags, and an edge synced from it.
fn edge_and_upstream() -> (Server, Server) {
    let upstream = sync::upstream();
    write_atomically(&upstream.data().join("flags/1.json"), rules().to_string());
    upstream.sighup();
    let edge = sync::edge(&format!("http://{}", upstream.addr), &[]);
    sync::wait_for_flag(&edge, "checkout", json!("test"));
    (upstream, edge)
}

/// Wait until upstream has every event the edge took so far: a marker captured at
/// the edge now is compacted after them and forwarded after them (the forwarder
/// keeps the outbox's order), so once upstream stores it, they are there. It is
/// named as `Server::settle`'s markers are, so the checks leave it out likewise.
fn drained(edge: &Server, upstream: &Server) {
    let marker = uuid::Uuid::now_v7().to_string();
    let body =
        json!({"api_key": KEY_ONE, "event": "settle", "distinct_id": "settle", "uuid": marker});
    assert_eq!(edge.post("/capture/", body.to_string()).status, 200);
    wait_for("the edge's marker upstream", || {
        let stored = upstream.stored_events(1);
        stored
            .iter()
            .any(|e| e["id"] == marker.as_str())
            .then_some(())
    });
    assert!(
        metric(
            edge,
            "flagpost_upstream_requests_total{endpoint=\"batch\",status=\"200\"}"
        ) > 0.0
    );
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_node_through_the_edge() {
    let dir = sdk_dir().join("node/node_modules/posthog-node");
    require("posthog-node", &[&dir]);
    let (upstream, edge) = edge_and_upstream();
    let host = format!("http://{}", edge.addr);
    let prefix = "edge-node";
    let summary = run(
        Path::new("node"),
        &[
            "node/client.mjs",
            "posthog-node",
            &host,
            KEY_ONE,
            PERSONAL_ONE,
            prefix,
        ],
    );
    eprintln!("posthog-node {} through the edge", summary["version"]);
    let requests = array(&summary["requests"]);
    let made: BTreeSet<String> = requests_made(&edge, requests).into_iter().collect();
    let expected = [
        "GET /flags/definitions?token=phc_test_one&send_cohorts",
        "POST /batch/",
        "POST /flags/?v=2",
    ];
    assert_eq!(made, expected.iter().map(|s| s.to_string()).collect());
    assert_eq!(
        summary["remote"],
        json!({
            "always-on": true, "never": false, "pro-only": true, "pro-only stranger": false,
            "checkout": "test", "checkout payload": {"color": "green"},
            "always-on payload": {"tier": 1}, "big-orgs": true,
            "all": {"always-on": true, "never": false, "pro-only": true, "checkout": "test", "big-orgs": false}
        }),
        "remote evaluation at the edge"
    );
    assert_eq!(
        summary["local"]["all"],
        json!({"always-on": true, "never": false, "pro-only": true, "checkout": "test", "big-orgs": true}),
        "local evaluation from the edge's feed"
    );

    drained(&edge, &upstream);
    let stored = stored_exactly_what_was_sent(&upstream, requests);
    assert_eq!(
        app_events(&stored, &[]),
        [
            "$create_alias",
            "$groupidentify",
            "$identify",
            "gzipped",
            "order placed",
            "signed up"
        ]
    );
    let ids = &summary["ids"];
    let order = stored
        .iter()
        .find(|e| e["id"] == ids["order placed"])
        .unwrap();
    assert_eq!(order["properties"]["amount"], 30);
    let (user, anon) = (format!("{prefix}-user"), format!("{prefix}-anon"));
    let person = merged_person(&upstream, &anon, &user);
    assert_eq!(
        person["properties"].as_object().unwrap().len(),
        2,
        "{person}"
    );
    assert_eq!(
        group_properties(&upstream, &format!("{prefix}-acme")),
        json!({"seats": 50, "name": "Acme"})
    );
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_js_in_chromium_through_the_edge() {
    let modules = sdk_dir().join("node/node_modules");
    let deps = [
        Path::new("/usr/bin/chromium"),
        &modules.join("playwright-core"),
        &modules.join("posthog-js"),
    ];
    require("posthog-js", &deps);
    let (upstream, edge) = edge_and_upstream();
    let host = format!("http://{}", edge.addr);
    let summary = run(
        Path::new("node"),
        &["browser/run.mjs", &host, KEY_ONE, "edge-js"],
    );
    eprintln!(
        "posthog-js {} in Chromium {} through the edge",
        summary["version"], summary["chromium"]
    );
    let mut all_requests: Vec<Value> = Vec::new();
    for mode in ["gzip", "base64"] {
        let visit = &summary["visits"][mode];
        assert_eq!(visit["blocked"], json!([]), "requests off loopback");
        let requests = array(&visit["requests"]);
        // Every request went to the edge and was answered 200.
        let made = requests_made(&edge, requests);
        assert!(
            made.iter().any(|r| r.starts_with("POST /flags/")),
            "{made:?}"
        );
        assert_eq!(visit["flags"], js_flags_identified(), "{mode}");
        all_requests.extend(requests.iter().cloned());
    }

    drained(&edge, &upstream);
    let stored = stored_exactly_what_was_sent(&upstream, &all_requests);
    assert_eq!(app_events(&stored, &[]), js_events_stored());
    for mode in ["gzip", "base64"] {
        let visit = &summary["visits"][mode];
        let (anon, user) = (
            visit["anon"].as_str().unwrap(),
            visit["user"].as_str().unwrap(),
        );
        let click = stored
            .iter()
            .find(|e| e["id"] == visit["ids"]["clicked buy"])
            .unwrap();
        assert_eq!(
            (&click["distinct_id"], &click["properties"]["color"]),
            (&json!(anon), &json!("blue"))
        );
        // The edge resolved the browser's address into each event.
        assert_eq!(click["properties"]["$ip"], "127.0.0.1");
        merged_person(&upstream, anon, user);
        assert_eq!(
            group_properties(&upstream, visit["company"].as_str().unwrap()),
            json!({"seats": 50, "name": "Acme"})
        );
    }
}
