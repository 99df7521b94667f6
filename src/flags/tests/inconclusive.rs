//! Edge mode's verdicts: which flags an edge leaves to upstream, class by class (a
//! property it lacks, `is_not_set` on one, a static cohort, experience continuity, an
//! unknown group type, dependencies on any of those), and which it decides itself.

use serde_json::{json, Value};

use super::{compile, flag, Request};
use crate::flags::ProjectRules;

fn person_flag(id: i64, key: &str, property: &str, operator: &str, value: Value) -> Value {
    flag(
        id,
        key,
        json!({"groups": [{"properties": [
            {"key": property, "type": "person", "operator": operator, "value": value}
        ], "rollout_percentage": 100}]}),
    )
}

fn rules() -> ProjectRules {
    compile(json!({
        "group_type_mapping": {"0": "company"},
        "cohorts": {"7": {"type": "OR", "values": [
            {"key": "plan", "type": "person", "operator": "exact", "value": ["pro"]}
        ]}},
        "flags": [
            person_flag(1, "email", "email", "icontains", json!("@corp")),
            person_flag(2, "unset", "email", "is_not_set", json!("is_not_set")),
            flag(3, "rollout", json!({"groups": [{"properties": [], "rollout_percentage": 40}]})),
            flag(4, "static-cohort", json!({"groups": [{"properties": [
                {"key": "id", "type": "cohort", "value": 99}
            ]}]})),
            flag(5, "cohort", json!({"groups": [{"properties": [
                {"key": "id", "type": "cohort", "value": 7}
            ]}]})),
            {"id": 6, "key": "continuity", "active": true, "version": 1,
             "ensure_experience_continuity": true,
             "filters": {"groups": [{"properties": [], "rollout_percentage": 50}]}},
            flag(7, "depends", json!({"groups": [{"properties": [
                {"key": "email", "type": "flag", "operator": "flag_evaluates_to", "value": true}
            ]}]})),
            flag(8, "depends-on-rollout", json!({"groups": [{"properties": [
                {"key": "rollout", "type": "flag", "operator": "flag_evaluates_to", "value": true}
            ]}]})),
            flag(9, "company", json!({"aggregation_group_type_index": 0, "groups": [{"properties": [
                {"key": "size", "type": "group", "group_type_index": 0, "operator": "gt", "value": 10}
            ], "rollout_percentage": 100}]})),
            flag(10, "unknown-group", json!({"aggregation_group_type_index": 3,
                "groups": [{"properties": [], "rollout_percentage": 100}]})),
            flag(11, "distinct", json!({"groups": [{"properties": [
                {"key": "distinct_id", "type": "person", "operator": "exact", "value": ["u1"]}
            ]}]}))
        ]
    }))
}

/// The keys an edge leaves to upstream for `req`.
fn left(rules: &ProjectRules, req: &Request) -> Vec<String> {
    let ctx = req.context();
    let outcomes = rules.outcomes(&ctx);
    let verdicts = rules.inconclusive(&ctx, &outcomes);
    rules
        .keys()
        .zip(verdicts)
        .filter(|(_, out)| *out)
        .map(|(k, _)| k.to_owned())
        .collect()
}

#[test]
fn what_the_edge_lacks_goes_upstream() {
    let rules = rules();
    let bare = left(&rules, &Request::new("u1"));
    assert_eq!(
        bare,
        [
            "email",
            "unset",
            "static-cohort",
            "cohort",
            "continuity",
            "depends",
            "unknown-group"
        ]
    );
}

#[test]
fn what_the_edge_has_it_decides() {
    let rules = rules();
    let known = Request::new("u1")
        .person(json!({"email": "a@corp.com", "plan": "free"}))
        .groups(json!({"company": "c1"}))
        .group_properties("company", Some(json!({"size": 50})));
    assert_eq!(
        left(&rules, &known),
        ["static-cohort", "continuity", "unknown-group"]
    );
    // The group present without the property: upstream may have it stored.
    let no_size = Request::new("u1")
        .person(json!({"email": "a@corp.com", "plan": "free"}))
        .groups(json!({"company": "c1"}))
        .group_properties("company", Some(json!({})));
    assert!(left(&rules, &no_size).contains(&"company".to_owned()));
}

#[test]
fn a_failed_person_lookup_leaves_person_flags_to_upstream() {
    let rules = rules();
    let failed = left(&rules, &Request::new("u1").person_unavailable());
    for key in ["email", "unset", "cohort", "distinct", "depends"] {
        assert!(failed.contains(&key.to_owned()), "{key} in {failed:?}");
    }
    assert!(!failed.contains(&"rollout".to_owned()));
    assert!(!failed.contains(&"depends-on-rollout".to_owned()));
}

#[test]
fn an_anonymous_id_alone_sends_nothing_upstream() {
    let plain = compile(
        json!({"flags": [flag(1, "a", json!({"groups": [{"properties": [], "rollout_percentage": 50}]}))]}),
    );
    assert!(left(&plain, &Request::new("u1").anon("anon")).is_empty());
}
