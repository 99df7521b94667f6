//! Every property operator with its edge cases: missing and null properties, lists, type
//! mismatches, numeric strings, booleans written as strings, invalid patterns and dates.

use serde_json::{json, Value};

use super::NOW;
use crate::flags::property::Operator;

/// Whether `operator` with filter `value` matches the property `actual` (None = absent).
fn check(operator: &str, value: Value, actual: Option<Value>) -> bool {
    let op = Operator::compile(Some(operator), &value).expect("known operator");
    op.matches(actual.as_ref(), NOW)
}

fn is(operator: &str, value: Value, actual: Value) -> bool {
    check(operator, value, Some(actual))
}

#[test]
fn unknown_operators_are_rejected() {
    assert!(Operator::compile(Some("foo"), &json!(1)).is_none());
    assert!(Operator::compile(Some("semver_foo"), &json!("1.0.0")).is_none());
    assert!(
        Operator::compile(None, &json!("x")).is_some(),
        "absent means exact"
    );
}

#[test]
fn exact_is_case_insensitive_and_any_of_a_list() {
    assert!(is("exact", json!("Pro"), json!("pro")));
    assert!(is("exact", json!(["free", "PRO"]), json!("Pro")));
    assert!(!is("exact", json!(["free", "team"]), json!("pro")));
    assert!(
        !is("exact", json!([]), json!("pro")),
        "empty list never matches"
    );
    assert!(!is("exact", json!([]), json!("")));
    assert!(!is("exact", json!("pro"), json!("professional")));
}

#[test]
fn exact_coerces_booleans_and_numbers_through_their_text() {
    assert!(is("exact", json!(true), json!("true")));
    assert!(is("exact", json!("true"), json!(true)));
    assert!(is("exact", json!(["TRUE"]), json!(true)));
    assert!(is("exact", json!(false), json!("False")));
    assert!(!is("exact", json!(true), json!(false)));
    assert!(is("exact", json!(5), json!("5")));
    assert!(is("exact", json!("5"), json!(5)));
    assert!(!is("exact", json!("5"), json!(5.0)), "5.0 is written 5.0");
    assert!(!is("exact", json!(1), json!(true)));
}

/// An `exact` filter of booleans compares the property's truthiness, whatever the
/// property is, as PostHog's flags service does (`is_truthy_or_falsy_property_value`
/// on the filter, `is_truthy_property_value` on both sides): `false` matches every
/// value that is not true-ish, and `true` a list of only true-ish values (an empty list
/// among them).
#[test]
fn exact_of_booleans_compares_the_propertys_truthiness() {
    for filter in [
        json!(false),
        json!("false"),
        json!("FALSE"),
        json!([false]),
        json!(["false"]),
    ] {
        for actual in [
            json!("no"),
            json!(0),
            json!(""),
            json!("truest"),
            Value::Null,
        ] {
            assert!(
                is("exact", filter.clone(), actual.clone()),
                "{filter} {actual}"
            );
            assert!(
                !is("is_not", filter.clone(), actual.clone()),
                "{filter} {actual}"
            );
        }
        assert!(!is("exact", filter.clone(), json!([true])), "{filter}");
    }
    for filter in [json!(true), json!("True"), json!([true]), json!(["TRUE"])] {
        for actual in [json!([true]), json!(["True", true]), json!([])] {
            assert!(
                is("exact", filter.clone(), actual.clone()),
                "{filter} {actual}"
            );
        }
        for actual in [json!([true, "no"]), json!("yes"), json!(1)] {
            assert!(
                !is("exact", filter.clone(), actual.clone()),
                "{filter} {actual}"
            );
        }
    }
}

#[test]
fn is_not_is_the_negation_and_true_when_missing() {
    assert!(!is("is_not", json!("pro"), json!("PRO")));
    assert!(is("is_not", json!(["free", "team"]), json!("pro")));
    assert!(is("is_not", json!([]), json!("pro")));
    assert!(is("is_not", json!(true), json!("false")));
    assert!(check("is_not", json!("pro"), None));
    assert!(check("is_not", json!("pro"), Some(Value::Null)));
    assert!(!check("exact", json!("pro"), None));
    assert!(!check("exact", json!("pro"), Some(Value::Null)));
}

#[test]
fn contains_lowercases_both_sides() {
    assert!(is("icontains", json!("GMAIL"), json!("ann@Gmail.com")));
    assert!(!is("icontains", json!("yahoo"), json!("ann@gmail.com")));
    assert!(is("not_icontains", json!("yahoo"), json!("ann@gmail.com")));
    assert!(!is("not_icontains", json!("GMAIL"), json!("ann@gmail.com")));
    assert!(
        is("icontains", json!(12), json!(312)),
        "numbers compare as text"
    );
}

