//! posthog-node and posthog-python, unchanged, evaluating locally from the edge's own
//! definitions feed: the edge syncs a flagpost upstream's rules once and serves them to
//! any number of SDK instances with its own secret key, so they cost upstream nothing.

use std::path::Path;

use serde_json::{json, Value};

use super::{data_dir_with, upstream, wait_for_flag, SECRET};
use crate::sdk::{require, run, sdk_dir};
use crate::util::*;

/// The edge project's own secret key, which the SDKs are given.
const EDGE_SECRET: &str = "phs_edge_own_secret_for_sdks";

fn rules() -> Value {
    json!({
        "flags": [
            {"id": 1, "key": "always-on", "active": true,
             "filters": {"groups": [{"properties": [], "rollout_percentage": 100}]}},
            {"id": 2, "key": "never", "active": true,
             "filters": {"groups": [{"properties": [], "rollout_percentage": 0}]}},
            {"id": 3, "key": "pro-only", "active": true,
             "filters": {"groups": [{"properties": [{"key": "plan", "value": ["pro"], "operator": "exact", "type": "person"}],
                                     "rollout_percentage": 100}]}},
            {"id": 4, "key": "checkout", "active": true,
             "filters": {"groups": [{"properties": [], "rollout_percentage": 100}],
                         "multivariate": {"variants": [{"key": "control", "rollout_percentage": 0},
                                                       {"key": "test", "rollout_percentage": 100}]}}}
        ],
        "group_type_mapping": {},
        "cohorts": {}
    })
}

/// An upstream with the rules, and an edge synced from it whose project 1 also has a
/// secret key of its own.
fn synced() -> (Server, Server) {
    let up = upstream();
    write_atomically(&up.data().join("flags/1.json"), rules().to_string());
    up.sighup();
    let tmp = tempfile::tempdir().unwrap();
    data_dir_with(
        tmp.path(),
        &format!(r#""upstream_secret_key": "{SECRET}", "secret_api_keys": ["{EDGE_SECRET}"]"#),
    );
    let url = format!("http://{}", up.addr);
    let mut edge = Server::spawn(tmp.path(), &["--upstream", &url, "--upstream-poll", "1"]);
    edge.keep(tmp);
    wait_for_flag(&edge, "checkout", json!("test"));
    (up, edge)
}

fn expected() -> Value {
    json!({"always-on": true, "never": false, "pro-only": true, "checkout": "test"})
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_node_evaluates_locally_from_the_edges_feed() {
    let dir = sdk_dir().join("node/node_modules/posthog-node");
    require("posthog-node", &[&dir]);
    let (_up, edge) = synced();
    let host = format!("http://{}", edge.addr);
    let summary = run(
        Path::new("node"),
        &["node/secret_key.mjs", &host, KEY_ONE, EDGE_SECRET],
    );
    eprintln!("posthog-node {}", summary["version"]);
    assert_eq!(summary["flags"], expected(), "{summary}");
    let requests = summary["requests"].as_array().unwrap();
    assert!(!requests.is_empty());
    for r in requests {
        assert_eq!(r["path"], "/flags/definitions", "{r}");
        assert_eq!(r["status"], 200, "{r}");
    }
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_python_evaluates_locally_from_the_edges_feed() {
    let python = sdk_dir().join(".deps/py7/bin/python");
    require("posthog-python 7.x", &[&python]);
    let (_up, edge) = synced();
    let host = format!("http://{}", edge.addr);
    let summary = run(
        &python,
        &["python/secret_key.py", &host, KEY_ONE, EDGE_SECRET],
    );
    eprintln!("posthog-python {}", summary["version"]);
    assert_eq!(summary["flags"], expected(), "{summary}");
    assert_eq!(
        summary["loaded"],
        json!(["always-on", "never", "pro-only", "checkout"])
    );
}
