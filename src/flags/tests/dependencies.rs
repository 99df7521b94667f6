//! Flag dependencies (`flag_evaluates_to`): expectations of true, false and a variant,
//! dependencies defined after their dependents, chains, inactive and deleted targets,
//! and missing or cyclic dependencies failing closed.

use serde_json::{json, Value};

use super::{compile, failed, flag, outcome, Request};
use crate::flags::{Evaluation, FailureCause, ProjectRules, ReasonCode::*};

fn depends_on(target: Value, expected: Value) -> Value {
    json!({"groups": [{"properties": [
        {"key": target, "type": "flag", "value": expected, "operator": "flag_evaluates_to"}
    ], "rollout_percentage": 100}]})
}

fn rules() -> ProjectRules {
    let mut dormant = flag(
        17,
        "dormant",
        json!({"groups": [{"rollout_percentage": 100}]}),
    );
    dormant["active"] = json!(false);
    let mut deleted = flag(
        26,
        "deleted",
        json!({"groups": [{"rollout_percentage": 100}]}),
    );
    deleted["deleted"] = json!(true);
    compile(json!({"flags": [
        flag(11, "uses-base", depends_on(json!("12"), json!(true))),
        flag(12, "base", json!({"groups": [{"properties": [{"key": "plan", "value": "pro"}], "rollout_percentage": 100}]})),
        flag(13, "not-base", depends_on(json!("base"), json!(false))),
        flag(14, "variant-dep", depends_on(json!(15), json!("test-a"))),
        flag(15, "exp", json!({"groups": [{"rollout_percentage": 100}], "multivariate": {"variants": [
            {"key": "control", "rollout_percentage": 34}, {"key": "test-a", "rollout_percentage": 33},
            {"key": "test-b", "rollout_percentage": 33}]}})),
        flag(16, "on-inactive", depends_on(json!("17"), json!(false))),
        dormant,
        flag(18, "missing-dep", depends_on(json!("nope"), json!(true))),
        flag(19, "cycle-a", depends_on(json!("20"), json!(true))),
        flag(20, "cycle-b", depends_on(json!("19"), json!(true))),
        flag(21, "behind-cycle", depends_on(json!("19"), json!(true))),
        flag(22, "behind-missing", depends_on(json!("18"), json!(false))),
        flag(23, "self", depends_on(json!("23"), json!(true))),
        flag(24, "chain", depends_on(json!("uses-base"), json!("true"))),
        flag(25, "on-deleted", depends_on(json!("26"), json!(false))),
        deleted
    ]}))
}

fn enabled(eval: &Evaluation) -> Vec<(&str, bool)> {
    eval.flags
        .iter()
        .map(|f| (f.key.as_str(), f.enabled))
        .collect()
}

#[test]
fn dependencies_see_their_targets_value() {
    let rules = rules();
    // user-3 gets test-a of "exp"; user-1 gets control.
    let pro = Request::new("user-3")
        .person(json!({"plan": "pro"}))
        .evaluate(&rules);
    assert_eq!(
        enabled(&pro),
        vec![
            ("uses-base", true),
            ("base", true),
            ("not-base", false),
            ("variant-dep", true),
            ("exp", true),
            ("on-inactive", true),
            ("missing-dep", false),
            ("cycle-a", false),
            ("cycle-b", false),
            ("behind-cycle", false),
            ("behind-missing", false),
            ("self", false),
            ("chain", true),
            ("on-deleted", false)
        ]
    );
    assert_eq!(
        outcome(&pro, "uses-base"),
        (true, None, ConditionMatch, Some(0))
    );
    let free = Request::new("user-1")
        .person(json!({"plan": "free"}))
        .evaluate(&rules);
    assert_eq!(
        enabled(&free),
        vec![
            ("uses-base", false),
            ("base", false),
            ("not-base", true),
            ("variant-dep", false),
            ("exp", true),
            ("on-inactive", true),
            ("missing-dep", false),
            ("cycle-a", false),
            ("cycle-b", false),
            ("behind-cycle", false),
            ("behind-missing", false),
            ("self", false),
            ("chain", false),
            ("on-deleted", false)
        ]
    );
    assert_eq!(
        outcome(&free, "variant-dep"),
        (false, None, NoConditionMatch, Some(0))
    );
}

/// As PostHog answers them: off, reason `missing_dependency`, no condition; not an
/// error, so clients replace their cached value.
#[test]
fn missing_and_cyclic_dependencies_are_off_with_missing_dependency() {
    let eval = Request::new("user-3")
        .person(json!({"plan": "pro"}))
        .evaluate(&rules());
    assert!(!eval.errors);
    assert!(failed(&eval).is_empty());
    for key in [
        "missing-dep",
        "cycle-a",
        "cycle-b",
        "behind-cycle",
        "behind-missing",
        "self",
        "on-deleted",
    ] {
        assert_eq!(
            outcome(&eval, key),
            (false, None, MissingDependency, None),
            "{key}"
        );
    }
}

#[test]
fn broken_dependencies_are_warnings_naming_the_flag() {
    let warnings: Vec<String> = rules().warnings().iter().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        vec![
            r#"flag "missing-dep": filters.groups[0].properties[0]: depends on flag "nope", which does not exist"#,
            r#"flag "on-deleted": filters.groups[0].properties[0]: depends on flag "26", which does not exist"#,
            r#"flag "cycle-a": part of or depends on a dependency cycle"#,
            r#"flag "cycle-b": part of or depends on a dependency cycle"#,
            r#"flag "behind-cycle": part of or depends on a dependency cycle"#,
            r#"flag "self": part of or depends on a dependency cycle"#,
            r#"flag "behind-missing": depends on flag "missing-dep", which cannot be evaluated"#,
        ]
    );
}

#[test]
fn a_failed_lookup_propagates_to_dependents() {
    let eval = Request::new("user-3")
        .person_unavailable()
        .evaluate(&rules());
    assert_eq!(
        enabled(&eval),
        vec![
            ("variant-dep", true),
            ("exp", true),
            ("on-inactive", true),
            ("missing-dep", false),
            ("cycle-a", false),
            ("cycle-b", false),
            ("behind-cycle", false),
            ("behind-missing", false),
            ("self", false),
            ("on-deleted", false)
        ]
    );
    let person = FailureCause::PersonProperties;
    let failures = failed(&eval);
    assert_eq!(
        failures
            .iter()
            .filter(|(_, cause)| **cause == person)
            .map(|(k, _)| *k)
            .collect::<Vec<_>>(),
        vec!["uses-base", "base", "not-base", "chain"]
    );
}
