//! posthog-node and posthog-python, unchanged, evaluating locally with a project secret
//! key (`phs_`) from a server's definitions feed: the rules they are given, what they
//! must answer, and one run of each SDK checked. Used against a plain server
//! (`security/keys.rs`) and against an edge serving synced rules (`edge/sync/sdk.rs`).

use std::path::Path;

use serde_json::{json, Value};

use super::{require, run, sdk_dir};

/// Flags with exact answers, to tell a locally evaluated answer from none.
pub fn rules() -> Value {
    json!({"flags": [
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
    ], "group_type_mapping": {}, "cohorts": {}})
}

fn expected() -> Value {
    json!({"always-on": true, "never": false, "pro-only": true, "checkout": "test"})
}

/// posthog-python 7 against `host` with project key `token` and `secret` evaluates
/// every flag of [`rules`] locally, having loaded all of them.
pub fn python_evaluates_locally(host: &str, token: &str, secret: &str) {
    let python = sdk_dir().join(".deps/py7/bin/python");
    require("posthog-python 7.x", &[&python]);
    let summary = run(&python, &["python/secret_key.py", host, token, secret]);
    eprintln!("posthog-python {}", summary["version"]);
    assert_eq!(summary["flags"], expected(), "{summary}");
    assert_eq!(
        summary["loaded"],
        json!(["always-on", "never", "pro-only", "checkout"])
    );
}

/// posthog-node against `host` with project key `token` and `secret` evaluates every
/// flag of [`rules`] locally: it asked only the feed, with the secret key.
pub fn node_evaluates_locally(host: &str, token: &str, secret: &str) {
    let dir = sdk_dir().join("node/node_modules/posthog-node");
    require("posthog-node", &[&dir]);
    let summary = run(
        Path::new("node"),
        &["node/secret_key.mjs", host, token, secret],
    );
    eprintln!("posthog-node {}", summary["version"]);
    assert_eq!(summary["flags"], expected(), "{summary}");
    let requests = summary["requests"].as_array().unwrap();
    assert!(!requests.is_empty());
    for r in requests {
        assert_eq!(r["path"], "/flags/definitions", "{r}");
        assert_eq!(r["authorization"], format!("Bearer {secret}"), "{r}");
        assert_eq!(r["status"], 200, "{r}");
    }
}
