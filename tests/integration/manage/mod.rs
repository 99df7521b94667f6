//! The flag management API end to end over loopback: PostHog's shapes, validation and
//! error bodies, keys of other projects, `/decide` and the feeds following each change.

mod durability;
mod keys;
mod limits;
mod refusals;

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::*;

pub fn call(server: &Server, method: &str, path: &str, key: &str, body: Option<Value>) -> Resp {
    let req = match body {
        Some(b) => Req::post(path, b.to_string()).method(method),
        None => Req::get(path).method(method),
    };
    server.request(
        req.header("Authorization", &format!("Bearer {key}"))
            .header("Content-Type", "application/json"),
    )
}

pub const FLAGS: &str = "/api/projects/1/feature_flags/";

pub fn create(server: &Server, body: Value) -> Value {
    let r = call(server, "POST", FLAGS, PERSONAL_ONE, Some(body));
    assert_eq!(r.status, 201, "{}", r.text());
    r.json()
}

pub fn patch(server: &Server, id: i64, body: Value) -> Resp {
    call(
        server,
        "PATCH",
        &format!("{FLAGS}{id}/"),
        PERSONAL_ONE,
        Some(body),
    )
}

/// The flags file of project 1, parsed.
pub fn file(server: &Server) -> Value {
    let text = std::fs::read_to_string(server.data().join("flags/1.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn decide(server: &Server, distinct_id: &str) -> Value {
    let body = json!({"api_key": KEY_ONE, "distinct_id": distinct_id, "person_properties": {"email": "ada@acme.com"}});
    let r = server.post("/decide/?v=3", body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["featureFlags"].clone()
}

/// Polls `/decide` until `check` holds, failing after one second: a change through the
/// API must be served within it.
fn within_a_second(server: &Server, what: &str, check: impl Fn(&Value) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let flags = decide(server, "ada");
        if check(&flags) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} not served within a second: {flags}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn error(code: &str, detail: &str, attr: Option<&str>) -> Value {
    json!({"type": "validation_error", "code": code, "detail": detail, "attr": attr})
}

#[test]
fn flags_are_created_changed_and_deleted_as_in_posthog() {
    let server = Server::start();
    let flag = create(
        &server,
        json!({"key": "acme-rollout", "name": "30% of acme", "filters": {"groups": [
            {"properties": [{"key": "email", "type": "person", "operator": "icontains", "value": "@acme.com"}],
             "rollout_percentage": 100}]}, "tags": ["team-a"], "unknown_field": 1}),
    );
    assert_eq!(flag["id"], 1);
    assert_eq!(flag["key"], "acme-rollout");
    assert_eq!(flag["version"], 1);
    assert_eq!(flag["active"], true);
    assert_eq!(flag["deleted"], false);
    assert_eq!(flag["is_simple_flag"], false);
    assert_eq!(flag["rollout_percentage"], Value::Null);
    assert_eq!(flag["tags"], json!(["team-a"]));
    assert_eq!(flag["status"], "ACTIVE");
    assert_eq!(flag["created_by"]["first_name"], "phx_..._one");
    assert_eq!(flag["experiment_set"], json!([]));
    assert!(
        flag.get("unknown_field").is_none(),
        "unknown body fields are ignored, as DRF does"
    );
    within_a_second(&server, "the new flag", |f| f["acme-rollout"] == true);

    // The file holds it, readable, with the API's id.
    let text = std::fs::read_to_string(server.data().join("flags/1.json")).unwrap();
    assert!(
        text.contains("\n  \"flags\": [\n    {\n      \"id\": 1,\n      \"key\": \"acme-rollout\""),
        "{text}"
    );
    assert_eq!(
        file(&server)["cohorts"],
        json!({}),
        "the rest of the file is kept"
    );

    // A simple flag, then a change of its rollout.
    let simple = create(
        &server,
        json!({"key": "everyone", "filters": {"groups": [{"properties": [], "rollout_percentage": 100}]}}),
    );
    assert_eq!(
        (
            simple["id"].clone(),
            simple["is_simple_flag"].clone(),
            simple["rollout_percentage"].clone()
        ),
        (json!(2), json!(true), json!(100))
    );
    let r = patch(
        &server,
        2,
        json!({"filters": {"groups": [{"properties": [], "rollout_percentage": 0}]}, "version": 1}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["version"], 2);
    within_a_second(&server, "the rollout change", |f| f["everyone"] == false);

    // Switched off, then deleted: gone from the list, /decide and the feed.
    assert_eq!(
        patch(&server, 1, json!({"active": false})).json()["active"],
        false
    );
    // PostHog leaves inactive flags out of its answers.
    within_a_second(&server, "the switched-off flag", |f| {
        f.get("acme-rollout").is_none()
    });
    let r = patch(&server, 1, json!({"deleted": true}));
    assert_eq!(
        (
            r.status,
            r.json()["deleted"].clone(),
            r.json()["status"].clone()
        ),
        (200, json!(true), json!("DELETED"))
    );
    within_a_second(&server, "the deletion", |f| f.get("acme-rollout").is_none());
    let list = call(&server, "GET", FLAGS, PERSONAL_ONE, None).json();
    assert_eq!(list["count"], 1);
    assert_eq!(list["results"][0]["key"], "everyone");
    let feed = server
        .api("/api/feature_flag/local_evaluation/", PERSONAL_ONE)
        .json();
    let keys: Vec<&Value> = feed["flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| &f["key"])
        .collect();
    assert_eq!(keys, [&json!("everyone")]);
    // Deleted flags keep their ids; the key is free again.
    assert_eq!(create(&server, json!({"key": "acme-rollout"}))["id"], 3);
    assert_eq!(
        file(&server)["flags"].as_array().unwrap().len(),
        2,
        "the re-created key replaces the deleted flag"
    );

    // GET one, an unknown one.
    let one = call(&server, "GET", &format!("{FLAGS}2/"), PERSONAL_ONE, None);
    assert_eq!(
        (one.status, one.json()["key"].clone()),
        (200, json!("everyone"))
    );
    let missing = call(&server, "GET", &format!("{FLAGS}99/"), PERSONAL_ONE, None);
    assert_eq!(missing.status, 404);
    assert_eq!(
        missing.json(),
        json!({"type": "invalid_request", "code": "not_found", "detail": "Not found.", "attr": null})
    );
    assert_eq!(patch(&server, 99, json!({"name": "x"})).status, 404);
}

#[test]
fn validation_errors_are_posthogs() {
    let server = Server::start();
    create(&server, json!({"key": "taken"}));
    let refused = |body: Value| {
        let r = call(&server, "POST", FLAGS, PERSONAL_ONE, Some(body));
        assert_eq!(r.status, 400, "{}", r.text());
        r.json()
    };
    let group =
        |props: Value| json!({"groups": [{"properties": props, "rollout_percentage": 100}]});
    assert_eq!(
        refused(json!({"key": "taken"})),
        error(
            "unique",
            "There is already a feature flag with this key.",
            Some("key")
        )
    );
    assert_eq!(
        refused(json!({"key": "foo bar"})),
        error(
            "invalid_key",
            "Only letters, numbers, hyphens (-) & underscores (_) are allowed.",
            Some("key")
        )
    );
    assert_eq!(
        refused(json!({"name": "no key"})),
        error("required", "This field is required.", Some("key"))
    );
    assert_eq!(
        refused(
            json!({"key": "op", "filters": group(json!([{"key": "a", "type": "person", "operator": "near", "value": "x"}]))})
        ),
        error(
            "invalid_operator",
            "Invalid operator: near",
            Some("filters")
        )
    );
    assert_eq!(
        refused(
            json!({"key": "ty", "filters": group(json!([{"key": "a", "type": "person", "operator": "gt", "value": 5}]))})
        ),
        error(
            "invalid_value",
            "Invalid value for operator gt: 5",
            Some("filters")
        )
    );
    assert_eq!(
        refused(
            json!({"key": "pt", "filters": group(json!([{"key": "a", "type": "event", "value": "x"}]))})
        ),
        error(
            "invalid_choice",
            "\"event\" is not a valid choice.",
            Some("filters")
        )
    );
    let variants = json!({"groups": [{"properties": [], "rollout_percentage": 100}],
        "multivariate": {"variants": [{"key": "a", "rollout_percentage": 50}, {"key": "b", "rollout_percentage": 40}]}});
    assert_eq!(
        refused(json!({"key": "mv", "filters": variants})),
        error(
            "invalid_input",
            "Invalid variant definitions: Variant rollout percentages must sum to 100.",
            Some("filters")
        )
    );
    assert_eq!(
        refused(
            json!({"key": "co", "filters": group(json!([{"key": "id", "type": "cohort", "value": 42}]))})
        ),
        error(
            "cohort_does_not_exist",
            "Cohort with id 42 does not exist",
            Some("filters")
        )
    );
    assert_eq!(
        refused(
            json!({"key": "dep", "filters": group(json!([{"key": "77", "type": "flag", "operator": "flag_evaluates_to", "value": true}]))})
        ),
        error(
            "invalid_input",
            "Flag dependency references non-existent flag with ID 77",
            Some("filters")
        )
    );
    assert_eq!(
        refused(
            json!({"key": "pl", "filters": {"groups": [{"rollout_percentage": 100}], "payloads": {"true": "{not json"}}})
        ),
        error(
            "invalid_input",
            "Payload value is not valid JSON",
            Some("filters")
        )
    );
    // A cycle: b depends on a (id 2), then a is changed to depend on b (id 3).
    create(&server, json!({"key": "a"}));
    create(
        &server,
        json!({"key": "b", "filters": group(json!([{"key": "2", "type": "flag", "operator": "flag_evaluates_to", "value": true}]))}),
    );
    let r = patch(
        &server,
        2,
        json!({"filters": group(json!([{"key": "3", "type": "flag", "operator": "flag_evaluates_to", "value": true}]))}),
    );
    assert_eq!(
        r.json(),
        error(
            "invalid_input",
            "Circular dependency detected: a → b → a",
            Some("filters")
        )
    );
    let r = patch(&server, 2, json!({"deleted": true}));
    assert_eq!(
        r.json(),
        error("invalid_input", "Cannot delete this feature flag because other flags depend on it: b (ID: 3). Please update or delete the dependent flags first.", None)
    );
    let r = call(&server, "POST", FLAGS, PERSONAL_ONE, None);
    assert_eq!(
        r.json(),
        error("required", "This field is required.", Some("key"))
    );
    let r = server.request(
        Req::post(FLAGS, "{nope").header("Authorization", &format!("Bearer {PERSONAL_ONE}")),
    );
    assert_eq!(
        (r.status, r.json()["type"].clone(), r.json()["code"].clone()),
        (400, json!("invalid_request"), json!("parse_error"))
    );
    // Nothing refused reached the file.
    let keys: Vec<Value> = file(&server)["flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["key"].clone())
        .collect();
    assert_eq!(keys, [json!("taken"), json!("a"), json!("b")]);
}

#[test]
fn keys_of_other_projects_and_no_keys_are_refused() {
    let server = Server::start();
    create(&server, json!({"key": "mine"}));
    let r = call(&server, "GET", FLAGS, PERSONAL_TWO, None);
    assert_eq!(
        (r.status, r.json()["code"].clone()),
        (403, json!("permission_denied"))
    );
    let r = call(
        &server,
        "PATCH",
        &format!("{FLAGS}1/"),
        PERSONAL_TWO,
        Some(json!({"active": false})),
    );
    assert_eq!(r.status, 403);
    let r = call(
        &server,
        "POST",
        "/api/projects/999/feature_flags/",
        PERSONAL_TWO,
        Some(json!({"key": "x"})),
    );
    assert_eq!(r.status, 403, "an unknown project answers as another's");
    let r = server.request(Req::get(FLAGS));
    assert_eq!(
        (r.status, r.json()["type"].clone()),
        (401, json!("authentication_error"))
    );
    let r = call(&server, "GET", FLAGS, "phx_wrong", None);
    assert_eq!(r.status, 401);
    // `@current` is the key's own project.
    let r = call(
        &server,
        "GET",
        "/api/projects/@current/feature_flags/",
        PERSONAL_TWO,
        None,
    );
    assert_eq!((r.status, r.json()["count"].clone()), (200, json!(0)));
    assert_eq!(file(&server)["flags"][0]["active"], true);
}

#[test]
fn pages_follow_next_and_previous_links() {
    let tmp = data_dir();
    let flags: Vec<Value> = (1..=205)
        .map(|i| json!({"id": i, "key": format!("f{i}"), "active": i % 2 == 0, "filters": {"groups": []}}))
        .collect();
    let doc = json!({"flags": flags, "group_type_mapping": {}, "cohorts": {}});
    std::fs::write(tmp.path().join("data/flags/1.json"), doc.to_string()).unwrap();
    let mut server = Server::spawn(tmp.path(), &[]);
    server.keep(tmp);
    let get = |path: &str| {
        let r = server.request(
            Req::get(path)
                .header("Authorization", &format!("Bearer {PERSONAL_ONE}"))
                .header("X-Forwarded-Proto", "https"),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    let mut page = get(FLAGS);
    let mut ids = Vec::new();
    let mut pages = 0;
    loop {
        pages += 1;
        assert_eq!(page["count"], 205);
        ids.extend(
            page["results"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["id"].as_i64().unwrap()),
        );
        let Some(next) = page["next"].as_str() else {
            break;
        };
        let path = next
            .strip_prefix("https://localhost")
            .expect("an absolute https URL");
        page = get(path);
    }
    assert_eq!(pages, 3);
    assert_eq!(
        ids,
        (1..=205).rev().collect::<Vec<i64>>(),
        "newest first, each once"
    );
    assert_eq!(
        page["previous"],
        "https://localhost/api/projects/1/feature_flags/?limit=100&offset=100"
    );
    let second = get("/api/projects/1/feature_flags/?limit=100&offset=100");
    assert_eq!(
        second["previous"],
        "https://localhost/api/projects/1/feature_flags/?limit=100"
    );
    assert_eq!(
        second["next"],
        "https://localhost/api/projects/1/feature_flags/?limit=100&offset=200"
    );
    let off = get("/api/projects/1/feature_flags/?active=false&search=F1&limit=5");
    let keys: Vec<&str> = off["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["key"].as_str().unwrap())
        .collect();
    assert_eq!(
        (off["count"].clone(), keys),
        (json!(56), vec!["f199", "f197", "f195", "f193", "f191"])
    );
}
