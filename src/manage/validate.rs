//! The checks PostHog's `FeatureFlagSerializer` makes before it stores a flag (key
//! format and uniqueness, property types and operators, variants summing to 100,
//! overrides and payload keys that exist, cohorts and flags that exist, no dependency
//! cycle, percentages within 0-100, regexes that compile), with its messages and codes,
//! followed by the check only flagpost can make: the project compiles with the change,
//! `flags::lint` finds nothing in the flag (an unknown field) and no flag is disabled by
//! it, judged by the same compiler and lists that serve `/decide` and `flagpost check`
//! (`flags::ProjectRules`, `flags::vocabulary`), so the API never stores what serving
//! would refuse or switch off. PostHog lets an unchanged invalid regex through a PATCH;
//! flagpost refuses it whenever the filters are sent.

use std::collections::{BTreeSet, HashMap, HashSet};

use regex::Regex;
use serde_json::{Map, Value};

use super::error::{filters as invalid_filters, Error};
use super::file::{flag_id, is_deleted, FlagFile};
use super::values::{percentage, regexes, resolve_aliases};
use crate::flags::vocabulary::{self, NOT_FOR_FLAGS, OPERATORS, PROPERTY_TYPES};
use crate::flags::ProjectRules;

/// PostHog's key rule (`validate_key`).
const KEY_PATTERN: &str = r"^[a-zA-Z0-9_-]+$";
/// The model's `max_length` for keys.
const MAX_KEY_CHARS: usize = 400;

/// Operators whose value PostHog requires to be a string.
const STRING_OPERATORS: &[&str] = &[
    "regex",
    "icontains",
    "not_regex",
    "not_icontains",
    "gte",
    "lte",
    "gt",
    "lt",
];

/// The key of a new or renamed flag: a string of PostHog's characters that no other
/// live flag of the project uses.
pub fn key(value: Option<&Value>, file: &FlagFile, own_id: Option<i64>) -> Result<String, Error> {
    let key = match value {
        None | Some(Value::Null) => {
            return Err(Error::invalid("required", "This field is required.").at("key"))
        }
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(Error::invalid("invalid_input", "Not a valid string.").at("key")),
    };
    if key.is_empty() {
        return Err(Error::invalid("blank", "This field may not be blank.").at("key"));
    }
    if key.chars().count() > MAX_KEY_CHARS {
        let detail = format!("Ensure this field has no more than {MAX_KEY_CHARS} characters.");
        return Err(Error::invalid("max_length", detail).at("key"));
    }
    let taken = file.flags().iter().any(|f| {
        !is_deleted(f) && flag_id(f) != own_id && f.get("key").and_then(Value::as_str) == Some(&key)
    });
    if taken {
        let detail = "There is already a feature flag with this key.";
        return Err(Error::invalid("unique", detail).at("key"));
    }
    let pattern = Regex::new(KEY_PATTERN).map_err(|e| Error::Io(e.to_string()))?;
    if !pattern.is_match(&key) {
        let detail = "Only letters, numbers, hyphens (-) & underscores (_) are allowed.";
        return Err(Error::invalid("invalid_key", detail).at("key"));
    }
    Ok(key)
}

