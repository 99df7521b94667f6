//! Edge mode's flag sync over loopback: a second flagpost as the upstream (its
//! management API changes a flag, its feed serves it with ETags and 304s) and an edge
//! in front of it polling every second; a scripted fake for the answers a flagpost
//! upstream never gives (`sync/scripted.rs`); nginx with TLS in front of the upstream
//! (`sync/tls.rs`); and the server SDKs evaluating locally from the edge's own feed
//! (`sync/sdk.rs`).

mod fake;
mod scripted;
mod sdk;
mod tls;

use std::path::Path;

use serde_json::{json, Value};

use crate::manage::call;
use crate::util::*;

/// Upstream's project secret key (PostHog's feature flags secure API key) for project 1,
/// which the edge is given as `upstream_secret_key`.
pub const SECRET: &str = "phs_edge_sync_test_secret";

/// A flag on for everyone, as the management API takes it.
pub fn everyone(key: &str, rollout: u32) -> Value {
    json!({"key": key, "filters": {"groups": [{"properties": [], "rollout_percentage": rollout}]}})
}

/// Write `root/data` for a server whose project 1 (`KEY_ONE`, `PERSONAL_ONE`) has
/// `extra` members (its secret key upstream, its upstream key at the edge). A flag file
/// is left for project 1, which a synced edge must ignore.
pub fn data_dir_with(root: &Path, extra: &str) {
    fill_data_dir(root);
    std::fs::write(root.join("data/projects.json"), projects_json(extra)).unwrap();
    std::fs::write(
        root.join("data/flags/1.json"),
        json!({"flags": [{"id": 9, "key": "from-the-file", "active": true,
            "filters": {"groups": [{"properties": [], "rollout_percentage": 100}]}}],
            "group_type_mapping": {}, "cohorts": {}})
        .to_string(),
    )
    .unwrap();
}

/// `projects.json` with `extra` members (none when empty) on project 1.
pub fn projects_json(extra: &str) -> String {
    let extra = if extra.is_empty() {
        String::new()
    } else {
        format!(", {extra}")
    };
    format!(
        r#"{{"projects": [
            {{"id": 1, "name": "one", "api_key": "{KEY_ONE}", "personal_api_keys": ["{PERSONAL_ONE}"]{extra}}},
            {{"id": 2, "name": "two", "api_key": "{KEY_TWO}", "personal_api_keys": ["{PERSONAL_TWO}"]}}
        ]}}"#
    )
}

