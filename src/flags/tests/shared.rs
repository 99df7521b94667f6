//! What one request computes once and shares: person tests that several filters make,
//! the holdout hash, and the hashes of conditions that bucket by another aggregation.
//! Each filter must still get the answer it would get alone.

use serde_json::json;

use super::{compile, outcome, Request};
use crate::flags::ReasonCode::*;

fn url_test(kind: &str, operator: &str) -> serde_json::Value {
    json!({"key": "$current_url", "type": kind, "group_type_index": 0,
           "operator": operator, "value": "/insights"})
}

fn one_condition(id: i64, key: &str, filter: serde_json::Value) -> serde_json::Value {
    json!({"id": id, "key": key, "active": true, "deleted": false, "filters": {
        "groups": [{"properties": [filter], "rollout_percentage": 100}]}})
}

#[test]
fn a_shared_person_test_answers_every_filter_that_makes_it() {
    let mut negated = url_test("person", "regex");
    negated["negation"] = true.into();
    let cohort = |id: i64| json!({"key": "id", "type": "cohort", "value": id});
    let rules = compile(json!({
        "group_type_mapping": {"0": "organization"},
        "cohorts": {
            "5": {"type": "AND", "values": [negated]},
            "6": {"type": "AND", "values": [url_test("group", "regex")]}
        },
        "flags": [
            one_condition(1, "first", url_test("person", "regex")),
            one_condition(2, "second", url_test("person", "regex")),
            one_condition(3, "opposite", url_test("person", "not_regex")),
            one_condition(4, "negated-in-cohort", cohort(5)),
            {"id": 5, "key": "group-page", "active": true, "deleted": false, "filters": {
                "aggregation_group_type_index": 0,
                "groups": [{"properties": [url_test("group", "regex")], "rollout_percentage": 100}]}},
            one_condition(6, "group-typed-in-cohort", cohort(6)),
        ]
    }));
    let request = Request::new("user-31")
        .person(json!({"$current_url": "https://app.example.com/insights"}))
        .groups(json!({"organization": "acme"}))
        .group_properties(
            "organization",
            Some(json!({"$current_url": "https://app.example.com/home"})),
        );
    let eval = request.evaluate(&rules);
    let enabled = |key| outcome(&eval, key).0;
    assert!(enabled("first"));
    assert!(enabled("second"));
    assert!(!enabled("opposite"));
    assert!(!enabled("negated-in-cohort"));
    // The group filter reads the organization's page, the cohort leaf the person's.
    assert!(!enabled("group-page"));
    assert!(enabled("group-typed-in-cohort"));
    // Another person in the same file: nothing of the first request carries over.
    let other = Request::new("user-32").person(json!({"$current_url": "/home"}));
    let eval = other.evaluate(&rules);
    let enabled = |key| outcome(&eval, key).0;
    assert_eq!(
        [
            enabled("first"),
            enabled("second"),
            enabled("opposite"),
            enabled("negated-in-cohort")
        ],
        [false, false, true, true]
    );
}

#[test]
fn the_holdout_hash_is_shared_only_by_the_same_id() {
    let held = |id: i64, key: &str, percentage: f64, group: bool| {
        let mut filters = json!({"groups": [{"rollout_percentage": 100}],
                                 "holdout": {"id": 7, "exclusion_percentage": percentage}});
        if group {
            filters["aggregation_group_type_index"] = 0.into();
        }
        json!({"id": id, "key": key, "active": true, "deleted": false, "filters": filters})
    };
    // holdout-acme hashes to 0.9269703562845474, holdout-user-31 to 0.0194745413007599.
    let rules = compile(json!({
        "group_type_mapping": {"0": "organization"},
        "flags": [
            held(1, "org-held", 95.0, true),
            held(2, "person-held", 10.0, false),
            held(3, "person-not-held", 1.0, false),
            held(4, "org-not-held", 92.0, true),
        ]
    }));
    let eval = Request::new("user-31")
        .groups(json!({"organization": "acme"}))
        .evaluate(&rules);
    let code = |key| outcome(&eval, key).2;
    assert_eq!(code("org-held"), HoldoutConditionValue);
    assert_eq!(code("person-held"), HoldoutConditionValue);
    assert_eq!(code("person-not-held"), ConditionMatch);
    assert_eq!(code("org-not-held"), ConditionMatch);
}

#[test]
fn conditions_on_another_aggregation_keep_their_own_hashes() {
    // "m.acme" hashes to 0.9289013892470663 and "m.user-31" to 0.5237834173462664: the
    // organization is out at 92 % and in at 93 %, the person out at 50 %.
    let on = |group: Option<i64>, rollout: f64| match group {
        Some(index) => {
            json!({"aggregation_group_type_index": index, "rollout_percentage": rollout})
        }
        None => json!({"rollout_percentage": rollout}),
    };
    let rules = compile(json!({
        "group_type_mapping": {"0": "organization"},
        "flags": [{"id": 1, "key": "m", "active": true, "deleted": false, "filters": {
            "groups": [on(Some(0), 92.0), on(None, 50.0), on(Some(0), 93.0)]}}]
    }));
    let eval = Request::new("user-31")
        .groups(json!({"organization": "acme"}))
        .evaluate(&rules);
    assert_eq!(outcome(&eval, "m"), (true, None, ConditionMatch, Some(2)));
    let eval = Request::new("user-31").evaluate(&rules);
    assert_eq!(
        outcome(&eval, "m"),
        (false, None, OutOfRolloutBound, Some(1))
    );
}
