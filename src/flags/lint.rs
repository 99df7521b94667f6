//! What a flag file is refused for beyond what the compiler reads, by serving and by
//! `flagpost check` alike: fields neither flagpost nor PostHog knows inside a flag's
//! filters, condition groups, property filters and variants (a typo such as
//! `rollout_percentge` would otherwise be ignored, and the condition roll out to
//! everyone), percentages outside 0-100, and, in inactive flags, which are never
//! compiled, operators and filter types no flag may use.
//!
//! PostHog's own fields are accepted though flagpost does not read them: the lists in
//! `vocabulary` are the fields PostHog writes into flag filters (its flags service's
//! `FlagFilters`, `FlagPropertyGroup`, `MultivariateFlagVariant` and `PropertyFilter`, the
//! hypercache contract fixture, its editor's condition sets with `description` and
//! `sort_key`, and the `Property` model whose fields cohort expansion copies into
//! conditions).

use std::collections::HashMap;

use serde_json::Value;

use super::definition::Node;
use super::error::{CompileError, ErrorKind};
use super::filter::{Allow, Leaf, Scope};
use super::property::Matching;
use super::vocabulary::{closest, FILTERS, GROUP, HOLDOUT, MULTIVARIATE, PROPERTY, VARIANT};

/// Every problem of a parsed flag file that `check` reports besides the compiler's
/// errors and warnings. Paths are relative to the flag, as the compiler's are.
pub fn lint(definitions: &Value) -> Vec<CompileError> {
    let mut found = Vec::new();
    let root = Node::root(definitions);
    let flags = root.get("flags");
    let Ok(items) = flags.items() else {
        return found;
    };
    for item in items {
        let Some(key) = item.value().get("key").and_then(Value::as_str) else {
            continue;
        };
        let deleted = item.value().get("deleted") == Some(&Value::Bool(true));
        if deleted {
            continue;
        }
        let inactive = item.value().get("active") == Some(&Value::Bool(false));
        let flag = Node::root(item.value());
        let mut errors = Vec::new();
        lint_filters(&flag.get("filters"), inactive, &mut errors);
        found.extend(errors.into_iter().map(|e| e.in_flag(key)));
    }
    found
}

fn lint_filters(filters: &Node<'_>, inactive: bool, errors: &mut Vec<CompileError>) {
    unknown_fields(filters, FILTERS, errors);
    for name in ["groups", "super_groups", "holdout_groups"] {
        let groups = filters.get(name);
        for group in groups.items().unwrap_or_default() {
            unknown_fields(&group, GROUP, errors);
            percentage(&group.get("rollout_percentage"), errors);
            let properties = group.get("properties");
            for property in properties.items().unwrap_or_default() {
                unknown_fields(&property, PROPERTY, errors);
                if inactive {
                    if let Err(e) = unevaluable(&property) {
                        errors.push(e);
                    }
                }
            }
        }
    }
    let multivariate = filters.get("multivariate");
    unknown_fields(&multivariate, MULTIVARIATE, errors);
    let variants = multivariate.get("variants");
    for variant in variants.items().unwrap_or_default() {
        unknown_fields(&variant, VARIANT, errors);
        percentage(&variant.get("rollout_percentage"), errors);
    }
    let holdout = filters.get("holdout");
    unknown_fields(&holdout, HOLDOUT, errors);
    percentage(&holdout.get("exclusion_percentage"), errors);
}

/// A percentage outside 0-100 cannot work: 130 rolls out to everyone, -20 to nobody.
/// PostHog's serializer refuses both with this message. A wrong type is the compiler's.
fn percentage(node: &Node<'_>, errors: &mut Vec<CompileError>) {
    let Some(number) = node.value().as_f64() else {
        return;
    };
    if !(0.0..=100.0).contains(&number) {
        let message = format!("must be between 0 and 100, got {}", node.value());
        errors.push(node.invalid(message));
    }
}

/// An operator or filter type no flag may use, found by compiling the filter alone:
/// references to cohorts and flags are left unresolved, which is no error, and a filter
/// type PostHog knows but flagpost does not evaluate only switches the flag off.
fn unevaluable(property: &Node<'_>) -> Result<(), CompileError> {
    let scope = Scope {
        cohorts: HashMap::new(),
        flags_by_id: HashMap::new(),
        flags_by_key: HashMap::new(),
        property_keys: Default::default(),
        predicates: Default::default(),
        // The operator's name is what is checked; matching only shapes its value.
        matching: Matching {
            legacy_booleans: true,
        },
    };
    match Leaf::compile(property, &scope, Allow::Everything) {
        Err(e) if e.is_unknown_name() => Err(e),
        _ => Ok(()),
    }
}

