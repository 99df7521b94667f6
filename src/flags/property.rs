//! Property operators (`exact`, `icontains`, `regex`, `gt`, dates, semver, ...), compiled once
//! per filter and matched per request. Comparisons follow PostHog: values are compared as
//! their string form (a JSON string as is, anything else as its JSON text), lowercased for
//! the case-insensitive operators, so `true`, `"true"` and `"TRUE"` are the same.
//! A missing property (or a null one) makes positive operators false and negated ones true.

use std::borrow::Cow;

use regex::{Regex, RegexBuilder};
use serde_json::Value;
use time::OffsetDateTime;

use super::date::{parse_instant, DateTarget};
use super::semver::SemverTest;

/// Longest regex pattern accepted; longer ones are treated as invalid (never match).
const MAX_REGEX_PATTERN_BYTES: usize = 4096;

/// Budget of a compiled regex program. The regex crate matches in linear time, so together
/// with the pattern limit this bounds both memory and per-request cost.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Budget of a regex's lazy DFA cache, per matching thread.
const REGEX_DFA_SIZE_LIMIT: usize = 1 << 20;

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

/// One compiled operator with its filter value.
#[derive(Debug, Clone)]
pub(super) enum Operator {
    /// Lowercased candidates; a list filter value means "any of".
    Exact(Vec<String>),
    IsNot(Vec<String>),
    Contains {
        needle: String,
        negate: bool,
    },
    StartsWith {
        prefix: String,
        negate: bool,
    },
    EndsWith {
        suffix: String,
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
}

impl Operator {
    /// Compiles `operator` (absent means `exact`) against the filter value; `None` when the
    /// operator name is unknown.
    pub(super) fn compile(operator: Option<&str>, value: &Value) -> Option<Operator> {
        let name = operator.unwrap_or("exact");
        // The `not_` forms share their positive form's value handling.
        let (base, negate) = match name.strip_prefix("not_") {
            Some(base @ ("icontains" | "starts_with" | "ends_with" | "regex")) => (base, true),
            _ => (name, false),
        };
        let lower = || text(value).to_lowercase();
        let number_cmp = |cmp| Operator::Number {
            cmp,
            rhs: number(value),
        };
        let date_cmp = |cmp| Operator::Date {
            cmp,
            target: DateTarget::parse(value),
        };
        let op = match base {
            "exact" => Operator::Exact(candidates(value)),
            "is_not" => Operator::IsNot(candidates(value)),
            "icontains" => Operator::Contains {
                needle: lower(),
                negate,
            },
            "starts_with" => Operator::StartsWith {
                prefix: lower(),
                negate,
            },
            "ends_with" => Operator::EndsWith {
                suffix: lower(),
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
            (_, None | Some(Value::Null)) => return self.matches_absent(),
            (_, Some(value)) => value,
        };
        match self {
            Operator::Exact(candidates) => is_any_of(candidates, actual),
            Operator::IsNot(candidates) => !is_any_of(candidates, actual),
            Operator::Contains { needle, negate } => {
                with_lowered(actual, |s| s.contains(needle.as_str())) != *negate
            }
            Operator::StartsWith { prefix, negate } => {
                with_lowered(actual, |s| s.starts_with(prefix.as_str())) != *negate
            }
            Operator::EndsWith { suffix, negate } => {
                with_lowered(actual, |s| s.ends_with(suffix.as_str())) != *negate
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
            Operator::IsSet | Operator::IsNotSet => false,
        }
    }

    /// The answer for a property the person (or group) does not have: conclusively absent,
    /// so exactly the negated operators hold.
    fn matches_absent(&self) -> bool {
        match self {
            Operator::IsNot(_) | Operator::IsNotSet => true,
            Operator::Contains { negate, .. }
            | Operator::StartsWith { negate, .. }
            | Operator::EndsWith { negate, .. } => *negate,
            Operator::Regex { pattern, negate } => pattern.is_some() && *negate,
            _ => false,
        }
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

/// Strings up to this long are lowercased on the stack when they are ASCII.
const STACK_LOWERCASE_BYTES: usize = 256;

/// `f` of `lowered(value)`. Property values are mostly short ASCII strings, whose
/// lowercase form (the same as `to_lowercase` gives for ASCII) needs no allocation.
fn with_lowered<R>(value: &Value, f: impl FnOnce(&str) -> R) -> R {
    if let Value::String(s) = value {
        if s.len() <= STACK_LOWERCASE_BYTES && s.is_ascii() {
            let mut buffer = [0u8; STACK_LOWERCASE_BYTES];
            let lower = &mut buffer[..s.len()];
            lower.copy_from_slice(s.as_bytes());
            lower.make_ascii_lowercase();
            if let Ok(lower) = std::str::from_utf8(lower) {
                return f(lower);
            }
        }
    }
    f(&lowered(value))
}

fn candidates(value: &Value) -> Vec<String> {
    match value {
        Value::Array(items) => items.iter().map(lowered).collect(),
        scalar => vec![lowered(scalar)],
    }
}

fn is_any_of(candidates: &[String], actual: &Value) -> bool {
    with_lowered(actual, |actual| candidates.iter().any(|c| c == actual))
}

/// A number, or a string that parses as a finite one; booleans are not numbers.
fn number(value: &Value) -> Option<f64> {
    let n = match value {
        Value::Number(n) => n.as_f64()?,
        Value::String(s) => s.trim().parse::<f64>().ok()?,
        _ => return None,
    };
    n.is_finite().then_some(n)
}

fn compile_regex(value: &Value) -> Option<Regex> {
    let pattern = text(value);
    if pattern.len() > MAX_REGEX_PATTERN_BYTES {
        return None;
    }
    RegexBuilder::new(&pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_DFA_SIZE_LIMIT)
        .build()
        .ok()
}

fn date_matches(
    cmp: DateCmp,
    target: Option<&DateTarget>,
    actual: &Value,
    now: OffsetDateTime,
) -> bool {
    let (Some(actual), Some(target)) = (parse_instant(actual), target.and_then(|t| t.resolve(now)))
    else {
        return false;
    };
    match cmp {
        DateCmp::Before => actual.at() < target.at(),
        DateCmp::After => actual.at() > target.at(),
        DateCmp::Exact => actual.same_as(&target),
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
