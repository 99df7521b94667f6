//! What the management API (and so the console, which saves through it) refuses that
//! PostHog's own API stores or words differently (issue 38): percentages outside 0-100
//! on create and on PATCH, a regex that does not compile, operators no flag may use,
//! and anything else `flagpost check` would refuse, such as a misspelt field. Each is
//! PostHog's error shape (`validation_error`, `attr: "filters"`) with PostHog's message
//! where it has one, and nothing reaches the file.

use serde_json::{json, Value};

use super::{call, create, error, file, patch, FLAGS};
use crate::util::*;

fn group(rollout: Value, properties: Value) -> Value {
    json!({"groups": [{"properties": properties, "rollout_percentage": rollout}]})
}

#[test]
fn what_cannot_work_is_refused_and_nothing_is_written() {
    let server = Server::start();
    let made = create(
        &server,
        json!({"key": "kept", "filters": group(json!(30), json!([]))}),
    );
    let id = made["id"].as_i64().unwrap();
    let before = std::fs::read(server.data().join("flags/1.json")).unwrap();
    let refused = |method: &str, body: Value| {
        let r = match method {
            "POST" => call(&server, "POST", FLAGS, PERSONAL_ONE, Some(body)),
            _ => patch(&server, id, body),
        };
        assert_eq!(r.status, 400, "{}", r.text());
        r.json()
    };
    let invalid = |detail: &str| error("invalid_input", detail, Some("filters"));
    let email = |op: &str, value: Value| json!([{"key": "email", "type": "person", "operator": op, "value": value}]);

    let cases = [
        (
            "POST",
            json!({"key": "big", "filters": group(json!(130), json!([]))}),
            invalid("groups[0].rollout_percentage must be between 0 and 100, got 130"),
        ),
        (
            "PATCH",
            json!({"filters": group(json!(-20), json!([]))}),
            invalid("groups[0].rollout_percentage must be between 0 and 100, got -20"),
        ),
        (
            "PATCH",
            json!({"filters": group(json!("30"), json!([]))}),
            invalid("groups[0].rollout_percentage must be a number or null, got str"),
        ),
        (
            "POST",
            json!({"key": "mv", "filters": {"groups": [{"properties": []}],
                "multivariate": {"variants": [{"key": "a", "rollout_percentage": 130}, {"key": "b", "rollout_percentage": -30}]}}}),
            invalid("multivariate.variants[0].rollout_percentage must be between 0 and 100, got 130"),
        ),
        (
            "POST",
            json!({"key": "re", "filters": group(json!(100), email("regex", json!("@acme\\.com($")))}),
            invalid("groups[0].properties[0].value: invalid regex pattern"),
        ),
        (
            "PATCH",
            json!({"filters": group(json!(100), email("not_regex", json!("(")))}),
            invalid("groups[0].properties[0].value: invalid regex pattern"),
        ),
        (
            "POST",
            json!({"key": "ew", "filters": group(json!(100), email("ends_with", json!("@acme.com")))}),
            error(
                "invalid_operator",
                "Invalid operator: ends_with (PostHog's flags have no such operator: use \"regex\")",
                Some("filters"),
            ),
        ),
        (
            "PATCH",
            json!({"filters": group(json!(100), email("icontain", json!("acme")))}),
            error(
                "invalid_operator",
                "Invalid operator: icontain (did you mean \"icontains\"?)",
                Some("filters"),
            ),
        ),
        (
            "POST",
            json!({"key": "bt", "filters": group(json!(100), email("between", json!([1, 2])))}),
            error(
                "unsupported_operator",
                "Unsupported operator for feature flags: between",
                Some("filters"),
            ),
        ),
        (
            "PATCH",
            json!({"filters": {"groups": [{"properties": [], "rollout_percentge": 30}]}}),
            invalid("groups[0].rollout_percentge: unknown field (did you mean \"rollout_percentage\"?)"),
        ),
        (
            "POST",
            json!({"key": "vf", "filters": {"groups": [{"properties": []}],
                "multivariate": {"variants": [{"key": "a", "rollout_percentage": 100, "weight": 1}]}}}),
            invalid("multivariate.variants[0].weight: unknown field"),
        ),
    ];
    for (method, body, expected) in cases {
        assert_eq!(refused(method, body.clone()), expected, "{method} {body}");
    }
    let after = std::fs::read(server.data().join("flags/1.json")).unwrap();
    assert_eq!(after, before, "nothing refused reached the file");
    let served = call(&server, "GET", &format!("{FLAGS}{id}/"), PERSONAL_ONE, None).json();
    assert_eq!(served["filters"]["groups"][0]["rollout_percentage"], 30);
}

/// PostHog stores `min` and `max` as `gte` and `lte`; the file holds what serving reads.
#[test]
fn posthogs_operator_aliases_are_stored_as_what_they_mean() {
    let server = Server::start();
    let props = json!([{"key": "age", "type": "person", "operator": "min", "value": "18"}]);
    let made = create(
        &server,
        json!({"key": "adults", "filters": group(json!(100), props)}),
    );
    assert_eq!(
        made["filters"]["groups"][0]["properties"][0]["operator"],
        "gte"
    );
    let stored = file(&server)["flags"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["key"] == "adults")
        .cloned()
        .unwrap();
    assert_eq!(
        stored["filters"]["groups"][0]["properties"][0]["operator"],
        "gte"
    );
}
