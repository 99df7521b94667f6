//! The response bodies of /decide v1 to v4 (and /flags), asserted whole.

use serde_json::{json, Value};
use uuid::Uuid;

use crate::flags::result::Reason;
use crate::flags::{response, Evaluation, FailureCause, FlagFailure, FlagResult, ReasonCode};

const REQUEST_ID: &str = "0190f1f2-7a3b-7cde-8f01-23456789abcd";

fn result(
    key: &str,
    id: i64,
    enabled: bool,
    variant: Option<&str>,
    reason: Reason,
    payload: Option<Value>,
) -> FlagResult {
    FlagResult {
        key: key.into(),
        id,
        version: Some(3),
        enabled,
        variant: variant.map(Into::into),
        reason,
        payload,
    }
}

/// Three computed flags (the last without a version) and one that failed.
fn evaluation() -> Evaluation {
    Evaluation {
        flags: vec![
            result(
                "beta",
                1,
                true,
                None,
                Reason::new(ReasonCode::ConditionMatch, Some(1)),
                Some(json!("{\"a\":1}")),
            ),
            result(
                "exp",
                2,
                true,
                Some("test-a"),
                Reason::new(ReasonCode::ConditionMatch, Some(0)),
                None,
            ),
            FlagResult {
                version: None,
                ..result(
                    "off",
                    3,
                    false,
                    None,
                    Reason::new(ReasonCode::OutOfRolloutBound, Some(0)),
                    None,
                )
            },
        ],
        errors: true,
        failed: vec![FlagFailure {
            key: "broken".into(),
            id: 4,
            cause: FailureCause::PersonProperties,
        }],
    }
}

fn with_common(mut flags_part: Value) -> Value {
    let common = json!({
        "config": {"enable_collect_everything": true},
        "toolbarParams": {},
        "isAuthenticated": false,
        "supportedCompression": ["gzip", "gzip-js", "lz64"],
        "sessionRecording": false,
        "capturePerformance": false,
        "autocapture_opt_out": false,
        "surveys": false,
        "heatmaps": false,
        "siteApps": []
    });
    if let (Value::Object(body), Value::Object(common)) = (&mut flags_part, common) {
        body.extend(common);
    }
    flags_part
}

fn body(version: u8) -> Value {
    response(
        version,
        &evaluation(),
        Uuid::parse_str(REQUEST_ID).expect("valid uuid"),
    )
}

#[test]
fn v1_lists_enabled_keys() {
    assert_eq!(
        body(1),
        with_common(json!({"featureFlags": ["beta", "exp"], "requestId": REQUEST_ID}))
    );
    assert_eq!(body(0), body(1));
}

#[test]
fn v2_maps_enabled_flags_to_values() {
    assert_eq!(
        body(2),
        with_common(
            json!({"featureFlags": {"beta": true, "exp": "test-a"}, "requestId": REQUEST_ID})
        )
    );
}

#[test]
fn v3_has_every_computed_flag_payloads_and_errors() {
    assert_eq!(
        body(3),
        with_common(json!({
            "featureFlags": {"beta": true, "exp": "test-a", "off": false},
            "featureFlagPayloads": {"beta": "{\"a\":1}"},
            "errorsWhileComputingFlags": true,
            "requestId": REQUEST_ID
        }))
    );
}

#[test]
fn v4_has_details_reasons_and_metadata() {
    // As PostHog writes them: a flag without a version says 0, never null, and no
    // `quotaLimited` unless a quota was hit.
    let expected = with_common(json!({
        "flags": {
            "beta": {"key": "beta", "enabled": true, "variant": null,
                     "reason": {"code": "condition_match", "condition_index": 1, "description": "Matched condition set 2"},
                     "metadata": {"id": 1, "version": 3, "description": null, "payload": "{\"a\":1}"}},
            "exp": {"key": "exp", "enabled": true, "variant": "test-a",
                    "reason": {"code": "condition_match", "condition_index": 0, "description": "Matched condition set 1"},
                    "metadata": {"id": 2, "version": 3, "description": null, "payload": null}},
            "off": {"key": "off", "enabled": false, "variant": null,
                    "reason": {"code": "out_of_rollout_bound", "condition_index": 0, "description": "Out of rollout bound"},
                    "metadata": {"id": 3, "version": 0, "description": null, "payload": null}}
        },
        "errorsWhileComputingFlags": true,
        "requestId": REQUEST_ID
    }));
    assert_eq!(body(4), expected);
    assert_eq!(body(9), expected, "newer versions get the newest shape");
}

#[test]
fn flag_order_is_definition_order() {
    let keys: Vec<String> = match &body(4)["flags"] {
        Value::Object(map) => map.keys().cloned().collect(),
        _ => Vec::new(),
    };
    assert_eq!(keys, vec!["beta", "exp", "off"]);
}

#[test]
fn empty_evaluation() {
    let eval = Evaluation {
        flags: Vec::new(),
        errors: false,
        failed: Vec::new(),
    };
    let v3 = response(3, &eval, Uuid::nil());
    assert_eq!(v3["featureFlags"], json!({}));
    assert_eq!(v3["featureFlagPayloads"], json!({}));
    assert_eq!(v3["errorsWhileComputingFlags"], json!(false));
}

