//! The reads behind one flag's page: its exposures by variant over time (from the
//! rollups' `$feature_flag_called` counts, or the stored events while they are built)
//! and the people it reaches now (the stored persons evaluated by the rules `/decide`
//! serves). The page's rules in words and its change history come from the management
//! API itself (the flag and its activity log).

use std::collections::BTreeMap;
use std::sync::Arc;

use hyper::{Response, StatusCode};
use serde_json::{json, Map, Value};

use super::super::api::person_json;
use super::super::error::ApiError;
use super::super::params::Params;
use super::super::response::{self, Body};
use super::find::Matcher;
use super::insights::{blocking, describe};
use super::range::{Range, DAY_MS, HOUR_MS};
use super::reach as kept;
use crate::app::App;
use crate::flags::{Context, ProjectRules};
use crate::persons::Person;
use crate::store::person_probe::{self, Needle};
use crate::store::query::{self, EventFilter};
use crate::store::rollup::{self, hour_of, Status};
use crate::store::{keys, Trees};

/// Persons the reach of a flag evaluates at most. Stored persons are in id order,
/// which for the UUIDv5 ids of new persons is hash order, so a bounded pass is close
/// to a random sample and its share estimates the whole; evaluating a person costs a
/// few microseconds, so the bound keeps a page under a second.
const MAX_REACH_SCANNED: usize = 100_000;
/// Persons the reach names, as examples.
const REACH_EXAMPLES: usize = 20;

/// The flag a page is about: `?key=K`, which both reads require.
fn flag_key(params: &Params) -> Result<String, ApiError> {
    params
        .get("key")
        .map(str::to_owned)
        .ok_or_else(|| ApiError::BadQuery("key is required".into()))
}

/// `?key=K&interval=hour|day` and a range: per bucket, the flag's calls by returned
/// value: `{"buckets", "values": {value: [count per bucket]}, "rollups"}`.
pub async fn exposures(
    app: &Arc<App>,
    project: u64,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let params = Params::parse(query);
    let key = flag_key(&params)?;
    let range = Range::parse(&params, crate::support::clock::now_ms())?;
    let step = match params.get("interval").unwrap_or("day") {
        "hour" => HOUR_MS,
        "day" => DAY_MS,
        _ => return Err(ApiError::BadQuery("interval must be hour or day".into())),
    };
    let first = hour_of(range.from);
    let buckets: Vec<i64> = (0..)
        .map(|i| first + i * step)
        .take_while(|t| *t < range.to)
        .collect();
    let n = buckets.len();
    let open = app.store.get().ok_or(ApiError::Storage)?;
    let starts = buckets.clone();
    let (values, status) = blocking(move || {
        let trees = &open.trees;
        let status = rollup::status(&trees.meta)?;
        let mut values: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        match status {
            Status::Ready => {
                for (i, start) in starts.iter().enumerate() {
                    let mut by_flag =
                        rollup::exposures(&trees.rollups, project, *start, start + step)?;
                    for (value, count) in by_flag.remove(&key).unwrap_or_default() {
                        values.entry(value).or_insert_with(|| vec![0; n])[i] += count;
                    }
                }
            }
            Status::Building(_) => {
                let filter = EventFilter {
                    after: Some(first),
                    before: Some(first + step * n as i64),
                    event: Some("$feature_flag_called".into()),
                    distinct_id: None,
                    person_id: None,
                };
                for entry in query::events(trees, project, filter, None) {
                    let (_, e) = entry?;
                    let p = &e.properties;
                    if p.get("$feature_flag").and_then(Value::as_str) != Some(key.as_str()) {
                        continue;
                    }
                    let Some(i) = usize::try_from((e.timestamp - first) / step)
                        .ok()
                        .filter(|i| *i < n)
                    else {
                        continue;
                    };
                    let value = rollup::exposure_value(p.get("$feature_flag_response"));
                    values.entry(value).or_insert_with(|| vec![0; n])[i] += 1;
                }
            }
        }
        Ok((values, status))
    })
    .await?;
    let times: Vec<String> = buckets
        .iter()
        .map(|t| crate::support::clock::format_ms(*t))
        .collect();
    Ok(response::json(
        StatusCode::OK,
        &json!({"interval_seconds": step / 1000, "buckets": times, "values": values,
                "rollups": describe(status)}),
    ))
}

