//! Person flags end to end: rollouts, variants, conditions and their reasons, payloads.

use serde_json::json;

use super::{compile, find, flag, outcome, rollout_flag, single, three_way, Request};
use crate::flags::hash::{flag_hash, VARIANT_SALT};
use crate::flags::ReasonCode::*;

#[test]
fn worked_examples_through_evaluation() {
    let user_17 = Request::new("user-17");
    let eval = user_17.evaluate(&single(rollout_flag("beta-search", 1.0)));
    assert_eq!(
        outcome(&eval, "beta-search"),
        (true, None, ConditionMatch, Some(0))
    );
    let eval = user_17.evaluate(&single(rollout_flag("beta-search", 0.0)));
    assert_eq!(
        outcome(&eval, "beta-search"),
        (false, None, OutOfRolloutBound, Some(0))
    );

    let user_105 = Request::new("user-105");
    let eval = user_105.evaluate(&single(rollout_flag("beta-search-rollout", 28.0)));
    assert!(!find(&eval, "beta-search-rollout").enabled);
    let eval = user_105.evaluate(&single(rollout_flag("beta-search-rollout", 29.0)));
    assert!(find(&eval, "beta-search-rollout").enabled);
}

#[test]
fn null_rollout_is_everyone_and_empty_id_hashes_to_zero() {
    let rules = single(flag(
        1,
        "all",
        json!({"groups": [{"properties": [], "rollout_percentage": null}]}),
    ));
    assert!(find(&Request::new("anyone").evaluate(&rules), "all").enabled);
    // An empty id hashes to 0.0, which is inside even a 0 % rollout (`<=`).
    let eval = Request::new("").evaluate(&single(rollout_flag("zero", 0.0)));
    assert!(find(&eval, "zero").enabled);
}

#[test]
fn variants_for_specific_ids() {
    let rules = single(flag(
        1,
        "checkout-test",
        json!({"groups": [{"properties": [], "rollout_percentage": 100}], "multivariate": three_way()}),
    ));
    // (id, variant hash, variant): boundaries are 0.34, 0.67 and 1.0.
    let expected = [
        ("user-1", 0.6535080733298617, "test-a"),
        ("user-2", 0.2677111682253545, "control"),
        ("user-6", 0.6536694179646804, "test-a"),
        ("user-10", 0.827303344717086, "test-b"),
        ("", 0.0, "control"),
    ];
    for (id, hash, variant) in expected {
        assert_eq!(flag_hash("checkout-test", id, VARIANT_SALT), hash, "{id}");
        let eval = Request::new(id).evaluate(&rules);
        assert_eq!(
            outcome(&eval, "checkout-test"),
            (true, Some(variant.into()), ConditionMatch, Some(0))
        );
    }
}

#[test]
fn variant_distribution_follows_the_percentages() {
    let rules = single(flag(
        1,
        "checkout-test",
        json!({"groups": [{"rollout_percentage": 100}], "multivariate": three_way()}),
    ));
    let mut counts: std::collections::HashMap<String, i32> = std::collections::HashMap::new();
    for i in 0..10_000 {
        let eval = Request::new(&format!("user-{i}")).evaluate(&rules);
        let variant = find(&eval, "checkout-test")
            .variant
            .clone()
            .unwrap_or_default();
        *counts.entry(variant).or_insert(0) += 1;
    }
    // Exact counts for this id set (computed independently), and within 2 % of the target.
    assert_eq!(counts["control"], 3453);
    assert_eq!(counts["test-a"], 3246);
    assert_eq!(counts["test-b"], 3301);
    for (variant, target) in [("control", 3400), ("test-a", 3300), ("test-b", 3300)] {
        assert!((counts[variant] - target).abs() < 200, "{variant}");
    }
}

#[test]
fn rounding_past_the_last_boundary_gives_true_without_variant() {
    let rules = single(flag(
        1,
        "thirds",
        json!({"groups": [{"rollout_percentage": 100}], "multivariate": {"variants": [
        {"key": "a", "rollout_percentage": 33.33}, {"key": "b", "rollout_percentage": 33.33},
        {"key": "c", "rollout_percentage": 33.33}]}}),
    ));
    // Variant hash 0.9999638096756417 is past the last boundary, 0.9999.
    let eval = Request::new("user-3453").evaluate(&rules);
    assert_eq!(
        outcome(&eval, "thirds"),
        (true, None, ConditionMatch, Some(0))
    );
}

