//! What happens around the conditions: holdouts, early access (enrollment and legacy super
//! groups), experience continuity, inactive and deleted flags, failed person lookups.

use serde_json::json;

use super::{compile, failed, find, flag, keys, outcome, rollout_flag, single, three_way, Request};
use crate::flags::{FailureCause, ReasonCode::*};

#[test]
fn holdout_members_get_the_holdout_variant() {
    let held = |percentage: f64| {
        single(flag(
            9,
            "held-flag",
            json!({"groups": [{"rollout_percentage": 100}], "multivariate": three_way(),
            "holdout": {"id": 7, "exclusion_percentage": percentage}}),
        ))
    };
    // holdout-user-31 hashes to 0.0194745413007599.
    let eval = Request::new("user-31").evaluate(&held(10.0));
    assert_eq!(
        outcome(&eval, "held-flag"),
        (true, Some("holdout-7".into()), HoldoutConditionValue, None)
    );
    assert_eq!(
        find(&eval, "held-flag").reason.description,
        "Holdout condition value"
    );
    let eval = Request::new("user-31").evaluate(&held(1.0));
    assert_eq!(find(&eval, "held-flag").reason.code, ConditionMatch);
    // holdout-user-1 is 0.178 (out at 10 %); its variant hash 0.861 picks test-b.
    let eval = Request::new("user-1").evaluate(&held(10.0));
    assert_eq!(
        outcome(&eval, "held-flag"),
        (true, Some("test-b".into()), ConditionMatch, Some(0))
    );
}

#[test]
fn legacy_holdout_groups_are_understood() {
    let rules = single(flag(
        9,
        "held-flag",
        json!({"groups": [{"rollout_percentage": 100}],
        "holdout_groups": [{"properties": [], "rollout_percentage": 10, "variant": "holdout-7"}]}),
    ));
    let eval = Request::new("user-31").evaluate(&rules);
    assert_eq!(
        outcome(&eval, "held-flag"),
        (true, Some("holdout-7".into()), HoldoutConditionValue, None)
    );
}

#[test]
fn feature_enrollment_decides_when_the_person_has_opted() {
    let rules = single(flag(
        3,
        "new-editor",
        json!({"feature_enrollment": true,
        "groups": [{"properties": [], "rollout_percentage": 0}]}),
    ));
    let opted_in = Request::new("user-2").person(json!({"$feature_enrollment/new-editor": true}));
    assert_eq!(
        outcome(&opted_in.evaluate(&rules), "new-editor"),
        (true, None, SuperConditionValue, Some(0))
    );
    let as_text = Request::new("user-2").person(json!({"$feature_enrollment/new-editor": "true"}));
    assert!(find(&as_text.evaluate(&rules), "new-editor").enabled);
    let opted_out = Request::new("user-2").person(json!({"$feature_enrollment/new-editor": false}));
    assert_eq!(
        outcome(&opted_out.evaluate(&rules), "new-editor"),
        (false, None, SuperConditionValue, Some(0))
    );
    // Not enrolled either way: the conditions decide (0 % rollout here).
    let eval = Request::new("user-2").evaluate(&rules);
    assert_eq!(
        outcome(&eval, "new-editor"),
        (false, None, OutOfRolloutBound, Some(0))
    );
}

#[test]
fn legacy_super_groups_only_when_a_key_is_present() {
    let rules = single(flag(
        3,
        "old-beta",
        json!({
            "super_groups": [{"properties": [{"key": "$feature_enrollment/old-beta", "value": ["true"], "operator": "exact", "type": "person"}], "rollout_percentage": 100}],
            "groups": [{"properties": [{"key": "plan", "value": "pro"}], "rollout_percentage": 100}]
        }),
    ));
    let enrolled = Request::new("u").person(json!({"$feature_enrollment/old-beta": true}));
    assert_eq!(
        outcome(&enrolled.evaluate(&rules), "old-beta"),
        (true, None, SuperConditionValue, Some(0))
    );
    let declined =
        Request::new("u").person(json!({"$feature_enrollment/old-beta": false, "plan": "pro"}));
    assert_eq!(
        outcome(&declined.evaluate(&rules), "old-beta"),
        (false, None, SuperConditionValue, Some(0))
    );
    let absent = Request::new("u").person(json!({"plan": "pro"}));
    assert_eq!(
        outcome(&absent.evaluate(&rules), "old-beta"),
        (true, None, ConditionMatch, Some(0))
    );
}

