//! The flag endpoints of server-side SDKs, over loopback: the definitions feed as
//! PostHog serves it (dependency chains, no remote config flags, ETag and 304) and
//! remote config payloads.

use serde_json::{json, Value};

use crate::util::*;

fn rules() -> Value {
    json!({
        "flags": [
            {"id": 1, "key": "base", "active": true,
             "filters": {"groups": [{"properties": [], "rollout_percentage": 100}]}},
            {"id": 2, "key": "needs-base", "active": true,
             "filters": {"groups": [{"properties": [
                 {"key": "1", "type": "flag", "value": true, "operator": "flag_evaluates_to"}],
                 "rollout_percentage": 100}]}},
            {"id": 3, "key": "needs-both", "active": true,
             "filters": {"groups": [{"properties": [
                 {"key": "needs-base", "type": "flag", "value": true, "operator": "flag_evaluates_to"},
                 {"key": "plan", "value": "pro", "type": "person"}],
                 "rollout_percentage": 100}]}},
            {"id": 4, "key": "settings", "active": true, "is_remote_configuration": true,
             "filters": {"groups": [{"properties": [], "rollout_percentage": 100}],
                         "payloads": {"true": "{\"theme\": \"dark\", \"limit\": 3}"}}},
            {"id": 5, "key": "empty-settings", "active": true, "is_remote_configuration": true,
             "filters": {"groups": [{"properties": [], "rollout_percentage": 100}]}}
        ],
        "group_type_mapping": {},
        "cohorts": {}
    })
}

fn start() -> Server {
    let server = Server::start();
    write_atomically(&server.data().join("flags/1.json"), rules().to_string());
    server.sighup();
    wait_for("the rules", || {
        let feed = feed(&server, None);
        (feed.status == 200 && feed.json()["flags"].as_array()?.len() == 3).then_some(())
    });
    server
}

fn feed(server: &Server, etag: Option<&str>) -> Resp {
    let mut req = Req::get(&format!("/flags/definitions?token={KEY_ONE}&send_cohorts"))
        .header("Authorization", &format!("Bearer {PERSONAL_ONE}"));
    if let Some(etag) = etag {
        req = req.header("If-None-Match", etag);
    }
    server.request(req)
}

#[test]
fn the_feed_carries_dependency_chains_and_no_remote_config_flags() {
    let server = start();
    let body = feed(&server, None).json();
    let keys: Vec<&str> = body["flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["base", "needs-base", "needs-both"]);
    assert_eq!(
        body["flags"][1]["filters"]["groups"][0]["properties"][0],
        json!({"key": "base", "type": "flag", "value": true, "operator": "flag_evaluates_to",
               "dependency_chain": ["base"]}),
        "the id becomes the key"
    );
    assert_eq!(
        body["flags"][2]["filters"]["groups"][0]["properties"],
        json!([
            {"key": "needs-base", "type": "flag", "value": true, "operator": "flag_evaluates_to",
             "dependency_chain": ["base", "needs-base"]},
            {"key": "plan", "value": "pro", "type": "person"}
        ])
    );
}

#[test]
fn the_feed_answers_if_none_match_with_304() {
    let server = start();
    let first = feed(&server, None);
    let etag = first.header("etag").expect("an ETag").to_string();
    assert!(etag.starts_with('"') && etag.ends_with('"'), "{etag}");
    let again = feed(&server, Some(&etag));
    assert_eq!((again.status, again.body.len()), (304, 0));
    assert_eq!(again.header("etag"), Some(etag.as_str()));
    assert_eq!(feed(&server, Some("\"stale\"")).status, 200);
    // The tag is the body's: the legacy path without cohorts (there are none) serves
    // the same body under the same tag.
    let legacy = server.request(
        Req::get(&format!(
            "/api/feature_flag/local_evaluation/?token={KEY_ONE}"
        ))
        .header("Authorization", &format!("Bearer {PERSONAL_ONE}"))
        .header("If-None-Match", &etag),
    );
    assert_eq!(legacy.status, 304);

    // A change to the rules changes the tag.
    let mut changed = rules();
    changed["flags"][0]["filters"]["groups"][0]["rollout_percentage"] = json!(50);
    write_atomically(&server.data().join("flags/1.json"), changed.to_string());
    server.sighup();
    let fresh = wait_for("the new rules", || {
        let r = feed(&server, Some(&etag));
        (r.status == 200).then_some(r)
    });
    assert_ne!(fresh.header("etag"), Some(etag.as_str()));
    assert_eq!(
        fresh.json()["flags"][0]["filters"]["groups"][0]["rollout_percentage"],
        50
    );
}

fn payload(server: &Server, flag: &str, key: &str) -> Resp {
    server.api(
        &format!("/api/projects/@current/feature_flags/{flag}/remote_config?token={KEY_ONE}"),
        key,
    )
}

#[test]
fn remote_config_payloads() {
    let server = start();
    let r = payload(&server, "settings", PERSONAL_ONE);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    // As PostHog answers it: the payload's JSON text, as a JSON string.
    assert_eq!(r.json(), json!("{\"theme\": \"dark\", \"limit\": 3}"));
    assert_eq!(
        payload(&server, "4", PERSONAL_ONE).json(),
        r.json(),
        "by id"
    );
    assert_eq!(
        payload(&server, "empty-settings", PERSONAL_ONE).json(),
        Value::Null
    );

    // A missing flag and one that is not a remote config flag: PostHog's empty 404.
    for flag in ["nope", "base", "999"] {
        let refused = payload(&server, flag, PERSONAL_ONE);
        assert_eq!(
            (refused.status, refused.text()),
            (404, String::new()),
            "{flag}"
        );
    }
    assert_eq!(payload(&server, "settings", KEY_ONE).status, 401);
    assert_eq!(payload(&server, "settings", "phx_unknown").status, 401);
    assert_eq!(payload(&server, "settings", PERSONAL_TWO).status, 403);
    let other_project = server.api(
        "/api/projects/2/feature_flags/settings/remote_config",
        PERSONAL_ONE,
    );
    assert_eq!(other_project.status, 403);
}

/// What the management API records in the file for people (who changed a flag and
/// when, cohort names) stays out of the feed, which has PostHog's three members only.
#[test]
fn the_feed_leaves_out_what_the_file_keeps_for_people() {
    let server = Server::start();
    let mut file = rules();
    file["cohort_details"] = json!({"7": {"name": "Pro users"}});
    file["flags"][0]["created_by"] = json!("ci");
    file["flags"][0]["created_at"] = json!("2026-11-26T05:00:00Z");
    file["flags"][0]["updated_at"] = json!("2026-11-26T05:00:00Z");
    file["flags"][0]["last_modified_by"] = json!("ci");
    file["flags"][0]["name"] = json!("Base");
    write_atomically(&server.data().join("flags/1.json"), file.to_string());
    server.sighup();
    let body = wait_for("the rules", || {
        let feed = feed(&server, None);
        (feed.status == 200 && feed.json()["flags"].as_array()?.len() == 3).then(|| feed.json())
    });
    let members: Vec<&String> = body.as_object().unwrap().keys().collect();
    assert_eq!(members, ["flags", "group_type_mapping", "cohorts"]);
    let base = &body["flags"][0];
    assert_eq!(
        (&base["key"], &base["name"]),
        (&json!("base"), &json!("Base"))
    );
    for field in ["created_by", "created_at", "updated_at", "last_modified_by"] {
        assert!(base.get(field).is_none(), "{field}: {base}");
    }
}
