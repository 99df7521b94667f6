//! Property operators (`exact`, `icontains`, `regex`, `gt`, dates, semver, ...), compiled once
//! per filter and matched per request, with the coercions of PostHog's flags service:
//! values compare as their text (a JSON string as is, anything else, null included, as its
//! JSON text); `exact`/`is_not` fold case fully while the substring operators fold ASCII
//! only; under `property_matching_version` 1 (the default) an `exact` filter of booleans
//! compares true/false-ness; numbers are read from untrimmed text. Only an absent key is
//! "missing": positive operators are then false and negated ones true.

use std::borrow::Cow;

use regex::{Regex, RegexBuilder};
use serde_json::Value;
use time::OffsetDateTime;

use super::date::{parse_property_instant, DateTarget};
use super::semver::SemverTest;

/// Longest regex pattern accepted; longer ones are treated as invalid (never match).
const MAX_REGEX_PATTERN_BYTES: usize = 4096;

/// Budget of a compiled regex program. The regex crate matches in linear time, so together
/// with the pattern limit this bounds both memory and per-request cost.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Budget of a regex's lazy DFA cache, per matching thread.
const REGEX_DFA_SIZE_LIMIT: usize = 1 << 20;

/// How a definitions file asks for values to be matched: its `property_matching_version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Matching {
    /// Version 1 (and a missing field): an `exact`/`is_not` filter whose values are all
    /// booleans or "true"/"false" compares truthiness. Version 2 compares text.
    pub(super) legacy_booleans: bool,
}

