//! Group flags: bucketing by the request's group key, `no_group_type`, and property filters
//! that read the group's properties instead of the person's.

use serde_json::json;

use super::{compile, find, flag, keys, outcome, Request};
use crate::flags::{FailureCause, ProjectRules, ReasonCode::*};

fn org_flags() -> ProjectRules {
    compile(json!({
        "group_type_mapping": {"0": "organization", "1": "company"},
        "flags": [
            // Rollout hashes of "org-rollout": acme 0.6604, 42 0.5832.
            flag(1, "org-rollout", json!({"aggregation_group_type_index": 0,
                "groups": [{"properties": [], "rollout_percentage": 60}]})),
            flag(2, "enterprise", json!({"aggregation_group_type_index": 0,
                "groups": [{"properties": [{"key": "plan", "value": "enterprise", "type": "group", "group_type_index": 0}],
                            "rollout_percentage": 100}]})),
            flag(3, "unmapped", json!({"aggregation_group_type_index": 5,
                "groups": [{"rollout_percentage": 100}]}))
        ]
    }))
}

#[test]
fn group_flags_bucket_by_the_group_key() {
    let rules = org_flags();
    let acme = Request::new("user-17").groups(json!({"organization": "acme"}));
    assert_eq!(
        outcome(&acme.evaluate(&rules), "org-rollout"),
        (false, None, OutOfRolloutBound, Some(0))
    );
    for key in [json!("42"), json!(42)] {
        let eval = Request::new("anyone")
            .groups(json!({"organization": key}))
            .evaluate(&rules);
        assert_eq!(
            outcome(&eval, "org-rollout"),
            (true, None, ConditionMatch, Some(0)),
            "{key}"
        );
    }
}

#[test]
fn a_missing_group_is_no_group_type() {
    let rules = org_flags();
    for groups in [
        json!({}),
        json!({"company": "acme"}),
        json!({"organization": null}),
        json!({"organization": ""}),
    ] {
        let eval = Request::new("user-17")
            .groups(groups.clone())
            .evaluate(&rules);
        assert_eq!(
            outcome(&eval, "org-rollout"),
            (false, None, NoGroupType, Some(0)),
            "{groups}"
        );
        assert_eq!(
            find(&eval, "org-rollout").reason.description,
            "No group type"
        );
    }
    let eval = Request::new("u")
        .groups(json!({"organization": "acme"}))
        .evaluate(&rules);
    assert_eq!(
        outcome(&eval, "unmapped"),
        (false, None, NoGroupType, Some(0))
    );
}

#[test]
fn group_filters_read_group_properties() {
    let rules = org_flags();
    assert!(rules.needs_group_properties());
    assert!(!rules.needs_person_properties());
    let request = |props| {
        Request::new("u")
            .person(json!({"plan": "enterprise"}))
            .groups(json!({"organization": "acme"}))
            .group_properties("organization", props)
    };
    let eval = request(Some(json!({"plan": "Enterprise"}))).evaluate(&rules);
    assert_eq!(
        outcome(&eval, "enterprise"),
        (true, None, ConditionMatch, Some(0))
    );
    let eval = request(Some(json!({"plan": "free"}))).evaluate(&rules);
    assert_eq!(
        outcome(&eval, "enterprise"),
        (false, None, NoConditionMatch, Some(0))
    );
    // No stored properties for the type at all: the person's plan does not leak in.
    let eval = Request::new("u")
        .person(json!({"plan": "enterprise"}))
        .groups(json!({"organization": "acme"}))
        .evaluate(&rules);
    assert!(!find(&eval, "enterprise").enabled);
}

#[test]
fn failed_group_lookup_leaves_out_flags_reading_it() {
    let rules = org_flags();
    let eval = Request::new("u")
        .groups(json!({"organization": 42}))
        .group_properties("organization", None)
        .evaluate(&rules);
    assert_eq!(keys(&eval), vec!["org-rollout", "unmapped"]);
    assert!(eval.errors);
    assert_eq!(eval.failed.len(), 1);
    assert_eq!(eval.failed[0].key, "enterprise");
    assert_eq!(
        eval.failed[0].cause,
        FailureCause::GroupProperties("organization".into())
    );
    // Without the group in the request nothing is read, so nothing fails.
    let eval = Request::new("u")
        .group_properties("organization", None)
        .evaluate(&rules);
    assert!(!eval.errors);
    assert_eq!(
        outcome(&eval, "enterprise"),
        (false, None, NoGroupType, Some(0))
    );
}

#[test]
fn group_type_mapping_is_exposed() {
    let rules = org_flags();
    let mapping: Vec<(i64, &str)> = rules
        .group_type_mapping()
        .iter()
        .map(|(i, n)| (*i, n.as_str()))
        .collect();
    assert_eq!(mapping, vec![(0, "organization"), (1, "company")]);
}
