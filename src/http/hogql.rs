//! A property filter compared as PostHog's events API and its UI compare it: HogQL's
//! `property_to_expr` (PostHog's `posthog/hogql/property.py`) printed with its null
//! rules, where the flags ([`crate::flags`]) compare as `/decide` does. What differs:
//!
//! - A property that is absent or JSON `null` has no value: `is_set` fails, and of
//!   the rest only the negative operators pass (`is_not`, `not_icontains`,
//!   `not_regex`, `semver_neq`), as HogQL's `ifNull(..., 1)` makes them.
//! - `exact` and `is_not` compare text case-sensitively. A stored number equals a
//!   filter value that reads as the same number, a stored boolean `true`/`"true"` (as
//!   PostHog's Numeric and Boolean property types compare), text equals the filter
//!   value's text (`12` is `"12"`), a list or object its JSON text.
//! - `icontains` is `ILIKE '%value%'` on the value's text: `%` and `_` in the value are
//!   wildcards, ASCII letters fold. Several values (or `icontains_multi`) are any of
//!   them as plain text.
//! - `regex` searches the value's text, case-sensitively; a number is its JSON text.
//! - `gt`, `gte`, `lt`, `lte`: numbers (or text that reads as one) compare as numbers,
//!   other text with text as bytes; anything else fails.
//! - A list of values is any of them (all of them not, for the negative operators);
//!   an empty list filters nothing.
//! - Dates and versions (`is_date_*`, `semver_*`) are compared as the flags compare
//!   them, with the null rule above.

use std::borrow::Cow;
use std::cmp::Ordering;

use regex::Regex;
use serde_json::Value;

// Patterns come from users: compiled within the flags' budgets.
use crate::flags::vocabulary::bounded_regex as pattern;

/// One property's test, compiled from a filter's operator and value.
pub struct Compare {
    test: Test,
    /// Whether the operator is a negative one: it passes what does not match, and a
    /// property without a value.
    negative: bool,
}

enum Test {
    /// A filter that passes every event (an empty list of values).
    Always,
    /// `is_set` (true) or `is_not_set`.
    Set(bool),
    /// `exact`, `is_not`: equal to any of these.
    Equals(Vec<Value>),
    /// `icontains` of one value: `ILIKE`, a pattern on the ASCII-lowercased text.
    Like(Regex),
    /// `icontains` of several values, `icontains_multi`: any of these ASCII-lowercased.
    Contains(Vec<String>),
    /// `regex`, `not_regex`: any of these found.
    Regex(Vec<Regex>),
    /// `gt`, `gte`, `lt`, `lte`: the orderings that pass, against any of these.
    Order(&'static [Ordering], Vec<Value>),
    /// Dates and versions: the flags' test of a value.
    Flags,
}

impl Compare {
    /// The test of `operator` with `value`; why not, if it cannot be compiled.
    pub fn new(operator: &str, value: &Value) -> Result<Compare, String> {
        let values = match value {
            Value::Array(values) => values.clone(),
            value => vec![value.clone()],
        };
        let negative = matches!(
            operator,
            "is_not" | "not_icontains" | "not_icontains_multi" | "not_regex" | "semver_neq"
        );
        let test = match operator {
            "is_set" | "is_not_set" => Test::Set(operator == "is_set"),
            _ if values.is_empty() => Test::Always,
            "exact" | "is_not" => Test::Equals(values),
            "icontains" | "not_icontains" if values.len() == 1 => {
                Test::Like(like(&text(&values[0]))?)
            }
            "icontains" | "not_icontains" | "icontains_multi" | "not_icontains_multi" => {
                Test::Contains(
                    values
                        .iter()
                        .map(|v| text(v).to_ascii_lowercase())
                        .collect(),
                )
            }
            "regex" | "not_regex" => Test::Regex(
                (values.iter())
                    .map(|v| pattern(&text(v)).map_err(|e| e.to_string()))
                    .collect::<Result<_, _>>()?,
            ),
            "gt" => Test::Order(&[Ordering::Greater], values),
            "gte" => Test::Order(&[Ordering::Greater, Ordering::Equal], values),
            "lt" => Test::Order(&[Ordering::Less], values),
            "lte" => Test::Order(&[Ordering::Less, Ordering::Equal], values),
            _ if operator.starts_with("is_date_") || operator.starts_with("semver_") => Test::Flags,
            _ => return Err(format!("the operator {operator:?} is for flags only")),
        };
        Ok(Compare { test, negative })
    }