/// `?key=K`: the stored persons the flag is on for now, as `/decide` would answer for
/// each one's latest distinct id with its stored properties: `{"scanned", "complete",
/// "reached", "values": {value: persons}, "examples": [person], "counted_at",
/// "age_seconds", "recounting"}`. A flag that reads no other flag and no cohort is
/// evaluated alone ([`alone`]); when each of its conditions needs a person property, a
/// person whose bytes name none of them is counted without being decoded
/// ([`needed_keys`]). The answer is kept between openings and counted again in the
/// background once persons changed ([`super::reach`]), so it says when it was counted.
pub async fn reach(
    app: &Arc<App>,
    project: u64,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let params = Params::parse(query);
    let key = flag_key(&params)?;
    let snapshot = app.rules.current();
    let all = i64::try_from(project)
        .ok()
        .and_then(|id| snapshot.project(id).cloned())
        .ok_or(ApiError::Missing("flag"))?;
    let open = app.store.get().ok_or(ApiError::Storage)?;
    let slot = kept::Slot {
        dir: app.store.dir().to_path_buf(),
        project,
        key,
    };
    let basis = kept::Basis {
        rules: snapshot.version(),
        applied: open
            .trees
            .meta
            .get(keys::CHECKPOINT_KEY)
            .map_err(|_| ApiError::Storage)?
            .map(|v| v.to_vec()),
    };
    let now_ms = crate::support::clock::now_ms();
    let (answer, counted_ms, recounting) = match kept::look(&slot, &basis, now_ms) {
        kept::Look::Kept {
            answer,
            counted_ms,
            recounting,
            start,
        } => {
            if start {
                recount_later(open, all, slot, basis);
            }
            (answer, counted_ms, recounting)
        }
        kept::Look::Count => {
            let (trees_slot, flag) = (slot.clone(), slot.key.clone());
            let answer =
                blocking(move || reach_of(&open.trees, project, &all, &flag, crate::flags::now()))
                    .await?;
            kept::keep(trees_slot, basis, answer.clone(), now_ms);
            (answer, now_ms, false)
        }
    };
    Ok(response::json(
        StatusCode::OK,
        &labelled(answer, counted_ms, now_ms, recounting),
    ))
}

/// A kept answer with when it was counted, its age and whether a count is under way.
fn labelled(mut answer: Value, counted_ms: i64, now_ms: i64, recounting: bool) -> Value {
    answer["counted_at"] = crate::support::clock::format_ms(counted_ms).into();
    answer["age_seconds"] = (now_ms.saturating_sub(counted_ms).max(0) / 1000).into();
    answer["recounting"] = recounting.into();
    answer
}

/// Count the reach of `slot`'s flag again off the request, and keep it.
fn recount_later(
    open: Arc<crate::store::live::Open>,
    all: Arc<ProjectRules>,
    slot: kept::Slot,
    basis: kept::Basis,
) {
    tokio::spawn(async move {
        let (project, flag) = (slot.project, slot.key.clone());
        let started = crate::support::clock::now_ms();
        let counted =
            blocking(move || reach_of(&open.trees, project, &all, &flag, crate::flags::now()))
                .await;
        match counted {
            Ok(answer) => kept::keep(slot, basis, answer, started),
            Err(_) => kept::abandon(&slot),
        }
    });
}

/// [`reach`]'s answer for flag `key` of `all`, the project's rules, at `now`.
pub fn reach_of(
    trees: &Trees,
    project: u64,
    all: &ProjectRules,
    key: &str,
    now: time::OffsetDateTime,
) -> Result<Value, sled::Error> {
    let own = alone(all, key);
    // What a person evaluated alone needs: only the properties the flag reads.
    let reads: Option<Vec<&str>> = own
        .as_ref()
        .map(|(_, keys)| keys.iter().map(String::as_str).collect());
    let rules = own.as_ref().map_or(all, |(rules, _)| rules);
    let needles: Option<Vec<Needle>> =
        needed_keys(all, key).map(|names| names.iter().map(|k| Needle::new(k)).collect());
    let mut values: BTreeMap<String, u64> = BTreeMap::new();
    let mut examples = Vec::new();
    let (mut scanned, mut reached, mut complete) = (0u64, 0u64, true);
    for (n, entry) in trees
        .persons
        .scan_prefix(keys::project(project))
        .enumerate()
    {
        if n >= MAX_REACH_SCANNED {
            complete = false;
            break;
        }
        let (_, bytes) = entry?;
        if needles
            .as_ref()
            .is_some_and(|n| !n.iter().any(|n| n.may_be_in(&bytes)))
        {
            // Not reached; counted as a decoded person with a distinct id is.
            let has_ids = match person_probe::glance(&bytes) {
                Some(glance) => glance.has_ids,
                None => person_probe::probe(&bytes, &[]).is_some_and(|p| p.distinct_ids > 0),
            };
            scanned += u64::from(has_ids);
            continue;
        }
        let value = match &reads {
            Some(reads) => {
                let Some(p) = person_probe::probe(&bytes, reads) else {
                    continue;
                };
                let Some(id) = p.last_id.as_deref() else {
                    continue;
                };
                scanned += 1;
                value_for(rules, key, (id, &p.first_distinct_id), &p.properties, now)
            }
            None => {
                let Ok(p) = serde_json::from_slice::<Person>(&bytes) else {
                    continue;
                };
                let Some(id) = p.distinct_ids.last() else {
                    continue;
                };
                scanned += 1;
                value_for(rules, key, (id, &p.first_distinct_id), &p.properties, now)
            }
        };
        let Some(value) = value else {
            continue;
        };
        reached += 1;
        *values.entry(value).or_default() += 1;
        if examples.len() < REACH_EXAMPLES {
            if let Ok(person) = serde_json::from_slice::<Person>(&bytes) {
                examples.push(person_json(&person));
            }
        }
    }
    Ok(
        json!({"scanned": scanned, "complete": complete, "reached": reached,
              "values": values, "examples": examples}),
    )
}