#[test]
fn the_direct_writer_gives_the_same_bodies() {
    let id = Uuid::parse_str(REQUEST_ID).unwrap();
    for eval in [evaluation(), Evaluation::default()] {
        for version in 0..=5 {
            let direct: Value =
                serde_json::from_slice(&crate::flags::response_bytes(version, &eval, id)).unwrap();
            assert_eq!(direct, response(version, &eval, id), "version {version}");
        }
    }
}

#[test]
fn the_direct_writer_matches_the_value_tree_byte_for_byte() {
    let id = Uuid::parse_str(REQUEST_ID).unwrap();
    for eval in [evaluation(), Evaluation::default()] {
        for version in 0..=5 {
            let tree = serde_json::to_vec(&response(version, &eval, id)).unwrap();
            let direct = crate::flags::response_bytes(version, &eval, id);
            assert_eq!(
                String::from_utf8(direct).unwrap(),
                String::from_utf8(tree).unwrap(),
                "version {version}"
            );
        }
    }
}

/// Variants with payloads of every JSON kind, a holdout with a payload, a boolean payload,
/// a dependency, a key that needs escaping, a group flag without its group, and a flag
/// that fails: the outcomes' writer must give the bytes of the owned results' writer.
#[test]
fn outcomes_write_the_same_bodies_as_their_evaluation() {
    use super::{compile, flag, three_way, Request};
    let rules = compile(json!({
        "flags": [
            flag(1, "exp", json!({
                "groups": [{"properties": [], "rollout_percentage": 100}],
                "multivariate": three_way(),
                "payloads": {"control": "{\"c\":1}", "test-a": {"color": "red"}, "test-b": null}})),
            flag(2, "held", json!({
                "groups": [{"properties": [], "rollout_percentage": 100}],
                "holdout": {"id": 7, "exclusion_percentage": 50},
                "payloads": {"holdout-7": [1, 2], "true": "yes"}})),
            flag(3, "quote\"key\\\u{1}é", json!({
                "groups": [{"properties": [], "rollout_percentage": 50}],
                "payloads": {"true": 12.5}})),
            flag(4, "needs-exp", json!({
                "groups": [{"properties": [{"key": "1", "type": "flag", "value": "control",
                                            "operator": "flag_evaluates_to"}]},
                           {"properties": [{"key": "plan", "value": "pro"}], "rollout_percentage": 100}]})),
            flag(5, "org-flag", json!({
                "aggregation_group_type_index": 0,
                "groups": [{"properties": [], "rollout_percentage": 100}]})),
            flag(6, "person-flag", json!({
                "groups": [{"properties": [{"key": "plan", "value": "pro"}]}]})),
        ],
        "group_type_mapping": {"0": "organization"}
    }));
    let id = Uuid::parse_str(REQUEST_ID).unwrap();
    for n in 0..40 {
        let person = Request::new(&format!("user-{n}")).person(json!({"plan": "pro"}));
        for request in [
            person,
            Request::new(&format!("user-{n}")).person_unavailable(),
        ] {
            let ctx = request.context();
            let outcomes = rules.outcomes(&ctx);
            let eval = rules.evaluate(&ctx);
            assert_eq!(outcomes.errors(), eval.errors);
            for version in 0..=5 {
                assert_eq!(
                    String::from_utf8(outcomes.response_bytes(version, id)).unwrap(),
                    String::from_utf8(crate::flags::response_bytes(version, &eval, id)).unwrap(),
                    "user-{n}, version {version}"
                );
            }
        }
    }
}

/// A request that names its flags (`flag_keys_to_evaluate`) gets only those, each as it
/// would be among all of them: a named flag may depend on an unnamed one, and an
/// unnamed flag that fails is no error of this answer.
#[test]
fn named_flags_only() {
    use super::{compile, flag, Request};
    let rules = compile(json!({
        "flags": [
            flag(1, "base", json!({"groups": [{"properties": [], "rollout_percentage": 100}]})),
            flag(2, "needs-base", json!({
                "groups": [{"properties": [{"key": "1", "type": "flag", "value": true,
                                            "operator": "flag_evaluates_to"}],
                            "rollout_percentage": 100}]})),
            flag(3, "person-flag", json!({
                "groups": [{"properties": [{"key": "plan", "value": "pro"}]}]})),
        ]
    }));
    let ctx = Request::new("u").person_unavailable();
    let ctx = ctx.context();
    let all = rules.outcomes(&ctx);
    assert!(all.errors(), "the person flag cannot be computed");
    let mut named = rules.outcomes(&ctx);
    named.retain_keys(&["needs-base".to_owned(), "no-such-flag".to_owned()]);
    assert!(!named.errors());
    let body: Value = serde_json::from_slice(&named.response_bytes(4, Uuid::nil())).unwrap();
    let keys: Vec<&String> = body["flags"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["needs-base"]);
    assert_eq!(body["flags"]["needs-base"]["enabled"], true);
    let mut none = rules.outcomes(&ctx);
    none.retain_keys(&[]);
    let body: Value = serde_json::from_slice(&none.response_bytes(3, Uuid::nil())).unwrap();
    assert_eq!(body["featureFlags"], json!({}));
}