#[test]
fn first_matching_condition_wins_and_overrides_need_a_defined_variant() {
    let rules = single(flag(
        1,
        "checkout-test",
        json!({
            "multivariate": three_way(),
            "groups": [
                {"properties": [{"key": "plan", "value": "pro", "type": "person"}], "rollout_percentage": 100, "variant": "test-b"},
                {"properties": [{"key": "plan", "value": "team", "type": "person"}], "rollout_percentage": 100, "variant": "nonexistent"},
                {"properties": [], "rollout_percentage": 100, "variant": "test-a"}
            ]
        }),
    ));
    let pro = Request::new("user-2")
        .person(json!({"plan": "pro"}))
        .evaluate(&rules);
    assert_eq!(
        outcome(&pro, "checkout-test"),
        (true, Some("test-b".into()), ConditionMatch, Some(0))
    );
    // An override naming no variant falls back to the hash: user-2 hashes to control.
    let team = Request::new("user-2")
        .person(json!({"plan": "team"}))
        .evaluate(&rules);
    assert_eq!(
        outcome(&team, "checkout-test"),
        (true, Some("control".into()), ConditionMatch, Some(1))
    );
    let other = Request::new("user-2").evaluate(&rules);
    assert_eq!(
        outcome(&other, "checkout-test"),
        (true, Some("test-a".into()), ConditionMatch, Some(2))
    );
    assert_eq!(
        find(&other, "checkout-test").reason.description,
        "Matched condition set 3"
    );
}

#[test]
fn rollout_miss_continues_and_outranks_a_filter_miss() {
    // "gated" rollout hashes: user-1 0.6766, user-5 0.3457.
    let filters = json!({"groups": [
        {"properties": [{"key": "plan", "value": "pro"}], "rollout_percentage": 100},
        {"properties": [], "rollout_percentage": 50},
        {"properties": [{"key": "beta", "value": true}], "rollout_percentage": 100}
    ]});
    let rules = single(flag(1, "gated", filters.clone()));
    let eval = Request::new("user-1").evaluate(&rules);
    assert_eq!(
        outcome(&eval, "gated"),
        (false, None, OutOfRolloutBound, Some(1))
    );
    assert_eq!(
        find(&eval, "gated").reason.description,
        "Out of rollout bound"
    );
    let eval = Request::new("user-1")
        .person(json!({"beta": "true"}))
        .evaluate(&rules);
    assert_eq!(
        outcome(&eval, "gated"),
        (true, None, ConditionMatch, Some(2))
    );
    let eval = Request::new("user-5").evaluate(&rules);
    assert_eq!(
        outcome(&eval, "gated"),
        (true, None, ConditionMatch, Some(1))
    );

    let mut early = filters;
    early["early_exit"] = json!(true);
    let rules = single(flag(1, "gated", early));
    let eval = Request::new("user-1")
        .person(json!({"beta": "true"}))
        .evaluate(&rules);
    assert_eq!(
        outcome(&eval, "gated"),
        (false, None, OutOfRolloutBound, Some(1))
    );
}

#[test]
/// PostHog ranks the misses and, among equals, reports the last condition.
fn no_condition_match_reports_the_last_condition() {
    let rules = single(flag(
        1,
        "pros",
        json!({"groups": [
            {"properties": [{"key": "plan", "value": "pro"}]},
            {"properties": [{"key": "plan", "value": "team"}]}
        ]}),
    ));
    let eval = Request::new("u").evaluate(&rules);
    assert_eq!(
        outcome(&eval, "pros"),
        (false, None, NoConditionMatch, Some(1))
    );
    assert_eq!(
        find(&eval, "pros").reason.description,
        "No matching condition set"
    );
    // No condition at all: PostHog's floor reason, with no condition.
    let eval = Request::new("u").evaluate(&single(flag(1, "empty", json!({}))));
    assert_eq!(outcome(&eval, "empty"), (false, None, NoGroupType, None));
}

#[test]
fn payloads_only_when_enabled() {
    let rules = compile(json!({"flags": [
        flag(1, "checkout-test", json!({"groups": [{"rollout_percentage": 100}], "multivariate": three_way(),
            "payloads": {"control": "{\"color\":\"blue\"}", "test-a": {"color": "red"}}})),
        flag(2, "banner", json!({"groups": [{"properties": [{"key": "plan", "value": "pro"}]}],
            "payloads": {"true": "{\"text\":\"hi\"}"}}))
    ]}));
    let eval = Request::new("user-2")
        .person(json!({"plan": "pro"}))
        .evaluate(&rules);
    assert_eq!(
        find(&eval, "checkout-test").payload,
        Some(json!("{\"color\":\"blue\"}"))
    );
    assert_eq!(
        find(&eval, "banner").payload,
        Some(json!("{\"text\":\"hi\"}"))
    );
    let eval = Request::new("user-1").evaluate(&rules);
    assert_eq!(
        find(&eval, "checkout-test").payload,
        Some(json!({"color": "red"}))
    );
    assert_eq!(
        find(&eval, "banner").payload,
        None,
        "disabled flags carry no payload"
    );
    let eval = Request::new("user-10").evaluate(&rules);
    assert_eq!(
        find(&eval, "checkout-test").payload,
        None,
        "test-b has none"
    );
}
