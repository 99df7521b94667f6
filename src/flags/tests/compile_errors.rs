//! Compile errors name the flag (or cohort) and the field at fault; the demo file compiles
//! and behaves as its names promise.

use std::path::PathBuf;

use serde_json::{json, Value};

use super::{find, keys, outcome, Request};
use crate::flags::{ErrorKind, ProjectRules, ReasonCode::*};

fn error(definitions: Value) -> String {
    ProjectRules::from_value(definitions)
        .expect_err("definitions must be rejected")
        .to_string()
}

/// The one warning of definitions that compile, whose only flag is then left out of
/// every evaluation with `errors` set.
fn warning(definitions: Value) -> String {
    let rules = ProjectRules::from_value(definitions).expect("definitions compile");
    let eval = Request::new("u").evaluate(&rules);
    assert!(eval.flags.is_empty() && eval.errors, "{eval:?}");
    match rules.warnings() {
        [one] => one.to_string(),
        other => panic!("expected one warning: {other:?}"),
    }
}

fn with_filters(filters: Value) -> Value {
    json!({"flags": [{"id": 1, "key": "beta", "active": true, "filters": filters}]})
}

fn with_property(property: Value) -> Value {
    with_filters(json!({"groups": [{"properties": [property], "rollout_percentage": 100}]}))
}

