//! A flag as PostHog's API shows it and takes it: the fields `FeatureFlagSerializer`
//! returns, built from a flag of the file with honest values for what flagpost does not
//! keep (no experiments, surveys or dashboards link to a flag here), and the writable
//! fields of a create or update body applied to the flag as the file stores it.

use serde_json::{json, Map, Value};

use super::error::Error;

/// The fields PostHog returns, in its order; anything else a flag of the file carries
/// follows them unchanged.
const API_FIELDS: &[&str] = &[
    "id",
    "name",
    "key",
    "filters",
    "deleted",
    "active",
    "created_by",
    "created_at",
    "updated_at",
    "version",
    "last_modified_by",
    "is_simple_flag",
    "rollout_percentage",
    "ensure_experience_continuity",
    "experiment_set",
    "surveys",
    "features",
    "rollback_conditions",
    "performed_rollback",
    "can_edit",
    "tags",
    "evaluation_tags",
    "usage_dashboard",
    "analytics_dashboards",
    "has_enriched_analytics",
    "user_access_level",
    "is_remote_configuration",
    "has_encrypted_payloads",
    "status",
    "evaluation_runtime",
];

/// How a caller shows in `created_by` and `last_modified_by`: PostHog's user shape, with
/// the key's label as the name since a key here belongs to no user account.
pub fn user(label: &Value) -> Value {
    match label {
        Value::String(l) => json!({
            "id": null, "uuid": null, "distinct_id": null, "first_name": l,
            "last_name": "", "email": null,
        }),
        other => other.clone(),
    }
}

/// A flag of the file in PostHog's API shape. `cohort_name` looks up cohort names for
/// the `cohort_name` PostHog adds to each cohort filter.
pub fn to_api(flag: &Value, cohort_name: &dyn Fn(&Value) -> Value) -> Value {
    let f = flag.as_object().cloned().unwrap_or_default();
    let mut filters = f.get("filters").cloned().unwrap_or_else(|| json!({}));
    for p in properties_mut(&mut filters) {
        if p.get("type").and_then(Value::as_str) == Some("cohort") {
            let name = cohort_name(p.get("value").unwrap_or(&Value::Null));
            if let Some(obj) = p.as_object_mut() {
                obj.insert("cohort_name".into(), name);
            }
        }
    }
    let groups = filters.get("groups").and_then(Value::as_array);
    let simple = groups.is_some_and(|g| {
        g.len() == 1
            && g[0]
                .get("properties")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty)
    }) && filters
        .get("aggregation_group_type_index")
        .is_none_or(Value::is_null);
    let rollout = match (simple, groups) {
        (true, Some(g)) => g[0]
            .get("rollout_percentage")
            .cloned()
            .unwrap_or(Value::Null),
        _ => Value::Null,
    };
    let deleted = f.get("deleted").and_then(Value::as_bool).unwrap_or(false);
    let get = |k: &str, default: Value| f.get(k).cloned().unwrap_or(default);
    let computed = json!({
        "id": get("id", Value::Null),
        "name": get("name", json!("")),
        "key": get("key", Value::Null),
        "filters": filters,
        "deleted": deleted,
        "active": get("active", json!(true)),
        "created_by": user(&get("created_by", Value::Null)),
        "created_at": get("created_at", Value::Null),
        "updated_at": get("updated_at", Value::Null),
        "version": get("version", json!(0)),
        "last_modified_by": user(&get("last_modified_by", Value::Null)),
        "is_simple_flag": simple,
        "rollout_percentage": rollout,
        "ensure_experience_continuity": get("ensure_experience_continuity", json!(false)),
        "experiment_set": [],
        "surveys": [],
        "features": [],
        "rollback_conditions": get("rollback_conditions", Value::Null),
        "performed_rollback": get("performed_rollback", json!(false)),
        "can_edit": true,
        "tags": get("tags", json!([])),
        "evaluation_tags": get("evaluation_tags", json!([])),
        "usage_dashboard": null,
        "analytics_dashboards": [],
        "has_enriched_analytics": false,
        "user_access_level": "editor",
        "is_remote_configuration": get("is_remote_configuration", json!(false)),
        "has_encrypted_payloads": false,
        "status": if deleted { "DELETED" } else { "ACTIVE" },
        "evaluation_runtime": get("evaluation_runtime", json!("all")),
    });
    let mut out = Map::new();
    if let Value::Object(mut c) = computed {
        for k in API_FIELDS {
            if let Some(v) = c.remove(*k) {
                out.insert((*k).to_owned(), v);
            }
        }
    }
    for (k, v) in f {
        out.entry(k).or_insert(v);
    }
    Value::Object(out)
}