impl Default for Matching {
    fn default() -> Self {
        Matching {
            legacy_booleans: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NumberCmp {
    Gt,
    Gte,
    Lt,
    Lte,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DateCmp {
    Before,
    After,
    Exact,
}

/// What an `exact` / `is_not` filter compares against.
#[derive(Debug, Clone)]
pub(super) enum Equals {
    /// Legacy boolean matching: the property's truthiness must equal this.
    Truthy(bool),
    /// Fully lowercased candidates; a list filter value means "any of".
    AnyOf(Vec<String>),
}

/// One compiled operator with its filter value.
#[derive(Debug, Clone)]
pub(super) enum Operator {
    Exact(Equals),
    IsNot(Equals),
    /// ASCII-lowercased needles (one, or several for `icontains_multi`): any must occur.
    Contains {
        needles: Vec<String>,
        negate: bool,
    },
    /// `None` when the pattern is invalid or over budget: then neither form matches.
    Regex {
        pattern: Option<Regex>,
        negate: bool,
    },
    Number {
        cmp: NumberCmp,
        rhs: Option<f64>,
    },
    IsSet,
    IsNotSet,
    Date {
        cmp: DateCmp,
        target: Option<DateTarget>,
    },
    Semver(SemverTest),
    /// An operator that needs a value, given none: PostHog answers false, whatever the
    /// property (even for `is_not`).
    Never,
}

impl Operator {
    /// [`Operator::compile_with`] under the default matching version.
    #[cfg(test)]
    pub(super) fn compile(operator: Option<&str>, value: &Value) -> Option<Operator> {
        Operator::compile_with(operator, value, Matching::default())
    }

    /// Compiles `operator` (absent means `exact`) against the filter value; `None` when
    /// the operator is not one a person or group filter of a flag may use (see
    /// `vocabulary::OPERATORS`).
    pub(super) fn compile_with(
        operator: Option<&str>,
        value: &Value,
        matching: Matching,
    ) -> Option<Operator> {
        let name = operator.unwrap_or("exact");
        // The `not_` forms share their positive form's value handling.
        let (base, negate) = match name.strip_prefix("not_") {
            Some(base @ ("icontains" | "icontains_multi" | "regex")) => (base, true),
            _ => (name, false),
        };
        let lower = || ascii_lowered(value);
        let number_cmp = |cmp| Operator::Number {
            cmp,
            rhs: number(value),
        };
        let date_cmp = |cmp| Operator::Date {
            cmp,
            target: DateTarget::parse(value),
        };
        let valueless = matches!(base, "is_set" | "is_not_set");
        if value.is_null() && !valueless {
            // Still reject names PostHog does not know.
            return Operator::compile_with(Some(name), &Value::from(""), matching)
                .map(|_| Operator::Never);
        }
        let op = match base {
            "exact" => Operator::Exact(Equals::compile(value, matching)),
            "is_not" => Operator::IsNot(Equals::compile(value, matching)),
            "icontains" => Operator::Contains {
                needles: vec![lower()],
                negate,
            },
            "icontains_multi" => Operator::Contains {
                needles: match value {
                    Value::Array(items) => items.iter().map(ascii_lowered).collect(),
                    single => vec![ascii_lowered(single)],
                },
                negate,
            },
            "regex" => Operator::Regex {
                pattern: compile_regex(value),
                negate,
            },
            "gt" => number_cmp(NumberCmp::Gt),
            "gte" => number_cmp(NumberCmp::Gte),
            "lt" => number_cmp(NumberCmp::Lt),
            "lte" => number_cmp(NumberCmp::Lte),
            "is_set" => Operator::IsSet,
            "is_not_set" => Operator::IsNotSet,
            "is_date_before" => date_cmp(DateCmp::Before),
            "is_date_after" => date_cmp(DateCmp::After),
            "is_date_exact" => date_cmp(DateCmp::Exact),
            other => Operator::Semver(SemverTest::compile(other.strip_prefix("semver_")?, value)?),
        };
        Some(op)
    }

    /// Whether the property value `actual` (None when the key is absent) passes.
    pub(super) fn matches(&self, actual: Option<&Value>, now: OffsetDateTime) -> bool {
        let actual = match (self, actual) {
            (Operator::IsSet, _) => return actual.is_some(),
            (Operator::IsNotSet, _) => return actual.is_none(),
            (Operator::Never, _) => return false,
            (_, None) => return self.matches_absent(),
            (_, Some(value)) => value,
        };
        match self {
            Operator::Exact(equals) => equals.matches(actual),
            Operator::IsNot(equals) => !equals.matches(actual),
            Operator::Contains { needles, negate } => {
                with_ascii_lowered(actual, |s| needles.iter().any(|n| s.contains(n.as_str())))
                    != *negate
            }
            Operator::Regex { pattern, negate } => match pattern {
                Some(re) => re.is_match(&text(actual)) != *negate,
                None => false,
            },
            Operator::Number { cmp, rhs } => match (number(actual), rhs) {
                (Some(lhs), Some(rhs)) => match cmp {
                    NumberCmp::Gt => lhs > *rhs,
                    NumberCmp::Gte => lhs >= *rhs,
                    NumberCmp::Lt => lhs < *rhs,
                    NumberCmp::Lte => lhs <= *rhs,
                },
                _ => false,
            },
            Operator::Date { cmp, target } => date_matches(*cmp, target.as_ref(), actual, now),
            Operator::Semver(test) => test.matches(actual),
            Operator::IsSet | Operator::IsNotSet | Operator::Never => false,
        }
    }

    /// The answer for a property the person (or group) does not have: conclusively absent,
    /// so exactly the negated operators hold.
    fn matches_absent(&self) -> bool {
        match self {
            Operator::IsNot(_) | Operator::IsNotSet => true,
            Operator::Contains { negate, .. } | Operator::Regex { negate, .. } => *negate,
            _ => false,
        }
    }
}

impl Equals {
    fn compile(value: &Value, matching: Matching) -> Equals {
        if matching.legacy_booleans && is_boolean_like(value) {
            return Equals::Truthy(is_truthy(value));
        }
        match value {
            Value::Array(items) => Equals::AnyOf(items.iter().map(lowered).collect()),
            scalar => Equals::AnyOf(vec![lowered(scalar)]),
        }
    }

    fn matches(&self, actual: &Value) -> bool {
        match self {
            Equals::Truthy(want) => is_truthy(actual) == *want,
            Equals::AnyOf(candidates) => {
                with_lowered(actual, |actual| candidates.iter().any(|c| c == actual))
            }
        }
    }
}

/// A boolean, "true"/"false" in any case, or a list of only those (an empty list too).
fn is_boolean_like(value: &Value) -> bool {
    match value {
        Value::Bool(_) => true,
        Value::String(s) => s.eq_ignore_ascii_case("true") || s.eq_ignore_ascii_case("false"),
        Value::Array(items) => items.iter().all(is_boolean_like),
        _ => false,
    }
}

/// `true`, "true" in any case, or a list of only those; everything else is false.
fn is_truthy(value: &Value) -> bool {
    match value {
        Value::Bool(b) => *b,
        Value::String(s) => s.eq_ignore_ascii_case("true"),
        Value::Array(items) => items.iter().all(is_truthy),
        _ => false,
    }
}

/// PostHog's string form of a value: a string as is, anything else as its JSON text.
pub(super) fn text(value: &Value) -> Cow<'_, str> {
    match value {
        Value::String(s) => Cow::Borrowed(s),
        other => Cow::Owned(other.to_string()),
    }
}

fn lowered(value: &Value) -> String {
    text(value).to_lowercase()
}

fn ascii_lowered(value: &Value) -> String {
    text(value).to_ascii_lowercase()
}

/// Strings up to this long are lowercased on the stack when they are ASCII.
const STACK_LOWERCASE_BYTES: usize = 256;

/// `f` of the ASCII lowercase form of a short ASCII string, without allocating; `f` back
/// when the value is not one.
fn on_stack<R, F: FnOnce(&str) -> R>(value: &Value, f: F) -> Result<R, F> {
    if let Value::String(s) = value {
        if s.len() <= STACK_LOWERCASE_BYTES && s.is_ascii() {
            let mut buffer = [0u8; STACK_LOWERCASE_BYTES];
            let lower = &mut buffer[..s.len()];
            lower.copy_from_slice(s.as_bytes());
            lower.make_ascii_lowercase();
            if let Ok(lower) = std::str::from_utf8(lower) {
                return Ok(f(lower));
            }
        }
    }
    Err(f)
}

/// `f` of `lowered(value)` (full Unicode folding, as `exact` does). Property values are
/// mostly short ASCII strings, whose lowercase form needs no allocation.
fn with_lowered<R>(value: &Value, f: impl FnOnce(&str) -> R) -> R {
    on_stack(value, f).unwrap_or_else(|f| f(&lowered(value)))
}

/// `f` of the ASCII-only lowercase text, as the substring operators fold case.
fn with_ascii_lowered<R>(value: &Value, f: impl FnOnce(&str) -> R) -> R {
    on_stack(value, f).unwrap_or_else(|f| f(&ascii_lowered(value)))
}

/// A number, or text that parses as one exactly as written (no trimming: `"30 "` is not
/// a number to PostHog's flags service); booleans and null are not numbers.
fn number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse::<f64>().ok(),
        _ => None,
    }
}

pub(super) fn compile_regex(value: &Value) -> Option<Regex> {
    let pattern = text(value);
    if pattern.len() > MAX_REGEX_PATTERN_BYTES {
        return None;
    }
    bounded_regex(&pattern).ok()
}

/// A pattern a user wrote, compiled within the program and cache budgets above (the
/// flags' `regex`, and the read API's and console's property filters).
pub fn bounded_regex(pattern: &str) -> Result<Regex, regex::Error> {
    RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_DFA_SIZE_LIMIT)
        .build()
}

fn date_matches(
    cmp: DateCmp,
    target: Option<&DateTarget>,
    actual: &Value,
    now: OffsetDateTime,
) -> bool {
    let (Some(actual), Some(target)) = (
        parse_property_instant(actual, now),
        target.and_then(|t| t.resolve(now)),
    ) else {
        return false;
    };
    match cmp {
        DateCmp::Before => actual < target,
        DateCmp::After => actual > target,
        DateCmp::Exact => actual == target,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lowercasing_on_the_stack_agrees_with_to_lowercase() {
        let long = "AbC".repeat(100);
        for value in [
            json!("MiXeD Case@Example.COM"),
            json!(""),
            json!("ÉCOLE Ünïcode"),
            json!(long),
            json!(12.5),
            json!(true),
            json!(["A"]),
        ] {
            assert_eq!(
                with_lowered(&value, str::to_owned),
                lowered(&value),
                "{value}"
            );
        }
    }
}
