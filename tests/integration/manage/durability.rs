//! The file as the one source of truth under concurrency, hand edits, crashes and
//! restarts; the activity log; cohorts.

use std::time::Duration;

use serde_json::{json, Value};

use super::{call, create, file, patch, FLAGS};
use crate::util::*;

fn hand_written(flags: usize) -> tempfile::TempDir {
    let tmp = data_dir();
    let flags: Vec<Value> = (1..=flags)
        .map(|i| json!({"id": i, "key": format!("f{i}"), "version": 1, "filters": {"groups": [{"properties": [], "rollout_percentage": 0}]}}))
        .collect();
    let doc = json!({"flags": flags, "group_type_mapping": {"0": "company"}, "cohorts": {}, "custom": {"kept": true}});
    std::fs::write(
        tmp.path().join("data/flags/1.json"),
        serde_json::to_string_pretty(&doc).unwrap(),
    )
    .unwrap();
    tmp
}

#[test]
fn twenty_concurrent_updates_of_different_flags_are_all_applied() {
    let tmp = hand_written(20);
    let mut server = Server::spawn(tmp.path(), &[]);
    server.keep(tmp);
    let addr = server.addr;
    let threads: Vec<_> = (1..=20)
        .map(|i| {
            std::thread::spawn(move || {
                let body = json!({"name": format!("changed {i}"), "version": 1,
                    "filters": {"groups": [{"properties": [], "rollout_percentage": 100}]}});
                let r = send(
                    addr,
                    Req::post(&format!("{FLAGS}{i}/"), body.to_string())
                        .method("PATCH")
                        .header("Authorization", &format!("Bearer {PERSONAL_ONE}")),
                );
                (r.status, r.text())
            })
        })
        .collect();
    for t in threads {
        let (status, text) = t.join().unwrap();
        assert_eq!(status, 200, "{text}");
    }
    let doc = file(&server);
    for (i, f) in doc["flags"].as_array().unwrap().iter().enumerate() {
        assert_eq!(f["name"], format!("changed {}", i + 1));
        assert_eq!(f["version"], 2);
        assert_eq!(f["filters"]["groups"][0]["rollout_percentage"], 100);
    }
    assert_eq!(doc["custom"], json!({"kept": true}));
    assert_eq!(doc["group_type_mapping"], json!({"0": "company"}));
    let activity = call(
        &server,
        "GET",
        "/api/projects/1/feature_flags/activity/?limit=50",
        PERSONAL_ONE,
        None,
    )
    .json();
    assert_eq!(activity["total_count"], 20);
}

#[test]
fn a_stale_version_and_an_unseen_hand_edit_are_refused() {
    let server = Server::start();
    create(&server, json!({"key": "k", "name": "one"}));
    assert_eq!(
        patch(&server, 1, json!({"name": "two", "version": 1})).status,
        200
    );
    let stale = patch(&server, 1, json!({"name": "three", "version": 1}));
    assert_eq!(stale.status, 409);
    assert_eq!(
        stale.json(),
        json!({"type": "server_error", "code": "conflict", "attr": null,
               "detail": "The feature flag was updated by phx_..._one since you started editing it. Please refresh and try again."})
    );
    // PostHog's rule with `original_flag`: a field nobody else changed goes through.
    let r = patch(
        &server,
        1,
        json!({"active": false, "version": 1, "original_flag": {"active": true, "name": "one"}}),
    );
    assert_eq!((r.status, r.json()["version"].clone()), (200, json!(3)));

    // A hand edit of the flag, not yet shown by the API, is not overwritten.
    let path = server.data().join("flags/1.json");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("\"name\": \"two\"", "\"name\": \"by hand\"");
    write_atomically(&path, &text);
    let r = patch(&server, 1, json!({"active": true}));
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(r.json()["code"], "conflict");
    assert_eq!(file(&server)["flags"][0]["name"], "by hand");
    let shown = call(&server, "GET", &format!("{FLAGS}1/"), PERSONAL_ONE, None).json();
    assert_eq!(shown["name"], "by hand");
    let r = patch(&server, 1, json!({"active": true}));
    assert_eq!(r.status, 200, "{}", r.text());
    let f = &file(&server)["flags"][0];
    assert_eq!(
        (f["name"].clone(), f["active"].clone()),
        (json!("by hand"), json!(true))
    );
}

