//! The operator commands: `check`, `eval`, `export`, `key new` and `--version`, run as a
//! user would.

use std::process::Output;

use serde_json::{json, Value};

use crate::util::*;

#[test]
fn version() {
    let out = flagpost(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        text(&out.stdout),
        format!("flagpost {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn check_names_what_is_wrong() {
    let repo_data = concat!(env!("CARGO_MANIFEST_DIR"), "/data");
    let out = flagpost(&["check", "--data-dir", repo_data]);
    assert!(out.status.success(), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("1 projects"));

    let tmp = data_dir();
    let data = tmp.path().join("data");
    let dir = data.to_str().unwrap();
    let out = flagpost(&["check", "--data-dir", dir]);
    assert!(out.status.success(), "{}", text(&out.stdout));

    let bad_flag = json!({"flags": [{"id": 1, "key": "beta", "active": true,
        "filters": {"groups": [{"properties": [{"key": "a", "value": 1, "operator": "sounds_like"}]}]}}]});
    std::fs::write(data.join("flags/1.json"), bad_flag.to_string()).unwrap();
    std::fs::write(data.join("GeoLite2-City.mmdb"), b"not a database").unwrap();
    std::fs::write(data.join("flags/7.json"), r#"{"flags": []}"#).unwrap();
    let out = flagpost(&["check", "--data-dir", dir]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    // An operator no flag may use: the server refuses the file, and so does check.
    assert!(
        stdout.contains(r#"error: "#)
            && stdout.contains(r#"flags/1.json: flag "beta": filters.groups[0].properties[0].operator: unknown operator "sounds_like""#),
        "{stdout}"
    );
    assert!(
        stdout.contains("GeoLite2-City.mmdb is not a MaxMind database"),
        "{stdout}"
    );
    assert!(stdout.contains("no project 7 in projects.json"), "{stdout}");
    assert!(
        text(&out.stderr).contains("has 2 error(s)"),
        "{}",
        text(&out.stderr)
    );

    std::fs::write(data.join("projects.json"), "{").unwrap();
    let out = flagpost(&["check", "--data-dir", dir]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).contains("projects.json"));
}

/// The mistakes the server refuses a file for: each is an error of `check` naming the
/// file, the flag and the field, with what was likely meant.
#[test]
fn check_refuses_what_the_server_refuses() {
    let tmp = data_dir();
    let data = tmp.path().join("data");
    let dir = data.to_str().unwrap();
    let file = data.join("flags/1.json");
    let cases = [
        (
            json!({"id": 1, "key": "rollout", "filters": {"groups": [{"properties": [], "rollout_percentge": 30}]}}),
            r#"flag "rollout": filters.groups[0].rollout_percentge: unknown field (did you mean "rollout_percentage"?)"#,
        ),
        (
            json!({"id": 1, "key": "ops", "filters": {"groups": [{"properties": [{"key": "email", "value": "@x.com", "operator": "ends_wth"}]}]}}),
            r#"flag "ops": filters.groups[0].properties[0].operator: unknown operator "ends_wth""#,
        ),
        (
            json!({"id": 1, "key": "types", "filters": {"groups": [{"properties": [{"key": "email", "value": "a", "type": "persn"}]}]}}),
            r#"flag "types": filters.groups[0].properties[0].type: unknown filter type "persn" (did you mean "person"?)"#,
        ),
        (
            json!({"id": 1, "key": "dependent", "filters": {"groups": [{"properties": [{"key": "404", "type": "flag", "value": true, "operator": "flag_evaluates_to"}]}]}}),
            r#"flag "dependent": filters.groups[0].properties[0]: depends on flag "404", which does not exist"#,
        ),
        (
            json!({"id": 1, "key": "variants", "filters": {"groups": [{"properties": []}],
                "multivariate": {"variants": [{"key": "a", "rollout_percentage": 100, "rollout": 5}]}}}),
            r#"flag "variants": filters.multivariate.variants[0].rollout: unknown field"#,
        ),
    ];
    for (flag, message) in cases {
        let written = json!({"flags": [flag]}).to_string();
        std::fs::write(&file, written).unwrap();
        let out = flagpost(&["check", "--data-dir", dir]);
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{stdout}");
        let expected = format!("error: {}: {message}\n", file.display());
        assert!(stdout.contains(&expected), "{expected}\n{stdout}");
        assert_eq!(stdout.matches("error: ").count(), 1, "{stdout}");
        assert!(text(&out.stderr).contains("has 1 error(s)"));
    }

    // A cohort the file does not hold (PostHog's feed without `send_cohorts`): the server
    // serves that flag off, and check warns without failing.
    let cohort = json!({"flags": [{"id": 1, "key": "staff", "filters": {"groups": [{"properties": [
        {"key": "id", "type": "cohort", "value": 42}]}]}}]});
    std::fs::write(&file, cohort.to_string()).unwrap();
    let out = flagpost(&["check", "--data-dir", dir]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains(r#"warning: "#) && stdout.contains(r#"flag "staff": filters.groups[0].properties[0]: cohort 42 is missing, cyclic or refers to a missing cohort (the server serves this flag off until it is fixed)"#),
        "{stdout}"
    );

    // PostHog's own fields that flagpost does not read are accepted.
    let posthog = json!({"flags": [{"id": 1, "key": "full", "name": "n", "team_id": 9,
        "filters": {"groups": [{"properties": [{"key": "email", "value": "a", "type": "person",
            "operator": "exact", "label": "Email"}], "rollout_percentage": 50, "variant": null,
            "description": "rollout to enterprise", "sort_key": "abc-123"}],
        "multivariate": {"variants": [{"key": "c", "name": "Control", "rollout_percentage": 100}]},
        "payloads": {}, "aggregation_group_type_index": null}}]});
    std::fs::write(&file, posthog.to_string()).unwrap();
    let out = flagpost(&["check", "--data-dir", dir]);
    assert!(out.status.success(), "{}", text(&out.stdout));
}

#[test]
fn export_writes_every_event_of_a_stopped_server() {
    let mut server = Server::start();
    let batch: Vec<Value> = (0..30)
        .map(|i| json!({"event": "exported", "properties": {"distinct_id": format!("u{}", i % 4), "i": i}}))
        .collect();
    assert_eq!(
        server
            .post(
                "/batch/",
                json!({"api_key": KEY_ONE, "batch": batch}).to_string()
            )
            .status,
        200
    );
    let two = json!({"api_key": KEY_TWO, "event": "other", "distinct_id": "x"});
    assert_eq!(server.post("/capture/", two.to_string()).status, 200);
    let stored = server.settle(1).len() + server.settle(2).len();
    let db = server.dir.join("db");
    let db = db.to_str().unwrap();

    // Refused while the server holds the database.
    let out = flagpost(&["export", "--db", db]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("stop it first"),
        "{}",
        text(&out.stderr)
    );

    assert_eq!(server.stop(), Some(0));
    let file = server.dir.join("export.ndjson");
    let out = flagpost(&["export", "--db", db, "-o", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("100%"), "{stderr}");
    assert!(
        stderr.contains(&format!("{} events written", stored + 2)),
        "{stderr}"
    );
    let lines: Vec<Value> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines.len(),
        stored + 2,
        "every event, the two settle markers too"
    );
    let exported: Vec<&Value> = lines.iter().filter(|e| e["event"] == "exported").collect();
    assert_eq!(exported.len(), 30);
    assert!(exported
        .iter()
        .all(|e| e["project_id"] == 1 && e["person_id"].is_string()));
    assert_eq!(lines.iter().filter(|e| e["project_id"] == 2).count(), 2);

    let out = flagpost(&["export", "--db", "/nonexistent/db"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("not a flagpost database"));
}

/// `eval`'s lines as (key, value, reason code, description).
fn eval_lines(stdout: &str) -> Vec<(String, Value, String, String)> {
    stdout
        .lines()
        .map(|line| {
            let mut parts = line.split_whitespace();
            let key = parts.next().unwrap().to_owned();
            let value = serde_json::from_str(parts.next().unwrap()).unwrap();
            let code = parts.next().unwrap().to_owned();
            let rest: Vec<&str> = parts.collect();
            let description = rest.join(" ");
            let description = description.trim_start_matches('(').trim_end_matches(')');
            (key, value, code, description.to_owned())
        })
        .collect()
}

/// `eval` answers what `/flags` answers for the same user and properties, value and
/// reason, and with `--db` reads the stored person of a stopped server.
#[test]
fn eval_prints_what_decide_answers_and_why() {
    let tmp = data_dir();
    let data = tmp.path().join("data");
    let repo_flags = concat!(env!("CARGO_MANIFEST_DIR"), "/data/flags/1.json");
    std::fs::copy(repo_flags, data.join("flags/1.json")).unwrap();
    let dir = data.to_str().unwrap();
    let args = [
        "eval",
        "--data-dir",
        dir,
        "--project",
        "1",
        "--distinct-id",
        "user-17",
        "--prop",
        "plan=enterprise",
        "--prop",
        "app_version=\"2.4.0\"",
        "--group",
        "organization=acme",
        "--group-prop",
        "organization:plan=enterprise",
        "--group-prop",
        "organization:seats=60",
    ];
    let out = flagpost(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = eval_lines(&text(&out.stdout));
    let expected = [
        (
            "new-onboarding",
            json!(true),
            "condition_match",
            "Matched condition set 1",
        ),
        (
            "pricing-page-experiment",
            json!("annual-first"),
            "condition_match",
            "Matched condition set 1",
        ),
        (
            "enterprise-dashboard",
            json!(true),
            "condition_match",
            "Matched condition set 2",
        ),
        (
            "org-audit-log",
            json!(true),
            "condition_match",
            "Matched condition set 1",
        ),
        (
            "ai-assistant-beta",
            json!(false),
            "out_of_rollout_bound",
            "Out of rollout bound",
        ),
    ];
    let expected: Vec<(String, Value, String, String)> = expected
        .iter()
        .map(|(k, v, c, d)| (k.to_string(), v.clone(), c.to_string(), d.to_string()))
        .collect();
    assert_eq!(lines, expected);

    // The running server answers the same, flag by flag.
    let mut server = Server::spawn(tmp.path(), &[]);
    let body = json!({"token": KEY_ONE, "distinct_id": "user-17",
        "person_properties": {"plan": "enterprise", "app_version": "2.4.0"},
        "groups": {"organization": "acme"},
        "group_properties": {"organization": {"plan": "enterprise", "seats": 60}}});
    let answer = server.post("/flags/?v=2", body.to_string()).json();
    for (key, value, code, description) in &lines {
        let flag = &answer["flags"][key];
        let served = match &flag["variant"] {
            Value::String(v) => json!(v),
            _ => flag["enabled"].clone(),
        };
        assert_eq!(&served, value, "{key}");
        assert_eq!(flag["reason"]["code"], json!(code), "{key}");
        assert_eq!(flag["reason"]["description"], json!(description), "{key}");
    }

    // A stored person: their properties count with --db, once the server has stopped.
    let identify = json!({"api_key": KEY_ONE, "event": "$identify", "distinct_id": "ada",
        "properties": {"$set": {"plan": "pro", "app_version": "3.0.0"}}});
    assert_eq!(server.post("/capture/", identify.to_string()).status, 200);
    server.settle(1);
    let db = tmp.path().join("db");
    let db = db.to_str().unwrap();
    let ada = [
        "eval",
        "--data-dir",
        dir,
        "--project",
        "1",
        "--distinct-id",
        "ada",
    ];
    let refused = flagpost(&[&ada[..], &["--db", db]].concat());
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains(&format!("cannot open the database {db}: "))
            && text(&refused.stderr).contains("stop it, or leave out --db"),
        "{}",
        text(&refused.stderr)
    );
    assert_eq!(server.stop(), Some(0));
    let dashboard = |out: &Output| {
        let lines = eval_lines(&text(&out.stdout));
        let line = lines.into_iter().find(|l| l.0 == "enterprise-dashboard");
        line.map(|(_, value, code, _)| (value, code))
    };
    let without = flagpost(&ada);
    let expected = (json!(false), "no_condition_match".to_owned());
    assert_eq!(dashboard(&without), Some(expected));
    let with = flagpost(&[&ada[..], &["--db", db]].concat());
    assert!(with.status.success(), "{}", text(&with.stderr));
    assert_eq!(
        dashboard(&with),
        Some((json!(true), "condition_match".to_owned()))
    );

    let out = flagpost(&[
        "eval",
        "--data-dir",
        dir,
        "--project",
        "9",
        "--distinct-id",
        "u",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let missing = data.join("flags/9.json");
    let expected = format!("flagpost: {}: no such flag file\n", missing.display());
    assert_eq!(text(&out.stderr), expected);
}

#[test]
fn key_new_prints_keys_projects_json_accepts() {
    let out = flagpost(&["key", "new", "--project", "3"]);
    assert!(out.status.success());
    let key = text(&out.stdout).trim_end().to_owned();
    assert!(key.starts_with("phc_") && key.len() == 47, "{key}");
    assert!(key[4..].bytes().all(|b| b.is_ascii_alphanumeric()), "{key}");
    assert_eq!(
        text(&out.stderr),
        format!("in projects.json: {{\"id\": 3, \"api_key\": \"{key}\"}}\n")
    );
    let out = flagpost(&["key", "new", "--personal"]);
    let personal = text(&out.stdout).trim_end().to_owned();
    assert!(
        personal.starts_with("phx_") && personal.len() == 52,
        "{personal}"
    );
    assert_ne!(flagpost(&["key", "new"]).stdout, out.stdout);

    // A server takes both.
    let tmp = data_dir();
    let projects =
        json!({"projects": [{"id": 1, "api_key": key, "personal_api_keys": [personal]}]});
    std::fs::write(tmp.path().join("data/projects.json"), projects.to_string()).unwrap();
    let server = Server::spawn(tmp.path(), &[]);
    let event = json!({"api_key": key, "event": "e", "distinct_id": "d"});
    assert_eq!(server.post("/capture/", event.to_string()).status, 200);
    let read = server.api("/api/projects/1/events/", &personal);
    assert_eq!(read.status, 200);
}