/// Every property filter of `filters.groups`.
fn properties_mut(filters: &mut Value) -> Vec<&mut Value> {
    let Some(groups) = filters.get_mut("groups").and_then(Value::as_array_mut) else {
        return Vec::new();
    };
    groups
        .iter_mut()
        .filter_map(|g| g.get_mut("properties").and_then(Value::as_array_mut))
        .flatten()
        .collect()
}

/// Copies the writable fields of `body` other than `key` and `filters` (checked by
/// `validate`) into the stored flag, checking each one's type as PostHog's
/// serializer does. Read-only and unknown fields of a body are ignored, as DRF does.
pub fn apply_simple_fields(
    flag: &mut Map<String, Value>,
    body: &Map<String, Value>,
) -> Result<(), Error> {
    for field in ["name"] {
        match body.get(field) {
            None => {}
            Some(Value::String(s)) => {
                flag.insert(field.into(), json!(s));
            }
            Some(Value::Null) => return Err(null(field)),
            Some(_) => return Err(Error::invalid("invalid_input", "Not a valid string.").at(field)),
        }
    }
    for field in [
        "active",
        "deleted",
        "ensure_experience_continuity",
        "is_remote_configuration",
        "performed_rollback",
    ] {
        match body.get(field) {
            None => {}
            Some(Value::Bool(b)) => {
                flag.insert(field.into(), json!(b));
            }
            Some(Value::Null) => return Err(null(field)),
            Some(_) => {
                return Err(Error::invalid("invalid_input", "Must be a valid boolean.").at(field))
            }
        }
    }
    if body.get("has_encrypted_payloads") == Some(&Value::Bool(true)) {
        return Err(Error::invalid(
            "invalid_input",
            "flagpost does not encrypt payloads; store them as plain JSON",
        )
        .at("has_encrypted_payloads"));
    }
    if let Some(v) = body.get("evaluation_runtime") {
        match v.as_str() {
            Some("server" | "client" | "all") => {
                flag.insert("evaluation_runtime".into(), v.clone());
            }
            _ => {
                let detail = format!("\"{}\" is not a valid choice.", v.as_str().unwrap_or(""));
                return Err(Error::invalid("invalid_choice", detail).at("evaluation_runtime"));
            }
        }
    }
    if let Some(v) = body.get("rollback_conditions") {
        flag.insert("rollback_conditions".into(), v.clone());
    }
    for field in ["tags", "evaluation_tags"] {
        match body.get(field) {
            None => {}
            Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
                flag.insert(field.into(), Value::Array(items.clone()));
            }
            Some(_) => {
                let detail = "Expected a list of items.";
                return Err(Error::invalid("not_a_list", detail).at(field));
            }
        }
    }
    let tags = strings(flag.get("tags"));
    let invalid: Vec<String> = strings(flag.get("evaluation_tags"))
        .into_iter()
        .filter(|t| !tags.contains(t))
        .collect();
    if !invalid.is_empty() {
        return Err(Error::invalid(
            "invalid_input",
            format!(
                "Evaluation tags must be a subset of tags. Invalid evaluation tags: {}",
                invalid.join(", ")
            ),
        ));
    }
    Ok(())
}

fn null(field: &'static str) -> Error {
    Error::invalid("null", "This field may not be null.").at(field)
}

fn strings(v: Option<&Value>) -> Vec<String> {
    let mut out: Vec<String> = v
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_lowercase)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The fields of `after` that differ from `before`, as PostHog's activity log lists
/// changes; bookkeeping fields are left out.
pub fn changes(scope: &str, before: &Value, after: &Value) -> Vec<Value> {
    const SKIP: &[&str] = &["updated_at", "last_modified_by", "version"];
    let empty = Map::new();
    let b = before.as_object().unwrap_or(&empty);
    let a = after.as_object().unwrap_or(&empty);
    let mut fields: Vec<&String> = b.keys().chain(a.keys()).collect();
    fields.dedup();
    let mut seen = std::collections::HashSet::new();
    fields
        .into_iter()
        .filter(|f| seen.insert(f.as_str()) && !SKIP.contains(&f.as_str()))
        .filter(|f| b.get(f.as_str()) != a.get(f.as_str()))
        .map(|f| {
            let action = match (b.get(f.as_str()), a.get(f.as_str())) {
                (None, _) => "created",
                (_, None) => "deleted",
                _ => "changed",
            };
            json!({"type": scope, "action": action, "field": f,
                   "before": b.get(f.as_str()), "after": a.get(f.as_str())})
        })
        .collect()
}