/// Checks `filters` of the flag `key` (id `own_id` when it exists) against the rest of
/// the project, and writes payloads that are not strings as JSON text, as PostHog
/// stores them.
pub fn filters(
    filters: &mut Map<String, Value>,
    key: &str,
    own_id: Option<i64>,
    file: &FlagFile,
) -> Result<(), Error> {
    resolve_aliases(filters);
    let groups = match filters.get("groups") {
        Some(Value::Array(g)) => g.clone(),
        Some(Value::Null) | None => Vec::new(),
        Some(_) => return Err(invalid_filters("groups must be a list")),
    };
    for (i, group) in groups.iter().enumerate() {
        let path = format!("groups[{i}].rollout_percentage");
        percentage(group.get("rollout_percentage"), &path, true)?;
    }
    let aggregation = filters
        .get("aggregation_group_type_index")
        .and_then(Value::as_i64);
    let mut properties = Vec::new();
    for group in &groups {
        let Some(group) = group.as_object() else {
            return Err(invalid_filters("each group must be an object"));
        };
        match group.get("properties") {
            Some(Value::Array(p)) => properties.extend(p.iter()),
            Some(Value::Null) | None => {}
            Some(_) => return Err(invalid_filters("properties must be a list")),
        }
    }
    for p in &properties {
        property_shape(p)?;
    }
    regexes(&groups)?;
    fn kind<'a>(p: &&'a Value) -> &'a str {
        p.get("type").and_then(Value::as_str).unwrap_or("")
    }
    fn operator<'a>(p: &&'a Value) -> Option<&'a str> {
        p.get("operator").and_then(Value::as_str)
    }
    match aggregation {
        None => {
            if !properties
                .iter()
                .all(|p| ["person", "cohort", "flag"].contains(&kind(p)))
            {
                return Err(invalid_filters(
                    "Filters are not valid (can only use person, cohort, and flag properties)",
                ));
            }
            let flags_ok = properties
                .iter()
                .all(|p| kind(p) != "flag" || operator(p) == Some("flag_evaluates_to"));
            if !flags_ok {
                return Err(invalid_filters(
                    "Flag properties must use the 'flag_evaluates_to' operator",
                ));
            }
            dependencies(&properties, key, own_id, file)?;
        }
        Some(index) => {
            let ok = properties.iter().all(|p| {
                kind(p) == "group"
                    && p.get("group_type_index").and_then(Value::as_i64) == Some(index)
            });
            if !ok {
                return Err(invalid_filters(
                    "Filters are not valid (can only use group properties)",
                ));
            }
        }
    }
    let variants = variant_keys(filters)?;
    for group in &groups {
        if let Some(v) = group.get("variant").and_then(Value::as_str) {
            if !v.is_empty() && !variants.contains(v) {
                return Err(invalid_filters(
                    "Filters are not valid (variant override does not exist)",
                ));
            }
        }
    }
    for p in &properties {
        property_value(p, file)?;
    }
    payloads(filters, &variants)
}

fn property_shape(p: &Value) -> Result<(), Error> {
    let Some(p) = p.as_object() else {
        return Err(invalid_filters("each property must be an object"));
    };
    let choice = |v: &str| {
        Error::invalid("invalid_choice", format!("\"{v}\" is not a valid choice.")).at("filters")
    };
    match p.get("type") {
        Some(Value::String(t)) if PROPERTY_TYPES.contains(&t.as_str()) => {}
        Some(Value::String(t)) => return Err(choice(t)),
        Some(other) => return Err(choice(&other.to_string())),
        None => return Err(invalid_filters("This field is required.")),
    }
    let op = match p.get("operator") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::String(op)) if OPERATORS.contains(&op.as_str()) => return Ok(()),
        Some(Value::String(op)) => op.clone(),
        Some(other) => other.to_string(),
    };
    if NOT_FOR_FLAGS.contains(&op.as_str()) {
        let detail = format!("Unsupported operator for feature flags: {op}");
        return Err(Error::invalid("unsupported_operator", detail).at("filters"));
    }
    // PostHog's message, then what to write instead.
    let detail = match vocabulary::hint(&op) {
        Some(hint) => format!("Invalid operator: {op} ({hint})"),
        None => format!("Invalid operator: {op}"),
    };
    Err(Error::invalid("invalid_operator", detail).at("filters"))
}

