//! Cohort filters: nested AND/OR groups, negated leaves, `in` / `not_in`, cohorts built on
//! cohorts, and cohorts that cannot be evaluated (missing or cyclic).

use serde_json::{json, Value};

use super::{compile, failed, flag, Request};
use crate::flags::{Evaluation, FailureCause, ProjectRules};

fn cohort_filter(id: Value, operator: &str) -> Value {
    json!({"groups": [{"properties": [{"key": "id", "type": "cohort", "value": id, "operator": operator}],
                       "rollout_percentage": 100}]})
}

fn rules() -> ProjectRules {
    compile(json!({
        "cohorts": {
            "10": {"type": "OR", "values": [{"type": "AND", "values": [
                {"key": "plan", "value": ["pro", "team"], "operator": "exact", "type": "person"},
                {"key": "country", "value": "FR", "operator": "is_not", "type": "person"}
            ]}]},
            "11": {"type": "AND", "values": [
                {"key": "email", "value": "@corp.com", "operator": "icontains", "type": "person", "negation": true}
            ]},
            "12": {"type": "OR", "values": [
                {"type": "AND", "values": [{"key": "id", "type": "cohort", "value": 10}]},
                {"type": "AND", "values": [
                    {"key": "id", "type": "cohort", "value": "11"},
                    {"key": "age", "value": 30, "operator": "gt", "type": "person"}
                ]}
            ]},
            "13": {"type": "OR", "values": [{"type": "AND", "values": [
                {"key": "id", "type": "cohort", "value": 10, "negation": true}
            ]}]},
            "20": {"type": "OR", "values": [{"key": "id", "type": "cohort", "value": 21}]},
            "21": {"type": "OR", "values": [{"key": "id", "type": "cohort", "value": 20}]}
        },
        "flags": [
            flag(1, "paid", cohort_filter(json!(10), "in")),
            flag(2, "not-paid", cohort_filter(json!(10), "not_in")),
            flag(3, "external", cohort_filter(json!(11), "in")),
            flag(4, "nested", cohort_filter(json!("12"), "in")),
            flag(5, "negated", cohort_filter(json!(13), "in")),
            flag(6, "cyclic-cohort", cohort_filter(json!(20), "in")),
            flag(7, "missing-cohort", cohort_filter(json!(99), "in"))
        ]
    }))
}

/// The values of the five evaluable flags, in definition order.
fn values(eval: &Evaluation) -> Vec<(&str, bool)> {
    eval.flags
        .iter()
        .map(|f| (f.key.as_str(), f.enabled))
        .collect()
}

#[test]
fn cohort_membership_for_several_people() {
    let rules = rules();
    let insider = Request::new("u")
        .person(json!({"plan": "Pro", "country": "DE", "email": "a@corp.com", "age": 20}));
    assert_eq!(
        values(&insider.evaluate(&rules)),
        vec![
            ("paid", true),
            ("not-paid", false),
            ("external", false),
            ("nested", true),
            ("negated", false)
        ]
    );
    let outsider =
        Request::new("u").person(json!({"plan": "free", "email": "b@gmail.com", "age": 40}));
    assert_eq!(
        values(&outsider.evaluate(&rules)),
        vec![
            ("paid", false),
            ("not-paid", true),
            ("external", true),
            ("nested", true),
            ("negated", true)
        ]
    );
    let young =
        Request::new("u").person(json!({"plan": "free", "email": "b@gmail.com", "age": 18}));
    assert_eq!(values(&young.evaluate(&rules))[3], ("nested", false));
    let french = Request::new("u").person(json!({"plan": "team", "country": "FR"}));
    assert_eq!(values(&french.evaluate(&rules))[0], ("paid", false));
    // No email at all: the negated icontains leaf holds.
    let anonymous = Request::new("u").person(json!({}));
    assert_eq!(values(&anonymous.evaluate(&rules))[2], ("external", true));
}

#[test]
fn broken_cohorts_fail_their_flags_closed() {
    let rules = rules();
    let eval = Request::new("u")
        .person(json!({"plan": "pro"}))
        .evaluate(&rules);
    assert!(eval.errors);
    assert_eq!(
        failed(&eval),
        vec![
            ("cyclic-cohort", &FailureCause::Unsupported),
            ("missing-cohort", &FailureCause::Unsupported)
        ]
    );
    let warnings: Vec<String> = rules.warnings().iter().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        vec![
            r#"flag "cyclic-cohort": filters.groups[0].properties[0]: cohort 20 is missing, cyclic or refers to a missing cohort"#,
            r#"flag "missing-cohort": filters.groups[0].properties[0]: cohort 99 is missing, cyclic or refers to a missing cohort"#,
        ]
    );
}

#[test]
fn failed_person_lookup_fails_cohort_flags() {
    let eval = Request::new("u").person_unavailable().evaluate(&rules());
    assert!(eval.flags.is_empty());
    assert_eq!(eval.failed.len(), 7);
    assert_eq!(eval.failed[0].cause, FailureCause::PersonProperties);
}