fn unknown_fields(node: &Node<'_>, known: &[&str], errors: &mut Vec<CompileError>) {
    // A wrong type is the compiler's to report; only objects have fields.
    let Value::Object(map) = node.value() else {
        return;
    };
    for name in map.keys() {
        if !known.contains(&name.as_str()) {
            let suggestion = closest(name, known).map(str::to_owned);
            let kind = ErrorKind::UnknownField { suggestion };
            errors.push(node.get(name).error(kind));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(file: Value) -> Vec<String> {
        lint(&file).iter().map(ToString::to_string).collect()
    }

    fn flag(filters: Value) -> Value {
        json!({"flags": [{"id": 1, "key": "beta", "active": true, "filters": filters}]})
    }

    #[test]
    fn a_misspelt_rollout_is_named_with_its_path_and_the_likely_field() {
        let file = flag(json!({"groups": [{"properties": [], "rollout_percentge": 30}]}));
        assert_eq!(
            messages(file),
            [
                r#"flag "beta": filters.groups[0].rollout_percentge: unknown field (did you mean "rollout_percentage"?)"#
            ]
        );
    }

    #[test]
    fn unknown_fields_of_filters_variants_and_holdouts() {
        let file = flag(json!({
            "groups": [{"properties": [{"key": "plan", "value": "pro", "opertor": "exact"}]}],
            "multivariate": {"variants": [{"key": "a", "rollout_percentage": 100, "weight": 1}]},
            "holdout": {"id": 3, "exclusion_percentage": 5, "zzz": 1},
            "multivarite": null,
        }));
        assert_eq!(
            messages(file),
            [
                r#"flag "beta": filters.multivarite: unknown field (did you mean "multivariate"?)"#,
                r#"flag "beta": filters.groups[0].properties[0].opertor: unknown field (did you mean "operator"?)"#,
                r#"flag "beta": filters.multivariate.variants[0].weight: unknown field"#,
                r#"flag "beta": filters.holdout.zzz: unknown field"#,
            ]
        );
    }

    #[test]
    fn posthogs_own_fields_pass() {
        // As PostHog's hypercache contract fixture and its editor write them.
        let file = flag(json!({
            "groups": [{
                "properties": [
                    {"key": "email", "value": "a@b.c", "type": "person", "operator": "exact", "label": "Email", "negation": false},
                    {"key": "id", "value": 100, "type": "cohort", "operator": "in", "cohort_name": "QA users"},
                    {"key": "2", "label": "other", "operator": "flag_evaluates_to", "type": "flag", "value": true, "dependency_chain": ["other"]},
                    {"key": "name", "value": "x", "type": "group", "group_type_index": 0, "group_key_names": {"a": "A"}}
                ],
                "rollout_percentage": 50, "variant": null, "description": "rollout to enterprise",
                "sort_key": "abc-123", "aggregation_group_type_index": null, "users_affected": 10
            }],
            "multivariate": {"variants": [{"key": "control", "name": "Control", "rollout_percentage": 100}]},
            "payloads": {"control": "payload-value"},
            "super_groups": [{"properties": [], "rollout_percentage": null, "variant": null}],
            "feature_enrollment": true,
            "holdout": {"id": 42, "exclusion_percentage": 10.0},
            "aggregation_group_type_index": null,
            "holdout_groups": [{"properties": [], "rollout_percentage": 5, "variant": "holdout-42"}],
            "early_exit": false
        }));
        assert_eq!(messages(file), Vec::<String>::new());
    }

    #[test]
    fn percentages_outside_0_to_100() {
        let file = flag(json!({
            "groups": [{"properties": [], "rollout_percentage": -20}, {"rollout_percentage": 100}],
            "multivariate": {"variants": [{"key": "a", "rollout_percentage": 100.5}]},
            "holdout": {"id": 1, "exclusion_percentage": 0}
        }));
        assert_eq!(
            messages(file),
            [
                r#"flag "beta": filters.groups[0].rollout_percentage: must be between 0 and 100, got -20"#,
                r#"flag "beta": filters.multivariate.variants[0].rollout_percentage: must be between 0 and 100, got 100.5"#,
            ]
        );
    }

    #[test]
    fn inactive_flags_are_checked_for_what_serving_would_refuse_once_on() {
        let file = json!({"flags": [
            {"id": 1, "key": "off", "active": false, "filters": {"groups": [{"properties": [
                {"key": "email", "value": "x", "operator": "ends_wth"},
                {"key": "email", "value": "x", "type": "persn"},
                {"key": "email", "value": "x", "operator": "ends_with"}
            ]}]}},
            {"id": 2, "key": "gone", "deleted": true, "filters": {"groups": [{"typo": 1}]}}
        ]});
        assert_eq!(
            messages(file),
            [
                r#"flag "off": filters.groups[0].properties[0].operator: unknown operator "ends_wth""#,
                r#"flag "off": filters.groups[0].properties[1].type: unknown filter type "persn" (did you mean "person"?)"#,
                r#"flag "off": filters.groups[0].properties[2].operator: unknown operator "ends_with" (PostHog's flags have no such operator: use "regex")"#,
            ]
        );
    }
}