fn property_value(p: &Value, file: &FlagFile) -> Result<(), Error> {
    let value = p.get("value").unwrap_or(&Value::Null);
    if p.get("type").and_then(Value::as_str) == Some("cohort") {
        let id = match value {
            Value::Number(n) => n.to_string(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let exists = file.cohorts().is_some_and(|c| c.contains_key(id.trim()));
        if !exists {
            let detail = format!("Cohort with id {id} does not exist");
            return Err(Error::invalid("cohort_does_not_exist", detail).at("filters"));
        }
    }
    if let Some(op) = p.get("operator").and_then(Value::as_str) {
        if STRING_OPERATORS.contains(&op) && !value.is_string() {
            let detail = format!("Invalid value for operator {op}: {value}");
            return Err(Error::invalid("invalid_value", detail).at("filters"));
        }
    }
    Ok(())
}

fn variant_keys(filters: &Map<String, Value>) -> Result<BTreeSet<String>, Error> {
    let variants = match filters.get("multivariate").and_then(|m| m.get("variants")) {
        Some(Value::Array(v)) => v,
        Some(Value::Null) | None => return Ok(BTreeSet::new()),
        Some(_) => return Err(invalid_filters("multivariate.variants must be a list")),
    };
    let mut sum = 0.0;
    let mut keys = BTreeSet::new();
    for (i, v) in variants.iter().enumerate() {
        let path = format!("multivariate.variants[{i}].rollout_percentage");
        percentage(v.get("rollout_percentage"), &path, false)?;
    }
    for v in variants {
        let Some(k) = v.get("key").and_then(Value::as_str) else {
            return Err(invalid_filters("each variant needs a key"));
        };
        keys.insert(k.to_owned());
        sum += v
            .get("rollout_percentage")
            .and_then(Value::as_f64)
            .unwrap_or(0.0);
    }
    if !variants.is_empty() && sum != 100.0 {
        return Err(invalid_filters(
            "Invalid variant definitions: Variant rollout percentages must sum to 100.",
        ));
    }
    Ok(keys)
}

fn payloads(filters: &mut Map<String, Value>, variants: &BTreeSet<String>) -> Result<(), Error> {
    let payloads = match filters.get_mut("payloads") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(p)) => p,
        Some(_) => return Err(invalid_filters("Payloads must be passed as a dictionary")),
    };
    for value in payloads.values_mut() {
        match value {
            Value::String(s) => {
                if serde_json::from_str::<Value>(s).is_err() {
                    return Err(invalid_filters("Payload value is not valid JSON"));
                }
            }
            Value::Null => {}
            other => *other = Value::String(other.to_string()),
        }
    }
    if !variants.is_empty() {
        if !payloads.keys().all(|k| variants.contains(k)) {
            return Err(invalid_filters(
                "Payload keys must match a variant key for multivariate flags",
            ));
        }
    } else if payloads.len() > 1 || payloads.keys().any(|k| k != "true") {
        return Err(invalid_filters(
            "Payload keys must be 'true' for boolean flags",
        ));
    }
    Ok(())
}

