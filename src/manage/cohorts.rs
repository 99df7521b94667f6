//! Cohorts through PostHog's cohorts API (`GET/POST/PATCH /api/projects/{id}/cohorts/`),
//! for the property cohorts flags target. A cohort's definition is the file's
//! `cohorts["<id>"]`, the property group flags evaluate; what only the API shows (name,
//! description, who created it, deletion) sits beside it in the file's
//! `cohort_details["<id>"]`. A deleted cohort leaves `cohorts`, so no flag can use it,
//! and its definition is kept in its details.

use serde_json::{json, Map, Value};

use super::error::{filters as invalid_filters, Error};
use super::file::{object_mut, FlagFile};
use super::{shape, Kind, Page, Store};

const DETAILS: &str = "cohort_details";

/// Every cohort of the file, defined or deleted, with what the store fingerprints.
pub(super) fn all(f: &FlagFile) -> Vec<(i64, Value)> {
    let mut ids: Vec<i64> = f
        .cohorts()
        .into_iter()
        .flat_map(|c| c.keys())
        .chain(details(f).into_iter().flat_map(|d| d.keys()))
        .filter_map(|k| k.trim().parse().ok())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids.into_iter().map(|id| (id, stored(f, id))).collect()
}

fn details(f: &FlagFile) -> Option<&Map<String, Value>> {
    f.doc.get(DETAILS).and_then(Value::as_object)
}

fn stored(f: &FlagFile, id: i64) -> Value {
    let key = id.to_string();
    json!({
        "definition": f.cohorts().and_then(|c| c.get(&key)),
        "details": details(f).and_then(|d| d.get(&key)),
    })
}

/// The name PostHog shows as a cohort filter's `cohort_name`.
pub(super) fn name_of(f: &FlagFile, value: &Value) -> Value {
    let key = match value {
        Value::String(s) => s.trim().to_owned(),
        other => other.to_string(),
    };
    details(f)
        .and_then(|d| d.get(&key))
        .and_then(|d| d.get("name"))
        .cloned()
        .unwrap_or(Value::Null)
}

fn to_api(f: &FlagFile, id: i64) -> Value {
    let key = id.to_string();
    let empty = Map::new();
    let d = details(f)
        .and_then(|d| d.get(&key))
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let get = |k: &str| d.get(k).cloned().unwrap_or(Value::Null);
    let deleted = d.get("deleted").and_then(Value::as_bool).unwrap_or(false);
    let definition = f
        .cohorts()
        .and_then(|c| c.get(&key))
        .cloned()
        .or_else(|| d.get("definition").cloned())
        .unwrap_or_else(|| json!({"type": "AND", "values": []}));
    json!({
        "id": id,
        "name": get("name"),
        "description": d.get("description").cloned().unwrap_or(json!("")),
        "groups": [],
        "deleted": deleted,
        "filters": {"properties": definition},
        "query": null,
        "is_calculating": false,
        "created_by": shape::user(&get("created_by")),
        "created_at": get("created_at"),
        "last_calculation": null,
        "errors_calculating": 0,
        "count": null,
        "is_static": false,
        "experiment_set": [],
    })
}

/// `filters.properties` of a body: a property group of person and cohort filters, the
/// kinds a flag can evaluate.
fn definition(body: &Map<String, Value>) -> Result<Option<Value>, Error> {
    let Some(filters) = body.get("filters") else {
        return Ok(None);
    };
    let props = filters
        .get("properties")
        .filter(|p| p.is_object())
        .ok_or_else(|| invalid_filters("filters.properties must be a property group"))?;
    fn leaves(v: &Value, out: &mut Vec<String>) {
        match v.get("values").and_then(Value::as_array) {
            Some(children) => children.iter().for_each(|c| leaves(c, out)),
            None => out.push(
                v.get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
            ),
        }
    }
    let mut kinds = Vec::new();
    leaves(props, &mut kinds);
    if let Some(k) = kinds.iter().find(|k| *k != "person" && *k != "cohort") {
        return Err(invalid_filters(format!(
            "flagpost keeps cohorts for feature flags, which evaluate person and cohort filters only; a \"{k}\" filter cannot be used"
        )));
    }
    Ok(Some(props.clone()))
}

