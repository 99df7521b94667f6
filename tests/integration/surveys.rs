//! Surveys and early access features end to end: the public endpoints with CORS and
//! their errors, `surveys` in decide, flags and remote config, the generated targeting
//! flags turning off for a person who answered or dismissed, reloads, and enrollment.

use serde_json::{json, Value};

use crate::util::*;

const SURVEY: &str = "0192b1e4-0000-7000-8000-000000000001";
const INTERNAL: &str = "survey-targeting-0000000001-custom";
const ORIGIN: &str = "https://app.example";

fn survey(end_date: Value) -> Value {
    json!({
        "id": SURVEY, "name": "NPS", "type": "popover", "description": "not served",
        "linked_flag_key": "beta", "targeting_flag_key": null,
        "internal_targeting_flag_key": INTERNAL,
        "questions": [{"id": "q1", "type": "open", "question": "Why?"}],
        "conditions": null, "appearance": null,
        "start_date": "2026-01-05T09:00:00Z", "end_date": end_date
    })
}

fn served_survey() -> Value {
    json!({
        "id": SURVEY, "name": "NPS", "type": "popover",
        "linked_flag_key": "beta", "targeting_flag_key": null,
        "internal_targeting_flag_key": INTERNAL,
        "questions": [{"id": "q1", "type": "open", "question": "Why?"}],
        "conditions": null, "appearance": null,
        "start_date": "2026-01-05T09:00:00Z", "end_date": null,
        "current_iteration": null, "current_iteration_start_date": null,
        "schedule": null, "enable_partial_responses": null
    })
}

fn features() -> Value {
    json!({"earlyAccessFeatures": [
        {"id": "f1", "name": "Dark mode", "stage": "beta", "flagKey": "dark-mode",
         "documentationUrl": "https://example.com/dark"},
        {"id": "f2", "name": "Teleport", "stage": "concept", "description": "Soon"}
    ]})
}

const FLAGS: &str = r#"{"flags": [
    {"id": 1, "key": "beta", "active": true, "filters": {"groups": [{"rollout_percentage": 100}]}},
    {"id": 2, "key": "dark-mode", "active": true,
     "filters": {"feature_enrollment": true, "groups": [{"rollout_percentage": 0}]}}
], "group_type_mapping": {}, "cohorts": {}}"#;

/// A server whose project 1 has one running survey and two features.
fn start() -> (tempfile::TempDir, Server) {
    let tmp = data_dir();
    let data = tmp.path().join("data");
    std::fs::write(data.join("flags/1.json"), FLAGS).unwrap();
    std::fs::create_dir_all(data.join("surveys")).unwrap();
    std::fs::create_dir_all(data.join("early_access")).unwrap();
    let surveys = json!({"surveys": [survey(Value::Null)]});
    std::fs::write(data.join("surveys/1.json"), surveys.to_string()).unwrap();
    std::fs::write(data.join("early_access/1.json"), features().to_string()).unwrap();
    let server = Server::spawn(tmp.path(), &[]);
    (tmp, server)
}

