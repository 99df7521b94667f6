//! What a served flag file is refused for (issue 38): a mistyped field, an operator or
//! filter type no flag may use, a percentage outside 0-100 or a dependency on no flag.
//! The file is not published, the project's previous rules keep serving, the failure is
//! counted once and named (file, flag, field, what was likely meant), and fixing the
//! file publishes it. A file as PostHog's own feed writes it loads.

use std::fs;
use std::path::PathBuf;

use serde_json::{json, Value};

use crate::flags::Rules;

/// A flags directory removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new() -> Dir {
        let path = std::env::temp_dir().join(format!("flags-refusals-{}", uuid::Uuid::new_v4()));
        fs::create_dir_all(&path).expect("create temp dir");
        Dir(path)
    }

    fn write(&self, file: &Value) {
        fs::write(self.0.join("1.json"), file.to_string()).expect("write flag file");
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn one_flag(group: Value) -> Value {
    json!({"flags": [{"id": 1, "key": "beta", "active": true, "filters": {"groups": [group]}}]})
}

/// The rollout of the published `beta` flag's first condition.
fn served_rollout(rules: &Rules) -> Option<Value> {
    let snapshot = rules.current();
    let project = snapshot.project(1)?;
    let flags = project.definitions_json()["flags"].as_array()?;
    Some(flags[0]["filters"]["groups"][0]["rollout_percentage"].clone())
}

#[test]
fn each_mistake_is_refused_and_the_previous_rules_keep_serving() {
    let dir = Dir::new();
    dir.write(&one_flag(
        json!({"properties": [], "rollout_percentage": 30}),
    ));
    let (rules, report) = Rules::load(&dir.0);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(served_rollout(&rules), Some(json!(30)));
    let file = dir.0.join("1.json");
    let cases = [
        (
            json!({"properties": [], "rollout_percentge": 30}),
            r#"flag "beta": filters.groups[0].rollout_percentge: unknown field (did you mean "rollout_percentage"?)"#,
        ),
        (
            json!({"properties": [{"key": "email", "value": "@x.com", "operator": "ends_wth"}], "rollout_percentage": 30}),
            r#"flag "beta": filters.groups[0].properties[0].operator: unknown operator "ends_wth""#,
        ),
        (
            json!({"properties": [{"key": "email", "value": "x", "type": "persn"}], "rollout_percentage": 30}),
            r#"flag "beta": filters.groups[0].properties[0].type: unknown filter type "persn" (did you mean "person"?)"#,
        ),
        (
            json!({"properties": [], "rollout_percentage": 130}),
            r#"flag "beta": filters.groups[0].rollout_percentage: must be between 0 and 100, got 130"#,
        ),
        (
            json!({"properties": [{"key": "404", "type": "flag", "value": true, "operator": "flag_evaluates_to"}]}),
            r#"flag "beta": filters.groups[0].properties[0]: depends on flag "404", which does not exist"#,
        ),
    ];
    for (n, (group, message)) in cases.into_iter().enumerate() {
        dir.write(&one_flag(group));
        let report = rules.reload(&dir.0);
        let errors: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
        assert_eq!(errors, [format!("{}: {message}", file.display())]);
        assert_eq!(report.errors[0].flag(), Some("beta"));
        assert!(report.loaded.is_empty());
        assert_eq!(served_rollout(&rules), Some(json!(30)), "{message}");
        assert_eq!(rules.reload_failures(), n as u64 + 1, "one failure a file");
        assert_eq!(*rules.problems(), errors, "the health page's lines");
    }
    dir.write(&one_flag(
        json!({"properties": [], "rollout_percentage": 40}),
    ));
    let report = rules.reload(&dir.0);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(served_rollout(&rules), Some(json!(40)));
    assert!(rules.problems().is_empty());
}

#[test]
fn an_inactive_flag_with_an_operator_no_flag_may_use_is_refused() {
    let dir = Dir::new();
    dir.write(
        &json!({"flags": [{"id": 1, "key": "off", "active": false, "filters": {"groups": [
        {"properties": [{"key": "email", "value": "@x.com", "operator": "ends_with"}]}]}}]}),
    );
    let (rules, report) = Rules::load(&dir.0);
    let errors: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].ends_with(r#"flag "off": filters.groups[0].properties[0].operator: unknown operator "ends_with" (PostHog's flags have no such operator: use "regex")"#),
        "{errors:?}"
    );
    assert!(rules.current().project(1).is_none());
}