#[test]
fn file_level_errors() {
    let err = ProjectRules::compile(b"{\"flags\": [").expect_err("truncated JSON");
    assert!(matches!(err.kind(), ErrorKind::Json(_)));
    assert_eq!(error(json!([])), r#"expected an object with "flags""#);
    assert_eq!(error(json!({"flags": {}})), "flags: expected an array");
    assert_eq!(
        error(json!({"flags": [{"id": 1, "key": "a"}, {"id": 2}]})),
        "flags[1].key: missing"
    );
    assert_eq!(
        error(json!({"flags": [{"id": 1, "key": "a"}, {"id": 2, "key": "a"}]})),
        r#"flags[1].key: duplicate flag key "a""#
    );
    assert_eq!(
        error(json!({"flags": [{"id": 1, "key": "a"}, {"id": 1, "key": "b"}]})),
        "flags[1].id: flag id 1 is used twice"
    );
    assert_eq!(
        error(json!({"flags": [], "group_type_mapping": {"org": "organization"}})),
        r#"group_type_mapping.org: group type index "org" is not an integer"#
    );
    assert_eq!(
        error(json!({"flags": [], "cohorts": {"x": {"type": "OR", "values": []}}})),
        r#"cohorts.x: cohort id "x" is not an integer"#
    );
}

#[test]
fn flag_errors_name_the_flag_and_field() {
    assert_eq!(
        error(with_filters(
            json!({"groups": [{"properties": []}, {"properties": [{"key": "plan", "operator": "foo", "value": 1}]}]})
        )),
        r#"flag "beta": filters.groups[1].properties[0].operator: unknown operator "foo""#
    );
    assert_eq!(
        error(json!({"flags": [{"id": "one", "key": "beta"}]})),
        r#"flag "beta": id: expected an integer"#
    );
    assert_eq!(
        error(with_property(
            json!({"key": "$pageview", "type": "event", "value": 1})
        )),
        r#"flag "beta": filters.groups[0].properties[0].type: unknown filter type "event""#
    );
    assert_eq!(
        error(with_property(
            json!({"key": "id", "type": "cohort", "value": 1, "operator": "maybe"})
        )),
        r#"flag "beta": filters.groups[0].properties[0].operator: unknown operator "maybe""#
    );
    assert_eq!(
        error(with_property(
            json!({"key": "email", "value": "@x.com", "operator": "ends_with"})
        )),
        r#"flag "beta": filters.groups[0].properties[0].operator: unknown operator "ends_with" (PostHog's flags have no such operator: use "regex")"#
    );
    assert_eq!(
        error(with_property(
            json!({"key": "email", "value": "a", "type": "persn"})
        )),
        r#"flag "beta": filters.groups[0].properties[0].type: unknown filter type "persn" (did you mean "person"?)"#
    );
    // PostHog's own filter type that flagpost does not evaluate switches the flag off.
    assert_eq!(
        warning(with_property(
            json!({"key": "created_at", "value": "2024-01-01", "type": "person_metadata", "operator": "is_date_after"})
        )),
        r#"flag "beta": filters.groups[0].properties[0].type: filter type "person_metadata" is PostHog's, but flagpost does not evaluate it"#
    );
    assert_eq!(
        error(with_property(
            json!({"key": "id", "type": "cohort", "value": "abc"})
        )),
        r#"flag "beta": filters.groups[0].properties[0].value: expected a cohort id"#
    );
    assert_eq!(
        error(with_property(
            json!({"key": "2", "type": "flag", "value": 3, "operator": "flag_evaluates_to"})
        )),
        r#"flag "beta": filters.groups[0].properties[0].value: expected true, false or a variant key"#
    );
    assert_eq!(
        error(with_property(
            json!({"key": "plan", "negation": "yes", "value": 1})
        )),
        r#"flag "beta": filters.groups[0].properties[0].negation: expected a boolean"#
    );
    assert_eq!(
        error(with_filters(
            json!({"groups": [{"rollout_percentage": "50"}]})
        )),
        r#"flag "beta": filters.groups[0].rollout_percentage: expected a number"#
    );
    assert_eq!(
        error(with_filters(
            json!({"multivariate": {"variants": [{"key": "a", "rollout_percentage": 50}, {"key": "b"}]}})
        )),
        r#"flag "beta": filters.multivariate.variants[1].rollout_percentage: missing"#
    );
    assert_eq!(
        error(with_filters(
            json!({"holdout": {"exclusion_percentage": 10}})
        )),
        r#"flag "beta": filters.holdout.id: missing"#
    );
    assert_eq!(
        error(with_filters(json!({"payloads": ["x"]}))),
        r#"flag "beta": filters.payloads: expected an object"#
    );
}

fn demo_file() -> Vec<u8> {
    // The demo ships as `demo-flags.json` here and as the server's `data/flags/1.json`.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    ["demo-flags.json", "data/flags/1.json"]
        .iter()
        .find_map(|name| std::fs::read(root.join(name)).ok())
        .expect("demo flag file present")
}

#[test]
fn demo_file_compiles_cleanly() {
    let rules = ProjectRules::compile(&demo_file()).expect("demo compiles");
    assert!(rules.warnings().is_empty());
    assert_eq!(rules.flag_count(), 6);
    assert!(rules.needs_person_properties());
    assert!(rules.needs_group_properties());
    assert_eq!(
        rules.group_type_mapping().get(&0).map(String::as_str),
        Some("organization")
    );
    assert!(rules.definitions_json()["cohorts"]["5"].is_object());
}

#[test]
fn demo_file_behaves_as_named() {
    let rules = ProjectRules::compile(&demo_file()).expect("demo compiles");
    // new-onboarding (30 %) hashes: user-16 0.106, user-1 0.381.
    let eval = Request::new("user-16").evaluate(&rules);
    assert_eq!(
        keys(&eval),
        vec![
            "new-onboarding",
            "pricing-page-experiment",
            "enterprise-dashboard",
            "org-audit-log",
            "ai-assistant-beta"
        ]
    );
    assert!(find(&eval, "new-onboarding").enabled);
    // Without its group every condition is skipped; PostHog names the last one.
    assert_eq!(
        outcome(&eval, "org-audit-log"),
        (false, None, NoGroupType, Some(1))
    );
    let user_1 = Request::new("user-1")
        .person(json!({"email": "ann@flagpost.dev", "$feature_enrollment/ai-assistant-beta": true}))
        .groups(json!({"organization": "acme"}));
    let eval = user_1.evaluate(&rules);
    assert!(!find(&eval, "new-onboarding").enabled);
    let pricing = find(&eval, "pricing-page-experiment");
    assert_eq!(pricing.variant.as_deref(), Some("monthly-first"));
    assert_eq!(
        pricing.payload,
        Some(json!(
            "{\"headline\":\"Pay as you go\",\"default_period\":\"monthly\"}"
        ))
    );
    assert_eq!(
        outcome(&eval, "enterprise-dashboard"),
        (true, None, ConditionMatch, Some(0))
    );
    // acme is not an enterprise org but hashes to 0.069, inside the 10 % condition.
    assert_eq!(
        outcome(&eval, "org-audit-log"),
        (true, None, ConditionMatch, Some(1))
    );
    assert_eq!(
        outcome(&eval, "ai-assistant-beta"),
        (true, None, SuperConditionValue, Some(0))
    );
    let customer = Request::new("user-2").person(json!({"plan": "Pro", "app_version": "v2.10.1"}));
    assert_eq!(
        outcome(&customer.evaluate(&rules), "enterprise-dashboard"),
        (true, None, ConditionMatch, Some(1))
    );
    let outdated = Request::new("user-2").person(json!({"plan": "pro", "app_version": "2.3.9"}));
    assert_eq!(
        outcome(&outdated.evaluate(&rules), "enterprise-dashboard"),
        (false, None, NoConditionMatch, Some(1))
    );
}