#[test]
fn a_kill_during_writes_leaves_the_old_or_the_new_file() {
    let tmp = hand_written(5);
    let dir = tmp.path().to_path_buf();
    let mut server = Server::spawn(&dir, &[]);
    for round in 0..5u64 {
        let addr = server.addr;
        let writer = std::thread::spawn(move || {
            let mut applied = 0;
            for n in 0.. {
                let body = json!({"name": format!("round {round} write {n}"), "tags": ["x".repeat(n % 300)]});
                let req = Req::post(&format!("{FLAGS}{}/", n % 5 + 1), body.to_string())
                    .method("PATCH")
                    .header("Authorization", &format!("Bearer {PERSONAL_ONE}"));
                match try_send(addr, req) {
                    Some(r) if r.status == 200 => applied += 1,
                    Some(r) => panic!("{}: {}", r.status, r.text()),
                    None => return applied,
                }
            }
            applied
        });
        // A different moment in each round.
        std::thread::sleep(Duration::from_millis(150 + round * 97));
        server.kill();
        let applied = writer.join().unwrap();
        assert!(
            applied > 0,
            "round {round}: no write went through before the kill"
        );
        let text = std::fs::read_to_string(dir.join("data/flags/1.json")).unwrap();
        let doc: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("round {round}: a broken file ({e}):\n{text}"));
        assert_eq!(doc["flags"].as_array().unwrap().len(), 5);
        assert_eq!(doc["custom"], json!({"kept": true}));
        server = Server::spawn(&dir, &[]);
    }
    // Served and writable after the last restart.
    assert_eq!(patch(&server, 1, json!({"name": "after"})).status, 200);
    server.keep(tmp);
}

#[test]
fn a_restart_keeps_flags_cohorts_and_activity() {
    let server = Server::start();
    let cohort = call(
        &server,
        "POST",
        "/api/projects/1/cohorts/",
        PERSONAL_ONE,
        Some(json!({
        "name": "Acme people", "filters": {"properties": {"type": "OR", "values": [
            {"type": "AND", "values": [{"key": "email", "type": "person", "operator": "icontains", "value": "@acme.com"}]}]}}})),
    );
    assert_eq!(cohort.status, 201, "{}", cohort.text());
    let cohort = cohort.json();
    assert_eq!(
        (
            cohort["id"].clone(),
            cohort["name"].clone(),
            cohort["is_static"].clone()
        ),
        (json!(1), json!("Acme people"), json!(false))
    );
    let flag = create(
        &server,
        json!({"key": "acme", "filters": {"groups": [
        {"properties": [{"key": "id", "type": "cohort", "value": 1}], "rollout_percentage": 100}]}}),
    );
    assert_eq!(
        flag["filters"]["groups"][0]["properties"][0]["cohort_name"],
        "Acme people"
    );
    super::within_a_second(&server, "the cohort flag", |f| f["acme"] == true);
    // A cohort in use cannot be deleted; a behavioral one cannot be made.
    let r = call(
        &server,
        "PATCH",
        "/api/projects/1/cohorts/1/",
        PERSONAL_ONE,
        Some(json!({"deleted": true})),
    );
    assert_eq!(
        (r.status, r.json()["attr"].clone()),
        (400, json!("filters")),
        "{}",
        r.text()
    );
    let r = call(
        &server,
        "POST",
        "/api/projects/1/cohorts/",
        PERSONAL_ONE,
        Some(json!({
        "name": "b", "filters": {"properties": {"type": "OR", "values": [{"key": "$pageview", "type": "behavioral", "value": "performed_event"}]}}})),
    );
    assert_eq!(r.status, 400);
    let r = call(
        &server,
        "PATCH",
        "/api/projects/1/cohorts/1/",
        PERSONAL_ONE,
        Some(json!({"name": "Acme staff"})),
    );
    assert_eq!(
        (r.status, r.json()["name"].clone()),
        (200, json!("Acme staff"))
    );
    assert_eq!(patch(&server, 1, json!({"name": "renamed"})).status, 200);

    // Killed, not stopped: everything answered was already on disk.
    let server = server.restart_hard();
    let flag = call(&server, "GET", &format!("{FLAGS}1/"), PERSONAL_ONE, None).json();
    assert_eq!(
        (flag["name"].clone(), flag["version"].clone()),
        (json!("renamed"), json!(2))
    );
    let cohorts = call(
        &server,
        "GET",
        "/api/projects/1/cohorts/",
        PERSONAL_ONE,
        None,
    )
    .json();
    assert_eq!(
        (
            cohorts["count"].clone(),
            cohorts["results"][0]["name"].clone()
        ),
        (json!(1), json!("Acme staff"))
    );
    let activity = call(
        &server,
        "GET",
        &format!("{FLAGS}1/activity/"),
        PERSONAL_ONE,
        None,
    )
    .json();
    assert_eq!(activity["total_count"], 2);
    let newest = &activity["results"][0];
    assert_eq!(
        (
            newest["activity"].clone(),
            newest["scope"].clone(),
            newest["item_id"].clone()
        ),
        (json!("updated"), json!("FeatureFlag"), json!("1"))
    );
    assert_eq!(
        newest["user"],
        json!({"first_name": "phx_..._one", "email": null})
    );
    let change = newest["detail"]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["field"] == "name")
        .unwrap();
    assert_eq!(
        (change["before"].clone(), change["after"].clone()),
        (json!(""), json!("renamed"))
    );
    assert_eq!(activity["results"][1]["activity"], "created");
    assert!(
        !std::fs::read_to_string(server.dir.join("db/flag_activity/1.jsonl"))
            .unwrap()
            .contains(PERSONAL_ONE)
    );
    super::within_a_second(&server, "the cohort flag after the restart", |f| {
        f["acme"] == true
    });
    // What the API wrote (cohort details, who changed what) passes `flagpost check`.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flagpost"))
        .args(["check", "--data-dir"])
        .arg(server.data())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