/// Flag filters name flags by id; each must be a live flag of the project, not this
/// one, and following them must not lead back here.
fn dependencies(
    properties: &[&Value],
    key: &str,
    own_id: Option<i64>,
    file: &FlagFile,
) -> Result<(), Error> {
    let live: HashMap<i64, &Value> = file
        .flags()
        .iter()
        .filter(|f| !is_deleted(f))
        .filter_map(|f| Some((flag_id(f)?, f)))
        .collect();
    let key_of = |id: i64| {
        live.get(&id)
            .and_then(|f| f.get("key"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let mut direct = Vec::new();
    for p in properties
        .iter()
        .filter(|p| p.get("type").and_then(Value::as_str) == Some("flag"))
    {
        let reference = p.get("key").cloned().unwrap_or(Value::Null);
        let id = reference_id(&reference).ok_or_else(|| {
            let shown = reference.as_str().map_or_else(|| reference.to_string(), str::to_owned);
            invalid_filters(format!(
                "Flag dependencies must reference flag IDs (integers), not flag keys. Invalid reference: '{shown}'"
            ))
        })?;
        if Some(id) != own_id && !live.contains_key(&id) {
            return Err(invalid_filters(format!(
                "Flag dependency references non-existent flag with ID {id}"
            )));
        }
        direct.push(id);
    }
    if direct.iter().any(|&id| Some(id) == own_id) {
        return Err(invalid_filters(format!(
            "Feature flag '{key}' cannot depend on itself"
        )));
    }
    let deps_of = |id: i64| -> Vec<i64> {
        let Some(f) = live.get(&id) else {
            return Vec::new();
        };
        flag_references(f)
    };
    let mut done = HashSet::new();
    for id in direct {
        let mut path = vec![(own_id, key.to_owned())];
        walk(id, &mut path, &mut done, &key_of, &deps_of)?;
    }
    Ok(())
}

/// Depth-first along dependencies with the path so far, reporting the first cycle as
/// PostHog does (`a → b → a`). `done` holds flags already walked without finding one.
fn walk(
    id: i64,
    path: &mut Vec<(Option<i64>, String)>,
    done: &mut HashSet<i64>,
    key_of: &dyn Fn(i64) -> String,
    deps_of: &dyn Fn(i64) -> Vec<i64>,
) -> Result<(), Error> {
    if let Some(at) = path.iter().position(|(p, _)| *p == Some(id)) {
        let mut names: Vec<String> = path[at..].iter().map(|(_, n)| n.clone()).collect();
        names.push(path[at].1.clone());
        return Err(invalid_filters(format!(
            "Circular dependency detected: {}",
            names.join(" → ")
        )));
    }
    if !done.insert(id) {
        return Ok(());
    }
    path.push((Some(id), key_of(id)));
    for next in deps_of(id) {
        walk(next, path, done, key_of, deps_of)?;
    }
    path.pop();
    Ok(())
}

/// The flag ids a stored flag's filters depend on.
pub fn flag_references(flag: &Value) -> Vec<i64> {
    let groups = flag.pointer("/filters/groups").and_then(Value::as_array);
    groups
        .into_iter()
        .flatten()
        .filter_map(|g| g.get("properties").and_then(Value::as_array))
        .flatten()
        .filter(|p| p.get("type").and_then(Value::as_str) == Some("flag"))
        .filter_map(|p| reference_id(p.get("key")?))
        .collect()
}

fn reference_id(reference: &Value) -> Option<i64> {
    match reference {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// The project with the change must compile, and no flag may be disabled by it that
/// was not before. `changed` is the flag written, checked as if active so a switched-off
/// flag cannot be stored with rules serving would refuse once it is switched on.
pub fn compiles(before: &FlagFile, after: &FlagFile, changed: Option<i64>) -> Result<(), Error> {
    let mut probe = after.doc.clone();
    if let (Some(id), Some(Value::Array(flags))) = (changed, probe.get_mut("flags")) {
        for f in flags
            .iter_mut()
            .filter(|f| flag_id(f) == Some(id) && !is_deleted(f))
        {
            if let Some(obj) = f.as_object_mut() {
                obj.insert("active".into(), Value::Bool(true));
            }
        }
    }
    let rules = ProjectRules::from_value(Value::Object(probe)).map_err(|e| {
        let attr = if e.field().starts_with("filters") {
            "filters"
        } else if e.field() == "key" {
            "key"
        } else {
            "filters"
        };
        Error::invalid("invalid_input", e.to_string()).at(attr)
    })?;
    let key = changed.and_then(|id| {
        let flag = after.flags().iter().find(|f| flag_id(f) == Some(id))?;
        flag.get("key").and_then(Value::as_str)
    });
    // What serving would refuse the file for: about the flag changed, in PostHog's
    // words for a place in its filters; elsewhere (a flag that moved a dependency, say),
    // naming that flag. What the file already held is the hand edit's to fix.
    let held: BTreeSet<String> = crate::flags::lint(&Value::Object(before.doc.clone()))
        .iter()
        .map(ToString::to_string)
        .collect();
    let found = crate::flags::lint(rules.definitions_json());
    if let Some(e) = found.iter().find(|e| key.is_some() && e.flag() == key) {
        let field = e.field().strip_prefix("filters.").unwrap_or(e.field());
        return Err(invalid_filters(format!("{field}: {}", e.kind())));
    }
    if let Some(e) = found.iter().find(|e| !held.contains(&e.to_string())) {
        return Err(invalid_filters(e.to_string()));
    }
    let old: BTreeSet<String> = ProjectRules::from_value(Value::Object(before.doc.clone()))
        .map(|r| r.warnings().iter().map(ToString::to_string).collect())
        .unwrap_or_default();
    match rules
        .warnings()
        .iter()
        .find(|w| !old.contains(&w.to_string()))
    {
        Some(w) => Err(invalid_filters(format!("{w}"))),
        None => Ok(()),
    }
}