fn flags(server: &Server, key: &str, distinct_id: &str) -> Value {
    let body = json!({"token": key, "distinct_id": distinct_id});
    let r = server.post("/flags/?v=2", body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn enabled(server: &Server, flag: &str, distinct_id: &str) -> Option<bool> {
    let body = flags(server, KEY_ONE, distinct_id);
    body["flags"].get(flag).map(|f| f["enabled"] == true)
}

fn get(server: &Server, path: &str) -> Resp {
    server.request(Req::get(path).header("Origin", ORIGIN))
}

#[test]
fn surveys_are_served_by_project_key_with_cors() {
    let (_tmp, server) = start();
    let r = get(
        &server,
        &format!("/api/surveys/?token={KEY_ONE}&_=1700000000000"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("access-control-allow-origin"), Some(ORIGIN));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        r.json(),
        json!({"surveys": [served_survey()], "survey_config": null})
    );
    let none = get(&server, &format!("/api/surveys?token={KEY_TWO}"));
    assert_eq!(none.json(), json!({"surveys": [], "survey_config": null}));

    let missing = get(&server, "/api/surveys/");
    assert_eq!(missing.status, 401);
    assert_eq!(missing.header("access-control-allow-origin"), Some(ORIGIN));
    assert_eq!(
        missing.json(),
        json!({"type": "authentication_error", "code": "missing_api_key",
               "detail": "API key is missing: send api_key or token", "attr": null})
    );
    let unknown = get(&server, "/api/surveys/?token=phc_nobody");
    assert_eq!(unknown.status, 401);
    assert_eq!(unknown.json()["code"], "invalid_api_key");
    assert_eq!(unknown.header("access-control-allow-origin"), Some(ORIGIN));
    let post = server.request(Req::post("/api/surveys/?token=x", "").header("Origin", ORIGIN));
    assert_eq!(post.status, 405);
    let preflight = server.request(
        Req::get("/api/surveys/")
            .method("OPTIONS")
            .header("Origin", ORIGIN)
            .header("Access-Control-Request-Method", "GET"),
    );
    assert!(preflight.status < 300, "{}", preflight.status);
    assert_eq!(
        preflight.header("access-control-allow-origin"),
        Some(ORIGIN)
    );
}

#[test]
fn a_running_survey_turns_surveys_on_everywhere() {
    let (_tmp, server) = start();
    for version in [1, 2, 3, 4] {
        let body = json!({"token": KEY_ONE, "distinct_id": "u"}).to_string();
        let r = server.post(&format!("/decide/?v={version}"), body);
        assert_eq!(r.json()["surveys"], true, "v{version}");
    }
    assert_eq!(flags(&server, KEY_ONE, "u")["surveys"], true);
    assert_eq!(flags(&server, KEY_TWO, "u")["surveys"], false);
    let config = server.get(&format!("/array/{KEY_ONE}/config"));
    assert_eq!(config.json()["surveys"], true);
    let config = server.get(&format!("/array/{KEY_TWO}/config"));
    assert_eq!(config.json()["surveys"], false);
}

/// What posthog-js sends when a person answers or dismisses a survey: the event, with
/// `$set` of the interaction property its internal targeting flag reads.
fn interact(server: &Server, event: &str, property: &str, distinct_id: &str) {
    // posthog-js marks events of anonymous users (with `person_profiles:
    // 'identified_only'`) as not processing persons.
    let anonymous = distinct_id.starts_with("anon");
    let body = json!({"api_key": KEY_ONE, "batch": [{
        "event": event, "distinct_id": distinct_id,
        "properties": {"$survey_id": SURVEY, "$survey_name": "NPS", "$survey_response_q1": "Fast",
                       "$process_person_profile": !anonymous,
                       "$set": {property: true}}}]});
    assert_eq!(server.post("/batch/", body.to_string()).status, 200);
}

#[test]
fn answering_or_dismissing_hides_the_survey_from_that_person() {
    let (_tmp, server) = start();
    for person in ["ada", "bob", "cy", "anon-1"] {
        assert_eq!(enabled(&server, INTERNAL, person), Some(true), "{person}");
    }
    let shown = json!({"api_key": KEY_ONE, "event": "survey shown", "distinct_id": "cy",
                       "properties": {"$survey_id": SURVEY}});
    assert_eq!(server.post("/capture/", shown.to_string()).status, 200);
    interact(
        &server,
        "survey sent",
        &format!("$survey_responded/{SURVEY}"),
        "ada",
    );
    interact(
        &server,
        "survey dismissed",
        &format!("$survey_dismissed/{SURVEY}"),
        "bob",
    );
    let stored = server.settle(1);
    let mut names: Vec<&str> = stored.iter().filter_map(|e| e["event"].as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["survey dismissed", "survey sent", "survey shown"]);
    // The compactor makes decide's person cache forget a person just after the commit
    // that stored its events, so the read API may show them a moment before decide.
    for person in ["ada", "bob"] {
        wait_for("the answer to reach the person", || {
            (enabled(&server, INTERNAL, person) == Some(false)).then_some(())
        });
    }
    assert_eq!(
        enabled(&server, INTERNAL, "cy"),
        Some(true),
        "seeing is not answering"
    );
    // The v4 detail says why, like any flag.
    let body = json!({"token": KEY_ONE, "distinct_id": "ada"}).to_string();
    let detail = &server.post("/flags/?v=2", body).json()["flags"][INTERNAL];
    assert_eq!(detail["reason"]["code"], "no_condition_match");
    // The feed for local evaluation holds the file's flags only, as PostHog's does.
    let feed = server.api(&format!("/flags/definitions?token={KEY_ONE}"), PERSONAL_ONE);
    let keys: Vec<Value> = feed.json()["flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["key"].clone())
        .collect();
    assert_eq!(keys, [json!("beta"), json!("dark-mode")]);
}

#[test]
fn survey_changes_reload_and_a_broken_file_keeps_the_last_good_one() {
    let (tmp, server) = start();
    let file = tmp.path().join("data/surveys/1.json");
    // Stopped: the internal flag is inactive (left out) and surveys are off.
    let ended = json!({"surveys": [survey(json!("2026-02-01T00:00:00Z"))]});
    write_atomically(&file, ended.to_string());
    wait_for("the stopped survey", || {
        (enabled(&server, INTERNAL, "u").is_none()).then_some(())
    });
    assert_eq!(flags(&server, KEY_ONE, "u")["surveys"], false);
    let served = get(&server, &format!("/api/surveys/?token={KEY_ONE}")).json();
    assert_eq!(served["surveys"][0]["end_date"], "2026-02-01T00:00:00Z");

    // A typo: the last good file stays, and the log names the file, survey and field.
    let mut broken = survey(Value::Null);
    broken["questions"][0]["type"] = json!("essay");
    write_atomically(&file, json!({"surveys": [broken]}).to_string());
    let expected = format!("survey \"{SURVEY}\": questions[0].type: \"essay\" is not one of");
    wait_for("the warning", || {
        server.log().contains(&expected).then_some(())
    });
    assert!(server.log().contains("1.json"));
    let served = get(&server, &format!("/api/surveys/?token={KEY_ONE}")).json();
    assert_eq!(served["surveys"][0]["end_date"], "2026-02-01T00:00:00Z");

    // Fixed and running again, picked up on SIGHUP as well as by the watcher.
    std::fs::write(&file, json!({"surveys": [survey(Value::Null)]}).to_string()).unwrap();
    server.sighup();
    wait_for("the running survey", || {
        (enabled(&server, INTERNAL, "u") == Some(true)).then_some(())
    });
    assert_eq!(flags(&server, KEY_ONE, "u")["surveys"], true);
    std::fs::remove_file(&file).unwrap();
    wait_for("no surveys", || {
        let body = get(&server, &format!("/api/surveys/?token={KEY_ONE}")).json();
        (body == json!({"surveys": [], "survey_config": null})).then_some(())
    });
    // The surveys and the flag rules they generate are published one after the other,
    // so the flag may outlive the served list by one pass.
    wait_for("the targeting flag gone", || {
        enabled(&server, INTERNAL, "u").is_none().then_some(())
    });
}

#[test]
fn early_access_features_by_stage_and_enrollment_flips_the_flag() {
    let (_tmp, server) = start();
    let r = get(
        &server,
        &format!("/api/early_access_features/?token={KEY_ONE}"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("access-control-allow-origin"), Some(ORIGIN));
    let dark = json!({"id": "f1", "name": "Dark mode", "description": "", "stage": "beta",
                      "documentationUrl": "https://example.com/dark", "imageUrl": "",
                      "payload": {}, "flagKey": "dark-mode"});
    assert_eq!(r.json(), json!({"earlyAccessFeatures": [dark]}));
    let path = format!("/api/early_access_features/?token={KEY_ONE}&stage=concept&stage=beta");
    let both = get(&server, &path).json();
    assert_eq!(both["earlyAccessFeatures"].as_array().unwrap().len(), 2);
    let alpha = format!("/api/early_access_features/?token={KEY_ONE}&stage=alpha");
    assert_eq!(
        get(&server, &alpha).json(),
        json!({"earlyAccessFeatures": []})
    );
    let none = format!("/api/early_access_features/?token={KEY_TWO}");
    assert_eq!(
        get(&server, &none).json(),
        json!({"earlyAccessFeatures": []})
    );

    let bad = get(
        &server,
        &format!("/api/early_access_features/?token={KEY_ONE}&stage=gamma"),
    );
    assert_eq!(bad.status, 400);
    assert_eq!(bad.header("access-control-allow-origin"), Some(ORIGIN));
    assert_eq!(bad.json()["code"], "invalid_input");
    let missing = get(&server, "/api/early_access_features/");
    assert_eq!(missing.status, 401);
    assert_eq!(missing.json()["code"], "missing_api_key");

    // posthog-js's updateEarlyAccessFeatureEnrollment: the event and its `$set`.
    assert_eq!(enabled(&server, "dark-mode", "eve"), Some(false));
    let enroll = json!({"api_key": KEY_ONE, "event": "$feature_enrollment_update", "distinct_id": "eve",
        "properties": {"$feature_flag": "dark-mode", "$feature_enrollment": true,
                       "$early_access_feature_name": "Dark mode",
                       "$set": {"$feature_enrollment/dark-mode": true}}});
    assert_eq!(server.post("/capture/", enroll.to_string()).status, 200);
    server.settle(1);
    // Decide's person cache forgets eve just after the commit the read API sees.
    wait_for("the enrollment to reach the person", || {
        (enabled(&server, "dark-mode", "eve") == Some(true)).then_some(())
    });
    assert_eq!(enabled(&server, "dark-mode", "someone-else"), Some(false));
}

#[test]
fn check_names_the_file_the_survey_and_the_field() {
    let tmp = data_dir();
    let data = tmp.path().join("data");
    std::fs::write(data.join("flags/1.json"), FLAGS).unwrap();
    std::fs::create_dir_all(data.join("surveys")).unwrap();
    std::fs::create_dir_all(data.join("early_access")).unwrap();
    let mut bad = survey(Value::Null);
    bad["start_date"] = json!("last tuesday");
    std::fs::write(
        data.join("surveys/1.json"),
        json!({"surveys": [bad]}).to_string(),
    )
    .unwrap();
    let mut unlinked = survey(Value::Null);
    unlinked["linked_flag_key"] = json!("no-such-flag");
    std::fs::write(
        data.join("surveys/2.json"),
        json!({"surveys": [unlinked]}).to_string(),
    )
    .unwrap();
    let feature = json!({"earlyAccessFeatures": [{"id": "f9", "name": "X", "stage": "beta", "flagKey": "ghost"}]});
    std::fs::write(data.join("early_access/1.json"), feature.to_string()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flagpost"))
        .args(["check", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let d = data.display();
    for line in [
        format!("error: {d}/surveys/1.json: survey \"{SURVEY}\": start_date: \"last tuesday\" is not a date-time like 2024-05-01T09:00:00Z"),
        format!("error: {d}/surveys/2.json: survey \"{SURVEY}\": linked_flag_key: no flag \"no-such-flag\" in {d}/flags/2.json"),
        format!("error: {d}/early_access/1.json: feature \"f9\": flagKey: no flag \"ghost\" in {d}/flags/1.json"),
    ] {
        assert!(stdout.lines().any(|l| l == line), "{line}\nnot in:\n{stdout}");
    }
}
