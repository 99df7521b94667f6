//! What a flag may say, in one place: PostHog's property operators and filter types for
//! flags, and the fields PostHog writes into a flag's `filters`. Serving and `flagpost
//! check` (through `compile` and `lint`), the management API (`manage::validate`) and
//! the console's flag form (its operator list, held equal to [`OPERATORS`] by a test
//! here) all read these lists, so a file, the API and the form accept the same flags.
//!
//! The operators are PostHog's `FEATURE_FLAG_SUPPORTED_OPERATORS` (its
//! `posthog/api/feature_flag.py`), which its flags service's `OperatorType` mirrors: the
//! ones a flag condition may use. PostHog's wider `PropertyOperator` has more (for
//! insights and cohorts); its serializer refuses those in flags, and so does flagpost.
//! PostHog has no `starts_with`, `ends_with` or `between`: see [`hint`].

/// Every operator a flag's property filter may use; absent means `exact`.
pub const OPERATORS: &[&str] = &[
    "exact",
    "is_not",
    "icontains",
    "not_icontains",
    "icontains_multi",
    "not_icontains_multi",
    "regex",
    "not_regex",
    "gt",
    "gte",
    "lt",
    "lte",
    "semver_gt",
    "semver_gte",
    "semver_lt",
    "semver_lte",
    "semver_eq",
    "semver_neq",
    "semver_tilde",
    "semver_caret",
    "semver_wildcard",
    "is_set",
    "is_not_set",
    "is_date_exact",
    "is_date_after",
    "is_date_before",
    "in",
    "not_in",
    "flag_evaluates_to",
];

/// Operators of PostHog's `PropertyOperator` that its flag serializer refuses as
/// "Unsupported operator for feature flags" (they serve insights and cohorts).
pub const NOT_FOR_FLAGS: &[&str] = &["between", "not_between", "is_cleaned_path_exact"];

/// PostHog's serializer rewrites these to the operator they mean before it stores a flag.
pub const ALIASES: &[(&str, &str)] = &[("min", "gte"), ("max", "lte")];

/// The filter types a flag condition may use, as the API accepts them.
pub const PROPERTY_TYPES: &[&str] = &["person", "cohort", "group", "flag"];

/// Filter types PostHog's flags service reads that flagpost does not evaluate: a file
/// from PostHog's feed may hold them, so they switch that one flag off rather than
/// refuse the file (`person_metadata` reads the persons table's own columns).
pub const UNEVALUATED_TYPES: &[&str] = &["person_metadata"];

/// `filters`; `early_exit` is flagpost's own.
pub const FILTERS: &[&str] = &[
    "groups",
    "multivariate",
    "aggregation_group_type_index",
    "payloads",
    "super_groups",
    "feature_enrollment",
    "holdout",
    "holdout_groups",
    "early_exit",
];

/// A condition group (`groups[]`, `super_groups[]`, `holdout_groups[]`).
pub const GROUP: &[&str] = &[
    "properties",
    "rollout_percentage",
    "variant",
    "aggregation_group_type_index",
    "description",
    "sort_key",
    "users_affected",
];

/// `multivariate`; PostHog keeps per-variant person property overrides beside them.
pub const MULTIVARIATE: &[&str] = &["variants", "override_property_values"];

pub const VARIANT: &[&str] = &["key", "name", "rollout_percentage"];

pub const HOLDOUT: &[&str] = &["id", "exclusion_percentage"];

/// A property filter in a condition group.
pub const PROPERTY: &[&str] = &[
    "key",
    "value",
    "operator",
    "type",
    "group_type_index",
    "negation",
    "label",
    "cohort_name",
    "group_key_names",
    "dependency_chain",
    "bytecode",
    "bytecode_error",
    "conditionHash",
    // Fields of PostHog's Property model, copied when a cohort is expanded.
    "event_type",
    "event_filters",
    "operator_value",
    "time_value",
    "time_interval",
    "explicit_datetime",
    "total_periods",
    "min_periods",
    "seq_event_type",
    "seq_event",
    "seq_time_value",
    "seq_time_interval",
];

pub use super::property::bounded_regex;

/// Whether a `regex` filter's pattern compiles as serving compiles it (within its size
/// limits); one that does not never matches.
pub fn regex_compiles(pattern: &str) -> bool {
    super::property::compile_regex(&serde_json::Value::from(pattern)).is_some()
}

/// What to write instead of an operator flags do not have, or the operator a typo most
/// likely meant.
pub fn hint(operator: &str) -> Option<String> {
    let instead = match operator {
        "starts_with" | "ends_with" => "PostHog's flags have no such operator: use \"regex\"",
        "not_starts_with" | "not_ends_with" => {
            "PostHog's flags have no such operator: use \"not_regex\""
        }
        "between" | "not_between" => "PostHog's flags cannot use it: use \"gte\" and \"lte\"",
        "is_cleaned_path_exact" => "PostHog's flags cannot use it",
        _ => return closest(operator, OPERATORS).map(|known| format!("did you mean {known:?}?")),
    };
    Some(instead.to_owned())
}

/// The known name a typo most likely meant: at most two edits away (or a third of the
/// name for long ones), the nearest first.
pub fn closest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(2);
    known
        .iter()
        .map(|k| (edit_distance(name, k), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance over Unicode scalar values.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions_only_for_near_misses() {
        assert_eq!(closest("varient", GROUP), Some("variant"));
        assert_eq!(closest("colour", GROUP), None);
        assert_eq!(closest("persn", PROPERTY_TYPES), Some("person"));
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "ab"), 2);
    }

    #[test]
    fn hints_name_what_to_write_instead() {
        assert_eq!(
            hint("icontain").as_deref(),
            Some("did you mean \"icontains\"?")
        );
        assert_eq!(
            hint("semver_gtt").as_deref(),
            Some("did you mean \"semver_gt\"?")
        );
        let ends = hint("ends_with").unwrap();
        assert!(ends.contains("use \"regex\""), "{ends}");
        assert_eq!(hint("sounds_like"), None);
    }

    /// The console's form offers exactly these operators (in an order of its own).
    #[test]
    fn the_console_form_offers_exactly_these_operators() {
        let form = include_str!("../http/console/static/flag_form.js");
        let start = form
            .find("const OPERATORS = [")
            .expect("the form's operator list");
        let end = start + form[start..].find("\n  ]").expect("its end");
        let mut offered: Vec<&str> = form[start..end]
            .split("['")
            .skip(1)
            .filter_map(|entry| entry.split('\'').next())
            .collect();
        offered.sort_unstable();
        let mut operators = OPERATORS.to_vec();
        operators.sort_unstable();
        assert_eq!(offered, operators);
    }

    #[test]
    fn the_lists_do_not_overlap() {
        for op in NOT_FOR_FLAGS.iter().chain(ALIASES.iter().map(|(a, _)| a)) {
            assert!(!OPERATORS.contains(op), "{op}");
        }
        for (_, to) in ALIASES {
            assert!(OPERATORS.contains(to), "{to}");
        }
    }
}
