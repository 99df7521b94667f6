//! The values inside a flag's filters that PostHog's serializer checks one by one, in
//! its words: rollout percentages (a number, or null where allowed, within 0-100), the
//! patterns of `regex` filters (they must compile as serving compiles them), and the
//! operator aliases it stores as the operators they mean. `validate` calls these before
//! the checks of the whole flag.

use serde_json::{Map, Value};

use super::error::{filters as invalid_filters, Error};
use crate::flags::vocabulary::{self, ALIASES};

/// PostHog's serializer stores `min` and `max` as the operators they mean.
pub(super) fn resolve_aliases(filters: &mut Map<String, Value>) {
    let Some(Value::Array(groups)) = filters.get_mut("groups") else {
        return;
    };
    for group in groups {
        let Some(Value::Array(properties)) = group.get_mut("properties") else {
            continue;
        };
        for p in properties.iter_mut().filter_map(Value::as_object_mut) {
            let op = p.get("operator").and_then(Value::as_str);
            if let Some((_, to)) = ALIASES.iter().find(|(from, _)| Some(*from) == op) {
                p.insert("operator".into(), Value::from(*to));
            }
        }
    }
}

/// A rollout percentage: a number (or null, where allowed) within 0-100, in PostHog's
/// words, which name the type as Python does.
pub(super) fn percentage(value: Option<&Value>, path: &str, allow_null: bool) -> Result<(), Error> {
    let number = match value {
        None | Some(Value::Null) if allow_null => return Ok(()),
        None | Some(Value::Null) => {
            return Err(invalid_filters(format!(
                "{path} must be a number, got null"
            )))
        }
        Some(Value::Number(n)) => n,
        Some(other) => {
            let expected = if allow_null {
                "a number or null"
            } else {
                "a number"
            };
            let got = python_type(other);
            return Err(invalid_filters(format!(
                "{path} must be {expected}, got {got}"
            )));
        }
    };
    match number.as_f64() {
        Some(n) if (0.0..=100.0).contains(&n) => Ok(()),
        _ => Err(invalid_filters(format!(
            "{path} must be between 0 and 100, got {number}"
        ))),
    }
}

fn python_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(_) => "float",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// Every `regex` and `not_regex` pattern must compile as serving compiles it: one that
/// does not never matches, so the flag would silently never match.
pub(super) fn regexes(groups: &[Value]) -> Result<(), Error> {
    for (i, group) in groups.iter().enumerate() {
        let properties = group.get("properties").and_then(Value::as_array);
        for (j, p) in properties.into_iter().flatten().enumerate() {
            let op = p.get("operator").and_then(Value::as_str);
            let value = p.get("value").and_then(Value::as_str);
            if let (Some("regex" | "not_regex"), Some(pattern)) = (op, value) {
                if !vocabulary::regex_compiles(pattern) {
                    let detail =
                        format!("groups[{i}].properties[{j}].value: invalid regex pattern");
                    return Err(invalid_filters(detail));
                }
            }
        }
    }
    Ok(())
}
