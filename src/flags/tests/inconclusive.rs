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
    left_named(rules, req, None)
}

/// [`left`] for a request naming `named` in `flag_keys`.
fn left_named(rules: &ProjectRules, req: &Request, named: Option<&[&str]>) -> Vec<String> {
    let ctx = req.context();
    let mut outcomes = rules.outcomes_at_edge(&ctx);
    if let Some(named) = named {
        let named: Vec<String> = named.iter().map(|k| k.to_string()).collect();
        outcomes.retain_keys(&named);
    }
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

#[test]
fn a_named_request_checks_what_its_flags_read_and_nothing_else() {
    let rules = rules();
    let bare = Request::new("u1");
    // "depends" reads the verdict of "email", which is not named: both are checked.
    // An unsupported flag ("static-cohort") reads inconclusive whether named or not.
    assert_eq!(
        left_named(&rules, &bare, Some(&["depends", "rollout"])),
        ["email", "static-cohort", "depends"]
    );
    assert_eq!(
        left_named(&rules, &bare, Some(&["rollout"])),
        ["static-cohort"]
    );
    assert_eq!(
        left_named(&rules, &bare, Some(&["cohort"])),
        ["static-cohort", "cohort"]
    );
}

#[test]
fn conditions_on_a_group_read_nothing_when_the_request_lacks_the_group() {
    let rules = compile(json!({
        "group_type_mapping": {"0": "company"},
        "flags": [flag(1, "company", json!({"aggregation_group_type_index": 0, "groups": [
            {"properties": [
                {"key": "size", "type": "group", "group_type_index": 0, "operator": "gt", "value": 10},
                {"key": "email", "type": "person", "operator": "is_set", "value": "is_set"}
            ], "rollout_percentage": 100}
        ]}))]
    }));
    assert!(left(&rules, &Request::new("u1").person_unavailable()).is_empty());
    let in_company = Request::new("u1")
        .groups(json!({"company": "c1"}))
        .group_properties("company", Some(json!({"size": 50})));
    assert_eq!(left(&rules, &in_company), ["company"]);
    let known = in_company.person(json!({"email": "a@corp.com"}));
    assert!(left(&rules, &known).is_empty());
    let failed = Request::new("u1")
        .person(json!({"email": "a@corp.com"}))
        .groups(json!({"company": "c1"}))
        .group_properties("company", None);
    assert_eq!(left(&rules, &failed), ["company"]);
}

#[test]
fn early_access_reads_the_enrollment_and_the_legacy_keys() {
    let rules = compile(json!({"flags": [
        flag(1, "notebooks", json!({"feature_enrollment": true,
            "groups": [{"properties": [], "rollout_percentage": 0}]})),
        flag(2, "legacy", json!({
            "super_groups": [{"properties": [
                {"key": "$early/legacy", "type": "person", "operator": "exact", "value": ["true"]}
            ], "rollout_percentage": 100}],
            "groups": [{"properties": [], "rollout_percentage": 100}]}))
    ]}));
    assert_eq!(left(&rules, &Request::new("u1")), ["notebooks", "legacy"]);
    let enrolled = Request::new("u1")
        .person(json!({"$feature_enrollment/notebooks": true, "$early/legacy": "true"}));
    assert!(left(&rules, &enrolled).is_empty());
}

#[test]
fn rules_reading_more_keys_than_the_stack_holds_check_each() {
    let flags: Vec<Value> = (0..100)
        .map(|n| {
            person_flag(
                n + 1,
                &format!("f{n}"),
                &format!("k{n}"),
                "is_set",
                json!("is_set"),
            )
        })
        .collect();
    let rules = compile(json!({ "flags": flags }));
    let even: serde_json::Map<String, Value> = (0..100)
        .step_by(2)
        .map(|n| (format!("k{n}"), json!(1)))
        .collect();
    let left = left(&rules, &Request::new("u1").person(Value::Object(even)));
    let odd: Vec<String> = (1..100).step_by(2).map(|n| format!("f{n}")).collect();
    assert_eq!(left, odd);
}

#[test]
fn verdicts_do_not_depend_on_what_the_evaluation_noted() {
    let rules = rules();
    let requests = [
        Request::new("u1"),
        Request::new("u1").person_unavailable(),
        Request::new("u1").person(json!({"email": "a@corp.com"})),
        Request::new("u1")
            .person(json!({"email": "a@corp.com", "plan": "free"}))
            .groups(json!({"company": "c1"}))
            .group_properties("company", Some(json!({"size": 50}))),
    ];
    for req in &requests {
        let ctx = req.context();
        let noted = rules.inconclusive(&ctx, &rules.outcomes_at_edge(&ctx));
        let looked_up = rules.inconclusive(&ctx, &rules.outcomes(&ctx));
        assert_eq!(noted, looked_up, "{:?}", req.person);
    }
}