/// PostHog's flags have no affix or range operators; a flag file using one is refused
/// (the regex forms say the same: `^ann`, `@x\.io$`).
#[test]
fn operators_posthogs_flags_do_not_have_are_rejected() {
    for op in [
        "starts_with",
        "not_starts_with",
        "ends_with",
        "not_ends_with",
        "between",
        "not_between",
        "min",
        "max",
        "is_cleaned_path_exact",
    ] {
        assert!(Operator::compile(Some(op), &json!("x")).is_none(), "{op}");
    }
    for op in crate::flags::vocabulary::OPERATORS {
        let person = !matches!(*op, "in" | "not_in" | "flag_evaluates_to");
        let compiled = Operator::compile(Some(op), &json!("1.2.3")).is_some();
        assert_eq!(compiled, person, "{op}");
    }
}

#[test]
fn contains_family_when_missing() {
    assert!(!check("icontains", json!("a"), None));
    assert!(check("not_icontains", json!("a"), None));
    assert!(!check("icontains", json!("a"), Some(Value::Null)));
    assert!(check("not_icontains", json!("a"), Some(Value::Null)));
}

#[test]
fn regex_is_a_case_sensitive_search() {
    assert!(is(
        "regex",
        json!("@example\\.com$"),
        json!("a@example.com")
    ));
    assert!(!is(
        "regex",
        json!("@example\\.com$"),
        json!("a@EXAMPLE.com")
    ));
    assert!(is("regex", json!("ex"), json!("next")), "search anywhere");
    assert!(is("regex", json!("^4"), json!(42)), "numbers as text");
    assert!(is("not_regex", json!("^admin"), json!("user")));
    assert!(!is("not_regex", json!("^admin"), json!("admin-1")));
    assert!(!check("regex", json!("x"), None));
    assert!(check("not_regex", json!("x"), None));
}

#[test]
fn invalid_regex_makes_both_forms_false() {
    for pattern in [json!("(unclosed"), json!("a{2,1}"), json!("(?<=x)y")] {
        assert!(
            !is("regex", pattern.clone(), json!("anything")),
            "{pattern}"
        );
        assert!(
            !is("not_regex", pattern.clone(), json!("anything")),
            "{pattern}"
        );
        // PostHog decides an absent property before it looks at the pattern.
        assert!(check("not_regex", pattern, None));
    }
}

#[test]
fn regex_cost_is_bounded() {
    let oversized = "a".repeat(5000);
    assert!(!is("regex", json!(oversized), json!("a")));
    // A pattern whose compiled form blows the size budget is invalid, not slow.
    assert!(!is("regex", json!("(\\w{100}){100}"), json!("x")));
    assert!(!is("not_regex", json!("(\\w{100}){100}"), json!("x")));
    // The classic catastrophic-backtracking pattern runs in linear time.
    let haystack = format!("{}!", "a".repeat(50_000));
    assert!(!is("regex", json!("^(a+)+$"), json!(haystack)));
}

#[test]
fn numeric_comparisons_parse_numeric_strings() {
    assert!(is("gt", json!(10), json!(11)));
    assert!(!is("gt", json!(10), json!(10)));
    assert!(is("gte", json!(10), json!(10)));
    assert!(is("lt", json!("10"), json!("9.5")));
    // Text is read as written: PostHog's flags service does not trim.
    assert!(!is("lte", json!(" 10 "), json!(10.0)));
    assert!(!is("lte", json!(10), json!("10 ")));
    assert!(is("gt", json!("1e3"), json!(1001)));
    assert!(
        !is("gt", json!(10), json!("eleven")),
        "not a number: no match"
    );
    assert!(!is("lt", json!(10), json!("eleven")));
    assert!(!is("gt", json!("ten"), json!(11)));
    assert!(!is("gt", json!(0), json!(true)), "booleans are not numbers");
    assert!(!is("gt", json!(0), json!("NaN")));
    // Rust's float syntax, as PostHog's flags service reads numbers.
    assert!(is("lt", json!(0), json!("-inf")));
    assert!(!check("gt", json!(0), None));
    assert!(!check("lt", json!(0), Some(Value::Null)));
}

/// Each comparison on equal values, where only the operator tells `<` from `<=`: as
/// PostHog compares (`lt` strict, `lte` not; a date strictly before or after).
#[test]
fn comparisons_on_equal_values() {
    assert!(!is("lt", json!(10), json!(10)));
    assert!(is("lte", json!(10), json!(10)));
    assert!(is("lte", json!("10"), json!(9.5)));
    assert!(!is("lte", json!(10), json!(10.5)));
    assert!(!is("gte", json!(10), json!(9.5)));
    assert!(is("gt", json!(10), json!("10.5")));
    let midnight = json!("2024-01-01T00:00:00Z");
    assert!(!is("is_date_after", json!("2024-01-01"), midnight.clone()));
    assert!(!is("is_date_before", json!("2024-01-01"), midnight));
}

#[test]
fn is_set_and_is_not_set_count_null_as_present() {
    assert!(check("is_set", json!("is_set"), Some(json!("x"))));
    assert!(check("is_set", json!("is_set"), Some(Value::Null)));
    assert!(!check("is_set", json!("is_set"), None));
    assert!(check("is_not_set", json!("is_not_set"), None));
    assert!(!check("is_not_set", json!("is_not_set"), Some(Value::Null)));
    assert!(!check(
        "is_not_set",
        json!("is_not_set"),
        Some(json!(false))
    ));
}

