//! The operator commands: `check`, `export` and `--version`, run as a user would.

use std::process::{Command, Output};

use serde_json::{json, Value};

use crate::util::*;

fn flagpost(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flagpost"))
        .args(args)
        .output()
        .expect("run flagpost")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

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
    // An operator PostHog does not evaluate disables that flag when served: an error.
    assert!(
        stdout.contains(r#"error: "#)
            && stdout.contains(r#"flags/1.json: flag "beta": filters.groups[0].properties[0].operator: unknown operator "sounds_like" (the server turns this flag off until it is fixed)"#),
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

/// The mistakes that serving would let through or answer with the flag off: each is an
/// error of `check` naming the file, the flag and the field.
#[test]
fn check_refuses_typos_and_flags_the_server_would_switch_off() {
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
            r#"flag "ops": filters.groups[0].properties[0].operator: unknown operator "ends_wth" (the server turns this flag off until it is fixed)"#,
        ),
        (
            json!({"id": 1, "key": "types", "filters": {"groups": [{"properties": [{"key": "email", "value": "a", "type": "persn"}]}]}}),
            r#"flag "types": filters.groups[0].properties[0].type: unknown filter type "persn" (the server turns this flag off until it is fixed)"#,
        ),
        (
            json!({"id": 1, "key": "dependent", "filters": {"groups": [{"properties": [{"key": "404", "type": "flag", "value": true, "operator": "flag_evaluates_to"}]}]}}),
            r#"flag "dependent": filters.groups[0].properties[0]: depends on flag "404", which does not exist (the server turns this flag off until it is fixed)"#,
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