/// What flag `key` of `rules` answers a person whose latest distinct id and first
/// one are `ids`: its value when on (the variant, or "true"), None when off.
fn value_for(
    rules: &ProjectRules,
    key: &str,
    (id, first): (&str, &str),
    properties: &Map<String, Value>,
    now: time::OffsetDateTime,
) -> Option<String> {
    let (groups, group_properties) = (Map::new(), Default::default());
    let ctx = Context {
        distinct_id: id,
        anon_distinct_id: None,
        hash_key_override: Some(first).filter(|f| *f != id),
        person_properties: Some(properties),
        groups: &groups,
        group_properties: &group_properties,
        now,
    };
    let eval = rules.evaluate(&ctx);
    let f = eval.flags.iter().find(|f| f.key == key && f.enabled)?;
    Some(f.variant.clone().unwrap_or_else(|| "true".into()))
}

/// The one live flag with `key` in the rules' definitions, if exactly one.
fn definition<'a>(rules: &'a ProjectRules, key: &str) -> Option<&'a Value> {
    let flags = rules.definitions_json().get("flags")?.as_array()?;
    let mut same = flags.iter().filter(|f| {
        f.get("key").and_then(Value::as_str) == Some(key)
            && f.get("deleted").and_then(Value::as_bool) != Some(true)
    });
    let flag = same.next()?;
    same.next().is_none().then_some(flag)
}

/// The person properties `filters` (of flag `key`) reads, if it reads no other flag
/// and no cohort.
fn property_reads(key: &str, filters: &Value) -> Option<Vec<String>> {
    let lists = ["groups", "super_groups", "holdout_groups"];
    let conditions = lists
        .iter()
        .filter_map(|list| filters.get(*list)?.as_array())
        .flatten();
    let leaves = conditions
        .filter_map(|c| c.get("properties")?.as_array())
        .flatten();
    let mut reads = Vec::new();
    for leaf in leaves {
        match leaf.get("type").and_then(Value::as_str) {
            None | Some("person") => reads.push(leaf.get("key")?.as_str()?.to_owned()),
            Some("group") => {}
            Some(_) => return None,
        }
    }
    if filters.get("feature_enrollment").and_then(Value::as_bool) == Some(true) {
        reads.push(format!("$feature_enrollment/{key}"));
    }
    reads.sort_unstable();
    reads.dedup();
    Some(reads)
}

/// The flag `key` compiled on its own, with the file's group types and property
/// matching, and the person properties it reads: its answer for any person is the
/// whole file's when it reads no other flag and no cohort. None otherwise, or if it
/// does not compile alone cleanly.
fn alone(rules: &ProjectRules, key: &str) -> Option<(ProjectRules, Vec<String>)> {
    let flag = definition(rules, key)?;
    let reads = property_reads(key, flag.get("filters")?)?;
    let file = rules.definitions_json();
    let mut own = json!({"flags": [flag]});
    for field in ["group_type_mapping", "property_matching_version"] {
        if let Some(value) = file.get(field) {
            own[field] = value.clone();
        }
    }
    let own = ProjectRules::from_value(own).ok()?;
    own.warnings().is_empty().then_some((own, reads))
}

/// Person properties of which a person must have at least one for flag `key` to be
/// on: one that each condition needs (a person filter that properties without the key
/// never pass, as [`Matcher::needs_key`] finds). None when some condition needs none,
/// or the flag can be on without a condition (a holdout, early access).
fn needed_keys(rules: &ProjectRules, key: &str) -> Option<Vec<String>> {
    let filters = definition(rules, key)?.get("filters")?;
    let unset = |field: &str| match filters.get(field) {
        None | Some(Value::Null) | Some(Value::Bool(false)) => true,
        Some(Value::Array(items)) => items.is_empty(),
        Some(_) => false,
    };
    let settings = [
        "holdout",
        "holdout_groups",
        "super_groups",
        "feature_enrollment",
        "aggregation_group_type_index",
    ];
    if !settings.iter().all(|field| unset(field)) {
        return None;
    }
    let matching = rules.definitions_json().get("property_matching_version");
    let conditions = filters.get("groups")?.as_array()?;
    let mut keys = Vec::with_capacity(conditions.len());
    for condition in conditions {
        if condition
            .get("aggregation_group_type_index")
            .is_some_and(|i| !i.is_null())
        {
            return None;
        }
        let leaves = condition.get("properties")?.as_array()?;
        keys.push(leaves.iter().find_map(|leaf| needed(leaf, matching))?);
    }
    (!keys.is_empty()).then_some(keys)
}

/// The key of a person filter that properties without it never pass.
fn needed(leaf: &Value, matching: Option<&Value>) -> Option<String> {
    if !matches!(
        leaf.get("type").and_then(Value::as_str),
        None | Some("person")
    ) {
        return None;
    }
    let matcher = Matcher::new(leaf.clone(), matching).ok()?;
    matcher.needs_key().then(|| matcher.key().to_owned())
}

#[cfg(test)]
#[path = "tests/flag.rs"]
mod tests;
