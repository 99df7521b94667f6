//! Each operator against PostHog's HogQL (`posthog/hogql/property.py`, printed with
//! `ifNull(..., 0)` for the positive comparisons and `ifNull(..., 1)` for `!=`,
//! `NOT ILIKE`, `NOT IN` and `not(match(...))`).

use serde_json::{json, Value};

use super::*;

/// The answer of `operator` with `value` on a stored `stored` (None: absent).
fn test(operator: &str, value: Value, stored: Option<Value>) -> Option<bool> {
    let compare = Compare::new(operator, &value).unwrap();
    compare.test(stored.as_ref())
}

/// Each `(operator, value, answer)` of `cases` on a property whose value is `stored`.
fn table(stored: Value, cases: &[(&str, Value, bool)]) {
    for (operator, value, want) in cases {
        let got = test(operator, value.clone(), Some(stored.clone()));
        assert_eq!(got, Some(*want), "{operator} {value} on {stored}");
    }
}

#[test]
fn exact_and_is_not_are_case_sensitive() {
    let cases = [
        ("exact", json!("Chrome"), true),
        ("exact", json!("chrome"), false),
        ("exact", json!("CHROME"), false),
        ("exact", json!(["Safari", "Chrome"]), true),
        ("exact", json!(["safari", "chrome"]), false),
        ("is_not", json!("chrome"), true),
        ("is_not", json!("Chrome"), false),
        ("is_not", json!(["Safari", "Chrome"]), false),
    ];
    table(json!("Chrome"), &cases);
}

/// Numbers as PostHog's Numeric properties compare them, booleans as its Boolean
/// ones; text compares as text, and a list or object as its JSON.
#[test]
fn numbers_booleans_and_lists_compare_as_posthogs_typed_properties() {
    let cases = [
        (json!(12), "exact", json!(12), true),
        (json!(12), "exact", json!("12"), true),
        (json!(12), "exact", json!("12.0"), true),
        (json!(12.5), "exact", json!(12), false),
        (json!(12), "exact", json!("twelve"), false),
        (json!("12"), "exact", json!(12), true),
        (json!("12.0"), "exact", json!(12), false),
        (json!(true), "exact", json!(true), true),
        (json!(true), "exact", json!("true"), true),
        (json!(true), "exact", json!("True"), false),
        (json!(false), "exact", json!(true), false),
        (json!(false), "is_not", json!(true), true),
        (json!("true"), "exact", json!(true), true),
        (json!(["pro"]), "exact", json!("pro"), false),
        (json!(["pro"]), "exact", json!(r#"["pro"]"#), true),
        (json!({"a": 1}), "icontains", json!(r#""a":1"#), true),
        (json!(12), "gt", json!(9), true),
        (json!(12), "gt", json!("9"), true),
        (json!("12"), "gt", json!(9), true),
        (json!(12), "lte", json!(12), true),
        (json!(12), "lt", json!(12), false),
        (json!(12), "gte", json!(12.5), false),
        (json!("b"), "gt", json!("a"), true),
        (json!("B"), "gt", json!("a"), false),
        (json!("Chrome"), "gt", json!(1), false),
        (json!(12), "gt", json!("a"), false),
        (json!(true), "gt", json!(0), false),
        (json!(12), "regex", json!("^1"), true),
        (json!(12), "icontains", json!("2"), true),
    ];
    for (stored, operator, value, want) in cases {
        let got = test(operator, value.clone(), Some(stored.clone()));
        assert_eq!(got, Some(want), "{stored} {operator} {value}");
    }
}

#[test]
fn icontains_is_ilike_and_regex_is_case_sensitive() {
    let cases = [
        ("icontains", json!("EXAMPLE"), true),
        ("icontains", json!("ada_love"), true),
        // `%` and `_` are ILIKE's wildcards; `\` takes them as they are.
        ("icontains", json!("ada%example"), true),
        ("icontains", json!("lovelace_example"), true),
        ("icontains", json!(r"ada\_love"), true),
        ("icontains", json!(r"ada\%love"), false),
        ("icontains", json!("bob"), false),
        ("icontains", json!(["bob", "ADA"]), true),
        ("icontains", json!(["bob", "a%a"]), false),
        ("icontains_multi", json!(["bob"]), false),
        ("not_icontains", json!("example"), false),
        ("not_icontains", json!(["bob", "eve"]), true),
        ("not_icontains_multi", json!(["bob", "ada"]), false),
        ("regex", json!("^Ada"), true),
        ("regex", json!("^ada"), false),
        ("regex", json!(["^x", "com$"]), true),
        ("not_regex", json!("^ada"), true),
        ("not_regex", json!(["^x", "com$"]), false),
    ];
    table(json!("Ada_Lovelace@Example.com"), &cases);
}

/// An absent property and a JSON `null` are no value: the positive operators fail,
/// the negative ones pass, `is_set` fails and `is_not_set` passes.
#[test]
fn a_missing_or_null_property_passes_only_the_negative_operators() {
    let cases = [
        ("exact", json!("x"), false),
        ("is_not", json!("x"), true),
        ("icontains", json!("x"), false),
        ("icontains", json!(["x", "y"]), false),
        ("not_icontains", json!("x"), true),
        ("not_icontains", json!(["x", "y"]), true),
        ("regex", json!("."), false),
        ("not_regex", json!("x"), true),
        ("gt", json!(1), false),
        ("lte", json!(1), false),
        ("is_set", json!("is_set"), false),
        ("is_not_set", json!("is_not_set"), true),
        ("is_date_before", json!("2026-01-01"), false),
        ("semver_gte", json!("1.0.0"), false),
        ("semver_neq", json!("1.0.0"), true),
    ];
    for (operator, value, want) in cases {
        for stored in [None, Some(Value::Null)] {
            let got = test(operator, value.clone(), stored.clone());
            assert_eq!(got, Some(want), "{operator} {value} on {stored:?}");
        }
    }
    assert_eq!(test("is_set", json!(null), Some(json!(""))), Some(true));
    assert_eq!(test("exact", json!(""), Some(json!(""))), Some(true));
}

/// PostHog's empty list is a filter of every event (`Constant(1)`), even of those
/// without the property.
#[test]
fn an_empty_list_filters_nothing() {
    for operator in ["exact", "is_not", "regex", "gt"] {
        for stored in [None, Some(json!("x"))] {
            assert_eq!(test(operator, json!([]), stored), Some(true), "{operator}");
        }
    }
}

/// Dates and versions are the flags' tests: the value is theirs to answer.
#[test]
fn dates_and_versions_are_left_to_the_flags() {
    for operator in ["is_date_before", "is_date_exact", "semver_gt", "semver_neq"] {
        assert_eq!(test(operator, json!("1.0.0"), Some(json!("2.0.0"))), None);
    }
}

#[test]
fn what_does_not_compile_says_why() {
    for (operator, value, says) in [
        ("regex", json!("("), "regex parse error"),
        ("not_regex", json!(["x", "[a-"]), "regex parse error"),
        ("flag_evaluates_to", json!(true), "for flags only"),
    ] {
        let Err(e) = Compare::new(operator, &value) else {
            panic!("{operator} {value} compiled");
        };
        assert!(e.contains(says), "{operator}: {e}");
    }
}

#[test]
fn a_needle_is_offered_only_without_wildcards() {
    assert_eq!(plain_needle("ExAmple").as_deref(), Some(&b"example"[..]));
    for wild in ["a%b", "a_b", r"a\b"] {
        assert_eq!(plain_needle(wild), None, "{wild}");
    }
}