impl Store {
    pub fn list_cohorts(&self, project: u64, limit: usize, offset: usize) -> Result<Page, Error> {
        self.with(project, |seen, f| {
            let mut live: Vec<(i64, Value)> = all(&f)
                .into_iter()
                .filter(|(id, _)| !to_api(&f, *id)["deleted"].as_bool().unwrap_or(false))
                .collect();
            live.reverse();
            let count = live.len();
            let mut results = Vec::new();
            for (id, v) in live.into_iter().skip(offset).take(limit) {
                seen.note(Kind::Cohort, id, &v);
                results.push(to_api(&f, id));
            }
            Ok(Page { count, results })
        })
    }

    pub fn get_cohort(&self, project: u64, id: i64) -> Result<Value, Error> {
        self.with(project, |seen, f| {
            let (_, v) = all(&f)
                .into_iter()
                .find(|(i, _)| *i == id)
                .ok_or(Error::NotFound)?;
            seen.note(Kind::Cohort, id, &v);
            Ok(to_api(&f, id))
        })
    }

    pub fn create_cohort(
        &self,
        project: u64,
        body: &Value,
        who: &str,
        now: &str,
    ) -> Result<Value, Error> {
        let body = super::object(body)?;
        if body.get("is_static") == Some(&Value::Bool(true)) {
            return Err(Error::invalid(
                "invalid_input",
                "flagpost keeps no static cohorts; define the cohort by properties",
            )
            .at("is_static"));
        }
        let def = definition(body)?.ok_or_else(|| invalid_filters("This field is required."))?;
        self.with(project, |seen, mut f| {
            let before = f.clone();
            let id = all(&f).iter().map(|(i, _)| *i).max().unwrap_or(0) + 1;
            let key = id.to_string();
            f.cohorts_mut().insert(key.clone(), def);
            let mut d = Map::new();
            d.insert(
                "name".into(),
                body.get("name").cloned().unwrap_or(Value::Null),
            );
            let description = body.get("description").cloned().unwrap_or(json!(""));
            d.insert("description".into(), description);
            d.insert("created_at".into(), json!(now));
            d.insert("created_by".into(), json!(who));
            object_mut(&mut f.doc, DETAILS).insert(key, Value::Object(d));
            self.commit(project, &before, &f, None)?;
            let after = stored(&f, id);
            seen.note(Kind::Cohort, id, &after);
            let changes = vec![json!({"type": "Cohort", "action": "created", "field": null,
                "before": null, "after": after})];
            let name = body.get("name").and_then(Value::as_str);
            self.record(project, "Cohort", "created", id, name, who, changes, now);
            Ok(to_api(&f, id))
        })
    }

    pub fn update_cohort(
        &self,
        project: u64,
        id: i64,
        body: &Value,
        who: &str,
        now: &str,
    ) -> Result<Value, Error> {
        let body = super::object(body)?;
        let def = definition(body)?;
        self.with(project, |seen, mut f| {
            let before = f.clone();
            let current = all(&f)
                .into_iter()
                .find(|(i, _)| *i == id)
                .ok_or(Error::NotFound)?
                .1;
            seen.check(Kind::Cohort, id, &current)?;
            let key = id.to_string();
            let was_deleted = to_api(&f, id)["deleted"].as_bool().unwrap_or(false);
            let deleted = match body.get("deleted") {
                None => was_deleted,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(
                        Error::invalid("invalid_input", "Must be a valid boolean.").at("deleted")
                    )
                }
            };
            let kept = f.cohorts().and_then(|c| c.get(&key)).cloned();
            let mut d = details(&f)
                .and_then(|d| d.get(&key))
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let def = def.or(kept).or_else(|| d.get("definition").cloned());
            for field in ["name", "description"] {
                if let Some(v) = body.get(field) {
                    d.insert(field.into(), v.clone());
                }
            }
            d.insert("deleted".into(), json!(deleted));
            if deleted {
                f.cohorts_mut().remove(&key);
                d.insert("definition".into(), def.unwrap_or(Value::Null));
            } else {
                d.remove("definition");
                f.cohorts_mut()
                    .insert(key.clone(), def.unwrap_or(Value::Null));
            }
            object_mut(&mut f.doc, DETAILS).insert(key, Value::Object(d));
            self.commit(project, &before, &f, None)?;
            let after = stored(&f, id);
            seen.note(Kind::Cohort, id, &after);
            let changes = shape::changes("Cohort", &current, &after);
            let name = to_api(&f, id)["name"].as_str().map(str::to_owned);
            self.record(
                project,
                "Cohort",
                "updated",
                id,
                name.as_deref(),
                who,
                changes,
                now,
            );
            Ok(to_api(&f, id))
        })
    }
}