/// A flagpost upstream whose project 1 reads its feed with [`SECRET`].
pub fn upstream() -> Server {
    let tmp = tempfile::tempdir().unwrap();
    data_dir_with(tmp.path(), &format!(r#""secret_api_keys": ["{SECRET}"]"#));
    // Upstream's flags are what its management API makes.
    std::fs::write(tmp.path().join("data/flags/1.json"), EMPTY).unwrap();
    let mut server = Server::spawn(tmp.path(), &[]);
    server.keep(tmp);
    server
}

const EMPTY: &str = r#"{"flags": [], "group_type_mapping": {}, "cohorts": {}}"#;

/// Project 1's members at an edge that syncs it with [`SECRET`].
pub fn synced_key() -> String {
    format!(r#""upstream_secret_key": "{SECRET}""#)
}

/// An edge in front of `url` polling every second, its project 1 synced with [`SECRET`].
pub fn edge(url: &str, env: &[(&str, &std::ffi::OsStr)]) -> Server {
    edge_with(url, &synced_key(), env)
}

/// An edge in front of `url` polling every second, its project 1 given `extra` members.
pub fn edge_with(url: &str, extra: &str, env: &[(&str, &std::ffi::OsStr)]) -> Server {
    let tmp = tempfile::tempdir().unwrap();
    data_dir_with(tmp.path(), extra);
    let mut server = Server::spawn_env(
        tmp.path(),
        &["--upstream", url, "--upstream-poll", "1"],
        env,
    );
    server.keep(tmp);
    server
}

/// An [`upstream`] whose project 1 has `key` on for everyone, made through its
/// management API; the flag's id.
pub fn upstream_with(key: &str) -> (Server, i64) {
    let up = upstream();
    let flag = call(
        &up,
        "POST",
        "/api/projects/1/feature_flags/",
        PERSONAL_ONE,
        Some(everyone(key, 100)),
    );
    assert_eq!(flag.status, 201, "{}", flag.text());
    let id = flag.json()["id"].as_i64().unwrap();
    (up, id)
}

/// An [`upstream_with`] `beta`, and an [`edge`] in front of it serving it.
pub fn synced_pair() -> (Server, Server, i64) {
    let (up, id) = upstream_with("beta");
    let edge = edge(&format!("http://{}", up.addr), &[]);
    wait_for_flag(&edge, "beta", json!(true));
    (up, edge, id)
}

/// The health page's entry for project 1's flag sync, read through the console.
pub fn flag_sync_health(edge: &Server) -> Value {
    let session = crate::console::sign_in(edge, PERSONAL_ONE);
    let health = crate::console::signed_call(edge, &session, "GET", "/console/api/health", None);
    assert_eq!(health.status, 200, "{}", health.text());
    health.json()["upstream"]["flag_sync"][0].clone()
}

/// What `/decide` answers at `server` for `distinct_id` in project 1.
pub fn decide(server: &Server, distinct_id: &str) -> Value {
    let body = json!({"api_key": KEY_ONE, "distinct_id": distinct_id});
    let r = server.post("/decide/?v=3", body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// Wait until `/decide` at `server` gives `key` the value `want`.
pub fn wait_for_flag(server: &Server, key: &str, want: Value) -> Value {
    wait_for(&format!("{key} = {want} at {}", server.addr), || {
        let d = decide(server, "ada");
        (d["featureFlags"][key] == want).then_some(d)
    })
}

/// A sample's value in `/metrics`, by its whole name with labels; 0 when absent.
pub fn metric(server: &Server, sample: &str) -> f64 {
    let text = server.get("/metrics").text();
    text.lines()
        .find_map(|l| {
            l.strip_prefix(sample)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

#[test]
fn the_edge_serves_upstreams_rules_and_follows_their_changes() {
    let (up, edge, id) = synced_pair();

    // Upstream's rules, not the edge's own file, answer /decide.
    let d = decide(&edge, "ada");
    assert!(d["featureFlags"].get("from-the-file").is_none(), "{d}");
    assert!(edge.log().contains("flag file ignored"), "{}", edge.log());

    // A change upstream reaches the edge (polled every second).
    let r = call(
        &up,
        "PATCH",
        &format!("/api/projects/1/feature_flags/{id}/"),
        PERSONAL_ONE,
        Some(everyone("beta", 0)),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    wait_for_flag(&edge, "beta", json!(false));

    // Unchanged polls are 304s, each answered against the stored ETag.
    let not_modified =
        r#"flagpost_upstream_requests_total{endpoint="flags_definitions",status="304"}"#;
    wait_for("304s from upstream", || {
        (metric(&edge, not_modified) >= 2.0).then_some(())
    });
    assert!(
        metric(
            &edge,
            r#"flagpost_upstream_requests_total{endpoint="flags_definitions",status="200"}"#
        ) >= 2.0
    );
    let age = metric(
        &edge,
        r#"flagpost_upstream_definitions_age_seconds{project="1"}"#,
    );
    assert!((0.0..30.0).contains(&age), "{age}");

    // The edge's own feed serves the synced rules, with its own ETag and 304s.
    let feed = edge.request(
        Req::get("/flags/definitions?token=phc_test_one&send_cohorts")
            .header("Authorization", &format!("Bearer {PERSONAL_ONE}")),
    );
    assert_eq!(feed.status, 200, "{}", feed.text());
    let keys: Vec<Value> = feed.json()["flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["key"].clone())
        .collect();
    assert_eq!(keys, vec![json!("beta")]);
    let etag = feed.header("etag").unwrap().to_string();
    let again = edge.request(
        Req::get("/flags/definitions?token=phc_test_one&send_cohorts")
            .header("Authorization", &format!("Bearer {PERSONAL_ONE}"))
            .header("If-None-Match", &etag),
    );
    assert_eq!(again.status, 304);

    // Reads through the management API show the synced flags; writes are refused,
    // naming the upstream.
    let list = call(
        &edge,
        "GET",
        "/api/projects/1/feature_flags/",
        PERSONAL_ONE,
        None,
    );
    assert_eq!(list.status, 200, "{}", list.text());
    assert_eq!(list.json()["results"][0]["key"], "beta");
    let upstream_url = format!("http://{}", up.addr);
    for (method, path, body) in [
        (
            "POST",
            "/api/projects/1/feature_flags/".to_string(),
            everyone("new", 100),
        ),
        (
            "PATCH",
            format!("/api/projects/1/feature_flags/{id}/"),
            json!({"active": false}),
        ),
        (
            "POST",
            "/api/projects/1/cohorts/".to_string(),
            json!({"name": "c", "groups": []}),
        ),
    ] {
        let r = call(&edge, method, &path, PERSONAL_ONE, Some(body));
        assert_eq!(r.status, 409, "{method} {path}: {}", r.text());
        let detail = r.json()["detail"].as_str().unwrap().to_string();
        assert!(
            detail.contains(&upstream_url) && detail.contains("change them there"),
            "{detail}"
        );
    }
    // Project 2 has no upstream key: its flags stay its own to change.
    let r = call(
        &edge,
        "POST",
        "/api/projects/2/feature_flags/",
        PERSONAL_TWO,
        Some(everyone("mine", 100)),
    );
    assert_eq!(r.status, 201, "{}", r.text());
}

#[test]
fn an_edge_restarted_while_upstream_is_down_serves_the_rules_on_disk() {
    let (mut up, edge, _) = synced_pair();
    let stored = edge.dir.join("db/upstream/1");
    // Kept on disk right after it is published.
    let etag = wait_for("the stored ETag", || {
        std::fs::read_to_string(stored.join("etag")).ok()
    });
    let body: Value =
        serde_json::from_slice(&std::fs::read(stored.join("definitions.json")).unwrap()).unwrap();
    assert_eq!(body["flags"][0]["key"], "beta");

    up.stop();
    let edge = edge.restart_hard();
    // Served from the first request on: the stored answer is installed before serving.
    let d = decide(&edge, "ada");
    assert_eq!(d["featureFlags"]["beta"], json!(true), "{d}");
    assert_eq!(edge.get("/_readiness").status, 200);
    // Upstream stays down: the failures are counted, the rules stay.
    wait_for("a refused poll", || {
        (metric(
            &edge,
            r#"flagpost_upstream_requests_total{endpoint="flags_definitions",status="refused"}"#,
        ) >= 1.0)
            .then_some(())
    });
    assert_eq!(decide(&edge, "ada")["featureFlags"]["beta"], json!(true));
    assert_eq!(edge.get("/_readiness").status, 200);
    assert_eq!(std::fs::read_to_string(stored.join("etag")).unwrap(), etag);
}

#[test]
fn the_console_shows_synced_flags_read_only_and_the_sync_on_its_health_page() {
    let (up, edge, _) = synced_pair();
    let url = format!("http://{}", up.addr);
    let session = crate::console::sign_in(&edge, PERSONAL_ONE);
    let console = |method: &str, path: &str, body: Option<Value>| {
        crate::console::signed_call(&edge, &session, method, path, body)
    };
    let described = console("GET", "/console/api/session", None).json();
    assert_eq!(described["project"]["synced_from"], json!(url));
    let list = console("GET", "/console/api/feature_flags/", None);
    assert_eq!(list.json()["results"][0]["key"], "beta");
    let refused = console(
        "PATCH",
        "/console/api/feature_flags/1/",
        Some(json!({"active": false})),
    );
    assert_eq!(refused.status, 409, "{}", refused.text());
    assert!(refused.json()["detail"].as_str().unwrap().contains(&url));

    // The health page: the last answer, the last success, the age, the ETag.
    let sync = wait_for("a conditional poll on the health page", || {
        let health = console("GET", "/console/api/health", None).json();
        let sync = health["upstream"]["flag_sync"][0].clone();
        (sync["last_status"] == "304").then_some((health, sync))
    });
    let (health, sync) = sync;
    assert_eq!(health["upstream"]["url"], json!(url));
    assert_eq!(sync["project"], 1);
    assert_eq!(sync["endpoint"], "flags_definitions");
    assert_eq!(sync["failures_in_a_row"], 0);
    assert_eq!(sync["serving"], "upstream");
    assert!(
        sync["last_success"].as_u64().is_some() && sync["age_seconds"].as_u64().is_some(),
        "{sync}"
    );
    let stored = std::fs::read_to_string(edge.dir.join("db/upstream/1/etag")).unwrap();
    assert_eq!(sync["etag"], json!(stored));
}

#[test]
fn a_project_loses_its_sync_when_its_upstream_key_leaves_projects_json() {
    let (_up, edge, _) = synced_pair();
    // No upstream key: the project's own flag file serves again, and writes are allowed.
    write_atomically(&edge.data().join("projects.json"), projects_json(""));
    // (`beta` may still come back, asked of upstream's /flags as a key the file lacks.)
    wait_for_flag(&edge, "from-the-file", json!(true));
    // Logged before the file's rules are published, but the server's output reaches
    // the test through a reader thread, which may not have passed it on yet.
    wait_for("the log to say the sync stopped", || {
        edge.log().contains("flag sync stopped").then_some(())
    });
    let r = call(
        &edge,
        "POST",
        "/api/projects/1/feature_flags/",
        PERSONAL_ONE,
        Some(everyone("mine", 100)),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    // And back: the key again syncs it again.
    write_atomically(
        &edge.data().join("projects.json"),
        projects_json(&synced_key()),
    );
    wait_for("the synced rules in place of the file's", || {
        let d = decide(&edge, "ada");
        let f = &d["featureFlags"];
        (f.get("mine").is_none() && f.get("from-the-file").is_none() && f["beta"] == true)
            .then_some(())
    });
}