#[test]
fn absolute_dates() {
    assert!(is(
        "is_date_before",
        json!("2024-01-01"),
        json!("2023-12-31T23:59:59Z")
    ));
    assert!(!is(
        "is_date_before",
        json!("2024-01-01"),
        json!("2024-01-01T00:00:00Z")
    ));
    assert!(is(
        "is_date_after",
        json!("2024-01-01T00:00:00Z"),
        json!("2024-01-01 00:00:01")
    ));
    assert!(is(
        "is_date_after",
        json!("2024-01-01"),
        json!(1_704_067_201)
    ));
    // A filter date must be text; epoch digits are read by their length.
    assert!(!is(
        "is_date_before",
        json!(1_704_067_200_000_i64),
        json!("2023-06-01")
    ));
    assert!(is(
        "is_date_before",
        json!("1704067200000"),
        json!("2023-06-01")
    ));
    assert!(is(
        "is_date_after",
        json!("2024-01-01T02:00:00+02:00"),
        json!("2024-01-01T01:00:00Z")
    ));
    // Exact means the same instant, as in PostHog: a bare date is its midnight.
    assert!(!is(
        "is_date_exact",
        json!("2024-01-01"),
        json!("2024-01-01T18:30:00Z")
    ));
    assert!(is(
        "is_date_exact",
        json!("2024-01-01"),
        json!("2024-01-01 00:00:00")
    ));
    assert!(!is(
        "is_date_exact",
        json!("2024-01-01"),
        json!("2024-01-02T00:00:00Z")
    ));
    assert!(is(
        "is_date_exact",
        json!("2024-01-01T10:00:00Z"),
        json!("2024-01-01T12:00:00+02:00")
    ));
}

#[test]
fn relative_dates_count_back_from_now() {
    // NOW is 2024-06-15 12:00 UTC.
    assert!(is(
        "is_date_after",
        json!("-7d"),
        json!("2024-06-09T12:00:00Z")
    ));
    assert!(!is(
        "is_date_after",
        json!("-7d"),
        json!("2024-06-08T11:59:59Z")
    ));
    assert!(is(
        "is_date_before",
        json!("-1m"),
        json!("2024-05-15T11:59:59Z")
    ));
    assert!(!is(
        "is_date_before",
        json!("-1m"),
        json!("2024-05-15T12:00:00Z")
    ));
    assert!(is("is_date_before", json!("1y"), json!("2023-06-15")));
    assert!(is("is_date_after", json!("-2w"), json!("2024-06-02")));
    assert!(is(
        "is_date_after",
        json!("-36h"),
        json!("2024-06-14T00:00:01Z")
    ));
    assert!(!is(
        "is_date_after",
        json!("-36h"),
        json!("2024-06-13T23:59:59Z")
    ));
}

#[test]
fn unusable_dates_never_match() {
    assert!(!is(
        "is_date_before",
        json!("not a date"),
        json!("2020-01-01")
    ));
    assert!(!is("is_date_after", json!("-7q"), json!("2024-06-14")));
    assert!(!is("is_date_after", json!("-10000d"), json!("2024-06-14")));
    assert!(!is("is_date_before", json!("2024-01-01"), json!("soon")));
    assert!(!is("is_date_before", json!("2024-01-01"), json!(true)));
    assert!(!is(
        "is_date_before",
        json!("2024-01-01"),
        json!(["2020-01-01"])
    ));
    assert!(!check("is_date_before", json!("2024-01-01"), None));
}

#[test]
fn semver_operators() {
    assert!(is("semver_eq", json!("1.2.3"), json!("v1.2.3-beta")));
    assert!(is("semver_neq", json!("1.2.3"), json!("1.2.4")));
    assert!(is("semver_gt", json!("1.2.3"), json!("1.10")));
    assert!(is("semver_gte", json!("1.2"), json!("1.2.0")));
    assert!(is("semver_lt", json!("2.0.0"), json!("1.99.99")));
    assert!(is("semver_lte", json!("2"), json!("2.0.0")));
    assert!(is("semver_tilde", json!("1.2.3"), json!("1.2.10")));
    assert!(!is("semver_tilde", json!("1.2.3"), json!("1.3.0")));
    assert!(is("semver_caret", json!("1.2.3"), json!("1.9.9")));
    assert!(!is("semver_caret", json!("1.2.3"), json!("2.0.0")));
    assert!(is("semver_wildcard", json!("1.2.*"), json!("1.2.99")));
    assert!(!is("semver_wildcard", json!("1.2.*"), json!("1.20.0")));
    assert!(!is("semver_gt", json!("1.0.0"), json!("latest")));
    assert!(!check("semver_eq", json!("1.0.0"), None));
    assert!(!check("semver_neq", json!("1.0.0"), None));
}