/// Every field PostHog writes into a flag and its filters, as its local evaluation feed
/// (`/api/feature_flag/local_evaluation?send_cohorts`) serves them.
#[test]
fn a_file_as_posthogs_feed_writes_it_loads() {
    let dir = Dir::new();
    let feed = json!({
        "flags": [{
            "id": 11, "team_id": 2, "name": "Beta", "key": "beta", "deleted": false,
            "active": true, "ensure_experience_continuity": false, "version": 4,
            "has_encrypted_payloads": false, "evaluation_runtime": "all",
            "bucketing_identifier": "distinct_id", "evaluation_tags": [],
            "filters": {
                "groups": [{
                    "properties": [
                        {"key": "email", "type": "person", "value": "@acme.com", "operator": "icontains", "label": "Email"},
                        {"key": "id", "type": "cohort", "value": 7, "operator": "in", "cohort_name": "Staff"},
                        {"key": "12", "type": "flag", "value": true, "label": "other", "operator": "flag_evaluates_to", "dependency_chain": ["other"]}
                    ],
                    "rollout_percentage": 50, "variant": null, "aggregation_group_type_index": null,
                    "description": "staff", "sort_key": "a1", "users_affected": 3
                }],
                "multivariate": {"variants": [
                    {"key": "control", "name": "Control", "rollout_percentage": 50},
                    {"key": "test", "name": null, "rollout_percentage": 50}
                ]},
                "payloads": {"control": "{\"a\": 1}"},
                "aggregation_group_type_index": null,
                "holdout": {"id": 3, "exclusion_percentage": 10},
                "holdout_groups": [{"properties": [], "rollout_percentage": 10, "variant": "holdout-3"}]
            }
        }, {
            "id": 12, "team_id": 2, "name": "", "key": "other", "deleted": false, "active": true,
            "ensure_experience_continuity": false, "version": 1,
            "filters": {"groups": [{"properties": [], "rollout_percentage": 100}]}
        }],
        "group_type_mapping": {"0": "organization"},
        "cohorts": {"7": {"type": "OR", "values": [{"type": "AND", "values": [
            {"key": "email", "type": "person", "value": "@acme.com", "operator": "icontains", "negation": false}
        ]}]}}
    });
    dir.write(&feed);
    let (rules, report) = Rules::load(&dir.0);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    assert_eq!(report.loaded, [1]);
    assert_eq!(rules.current().project(1).map(|p| p.flag_count()), Some(2));
}

/// PostHog's feed may hold a filter type flagpost does not evaluate, or a cohort it
/// cannot: the file loads with that one flag off, and the health page says which.
#[test]
fn what_posthog_writes_but_flagpost_does_not_evaluate_switches_one_flag_off() {
    let dir = Dir::new();
    dir.write(&json!({"flags": [
        {"id": 1, "key": "meta", "active": true, "filters": {"groups": [{"properties": [
            {"key": "created_at", "type": "person_metadata", "value": "-30d", "operator": "is_date_after"}]}]}},
        {"id": 2, "key": "fine", "active": true, "filters": {"groups": [{"properties": []}]}}
    ]}));
    let (rules, report) = Rules::load(&dir.0);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.loaded, [1]);
    assert_eq!(report.warnings.len(), 1);
    assert_eq!(rules.reload_failures(), 0);
    assert!(rules.problems()[0].contains(r#"flag "meta""#));
}
