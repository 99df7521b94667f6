//! posthog-node and posthog-python, unchanged, evaluating locally from the edge's own
//! definitions feed: the edge syncs a flagpost upstream's rules once and serves them to
//! any number of SDK instances with its own secret key, so they cost upstream nothing.

use serde_json::json;

use super::{edge_with, synced_key, upstream, wait_for_flag};
use crate::sdk::secret_key;
use crate::util::*;

/// The edge project's own secret key, which the SDKs are given.
const EDGE_SECRET: &str = "phs_edge_own_secret_for_sdks";

/// An upstream with [`secret_key::rules`], and an edge synced from it whose project 1
/// also has a secret key of its own; the edge's address.
fn synced() -> (Server, Server, String) {
    let up = upstream();
    write_atomically(
        &up.data().join("flags/1.json"),
        secret_key::rules().to_string(),
    );
    up.sighup();
    let extra = format!(r#"{}, "secret_api_keys": ["{EDGE_SECRET}"]"#, synced_key());
    let edge = edge_with(&format!("http://{}", up.addr), &extra, &[]);
    wait_for_flag(&edge, "checkout", json!("test"));
    let host = format!("http://{}", edge.addr);
    (up, edge, host)
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_node_evaluates_locally_from_the_edges_feed() {
    let (_up, _edge, host) = synced();
    secret_key::node_evaluates_locally(&host, KEY_ONE, EDGE_SECRET);
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_python_evaluates_locally_from_the_edges_feed() {
    let (_up, _edge, host) = synced();
    secret_key::python_evaluates_locally(&host, KEY_ONE, EDGE_SECRET);
}