#[test]
fn experience_continuity_buckets_by_the_first_seen_id() {
    // "sticky" rollout hashes: user-new 0.593, anon-1 0.914, anon-2 0.135.
    let sticky = |continuity: bool| {
        let mut f = rollout_flag("sticky", 50.0);
        f["ensure_experience_continuity"] = json!(continuity);
        single(f)
    };
    let on = sticky(true);
    assert!(!find(&Request::new("user-new").evaluate(&on), "sticky").enabled);
    assert!(
        find(
            &Request::new("user-new").anon("anon-2").evaluate(&on),
            "sticky"
        )
        .enabled
    );
    let stored = Request::new("user-new")
        .hash_key_override("anon-2")
        .anon("anon-1");
    assert!(
        find(&stored.evaluate(&on), "sticky").enabled,
        "the stored override wins"
    );
    let off = sticky(false);
    assert!(
        !find(
            &Request::new("user-new").anon("anon-2").evaluate(&off),
            "sticky"
        )
        .enabled
    );
}

#[test]
fn inactive_and_deleted_flags_are_absent() {
    let mut inactive = rollout_flag("off", 100.0);
    inactive["active"] = json!(false);
    inactive["id"] = json!(2);
    // Filters of inactive flags are not compiled: an unknown operator there is harmless.
    inactive["filters"]["groups"][0]["properties"] = json!([{"key": "a", "operator": "foo"}]);
    let mut deleted = rollout_flag("gone", 100.0);
    deleted["deleted"] = json!(true);
    deleted["id"] = json!(3);
    let rules = compile(json!({"flags": [rollout_flag("on", 100.0), inactive, deleted]}));
    let eval = Request::new("u").evaluate(&rules);
    assert_eq!(keys(&eval), vec!["on"]);
    assert!(!eval.errors);
}

#[test]
fn failed_person_lookup_leaves_out_only_flags_that_read_it() {
    let rules = compile(json!({"flags": [
        flag(1, "targeted", json!({"groups": [{"properties": [{"key": "plan", "value": "pro"}]}]})),
        flag(2, "everyone", json!({"groups": [{"rollout_percentage": 100}]})),
        flag(3, "enrolment", json!({"feature_enrollment": true, "groups": []}))
    ]}));
    assert!(rules.needs_person_properties());
    let eval = Request::new("u").person_unavailable().evaluate(&rules);
    assert_eq!(keys(&eval), vec!["everyone"]);
    assert!(eval.errors);
    assert_eq!(
        failed(&eval),
        vec![
            ("targeted", &FailureCause::PersonProperties),
            ("enrolment", &FailureCause::PersonProperties)
        ]
    );
    let rules = single(rollout_flag("everyone", 100.0));
    assert!(!rules.needs_person_properties());
    assert!(!rules.needs_group_properties());
    assert!(
        !Request::new("u")
            .person_unavailable()
            .evaluate(&rules)
            .errors
    );
}

/// An empty stored first-seen id (a person created before it was recorded) is no id:
/// the flag buckets as if none were stored, by the request's anonymous id, else its
/// distinct id; it never hashes the empty string.
#[test]
fn an_empty_stored_bucketing_id_is_passed_over() {
    let mut f = flag(
        1,
        "sticky-variants",
        json!({
            "groups": [{"properties": [], "rollout_percentage": 100}],
            "multivariate": three_way()
        }),
    );
    f["ensure_experience_continuity"] = json!(true);
    let rules = single(f);
    let variant = |r: &Request| find(&r.evaluate(&rules), "sticky-variants").variant.clone();
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..24 {
        let (id, anon) = (format!("user-{i}"), format!("anon-{i}"));
        let by_anon = variant(&Request::new(&id).anon(&anon));
        seen.insert(by_anon.clone());
        let stored_empty = Request::new(&id).hash_key_override("").anon(&anon);
        assert_eq!(variant(&stored_empty), by_anon, "{id} {anon}");
        let plain = variant(&Request::new(&id));
        let both_empty = Request::new(&id).hash_key_override("").anon("");
        assert_eq!(variant(&both_empty), plain, "{id}");
    }
    // The ids above fall in every variant, so a bucket of "" differs from some.
    assert_eq!(seen.len(), 3, "{seen:?}");
}