    /// Whether a property whose value is `value` (None: absent) passes; None when the
    /// flags' test of the value answers.
    pub fn test(&self, value: Option<&Value>) -> Option<bool> {
        let value = value.filter(|v| !v.is_null());
        let found = match (&self.test, value) {
            (Test::Always, _) => return Some(true),
            (Test::Set(set), value) => return Some(value.is_some() == *set),
            (_, None) => return Some(self.negative),
            (Test::Flags, Some(_)) => return None,
            (Test::Equals(values), Some(v)) => values.iter().any(|f| equal(v, f)),
            (Test::Like(pattern), Some(v)) => pattern.is_match(&text(v).to_ascii_lowercase()),
            (Test::Contains(needles), Some(v)) => {
                let text = text(v).to_ascii_lowercase();
                needles.iter().any(|n| text.contains(n.as_str()))
            }
            (Test::Regex(patterns), Some(v)) => {
                let text = text(v);
                patterns.iter().any(|p| p.is_match(&text))
            }
            (Test::Order(pass, values), Some(v)) => {
                (values.iter()).any(|f| order(v, f).is_some_and(|o| pass.contains(&o)))
            }
        };
        Some(found != self.negative)
    }
}

/// A value as HogQL reads a property: text as itself, anything else as its JSON.
fn text(value: &Value) -> Cow<'_, str> {
    match value {
        Value::String(s) => Cow::Borrowed(s),
        other => Cow::Owned(other.to_string()),
    }
}

/// A value read as a number, as PostHog's Numeric properties read it.
fn number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok().filter(|n| n.is_finite()),
        _ => None,
    }
}

/// Whether a stored value equals a filter's value.
fn equal(stored: &Value, filter: &Value) -> bool {
    match stored {
        Value::Number(_) => number(stored).is_some_and(|n| number(filter) == Some(n)),
        Value::Bool(b) => text(filter) == if *b { "true" } else { "false" },
        _ => text(stored) == text(filter),
    }
}

/// A stored value against a filter's: as numbers if both read as one, else text with
/// text; None when they do not compare.
fn order(stored: &Value, filter: &Value) -> Option<Ordering> {
    match (number(stored), number(filter), stored, filter) {
        (Some(a), Some(b), ..) => a.partial_cmp(&b),
        (_, _, Value::String(a), Value::String(b)) => Some(a.as_bytes().cmp(b.as_bytes())),
        _ => None,
    }
}

/// `ILIKE '%value%'` as a pattern of ASCII-lowercased text: `%` any text, `_` any one
/// character, `\` takes the next one as it is.
fn like(value: &str) -> Result<Regex, String> {
    let mut source = String::from("(?s)^.*");
    let value = value.to_ascii_lowercase();
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        match c {
            '%' => source.push_str(".*"),
            '_' => source.push('.'),
            '\\' => source.push_str(&regex::escape(&chars.next().unwrap_or('\\').to_string())),
            c => source.push_str(&regex::escape(&c.to_string())),
        }
    }
    source.push_str(".*$");
    pattern(&source).map_err(|e| e.to_string())
}

/// The text an `icontains` of `value` looks for as it is (ASCII-lowercased), when it
/// holds no wildcard.
pub fn plain_needle(value: &str) -> Option<Vec<u8>> {
    (!value.contains(['%', '_', '\\'])).then(|| value.to_ascii_lowercase().into_bytes())
}

#[cfg(test)]
#[path = "tests/hogql.rs"]
mod tests;
