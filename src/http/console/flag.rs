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
use super::find::persons_of;
use super::insights::{blocking, describe};
use super::range::{Range, DAY_MS, HOUR_MS};
use crate::app::App;
use crate::flags::Context;
use crate::store::query::{self, EventFilter};
use crate::store::rollup::{self, hour_of, Status};

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
/// "reached", "values": {value: persons}, "examples": [person]}`.
pub async fn reach(
    app: &Arc<App>,
    project: u64,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let params = Params::parse(query);
    let key = flag_key(&params)?;
    let rules = i64::try_from(project)
        .ok()
        .and_then(|id| app.rules.current().project(id).cloned())
        .ok_or(ApiError::Missing("flag"))?;
    let open = app.store.get().ok_or(ApiError::Storage)?;
    let now = crate::flags::now();
    let answer = blocking(move || {
        let (groups, group_properties) = (Map::new(), Default::default());
        let mut values: BTreeMap<String, u64> = BTreeMap::new();
        let mut examples = Vec::new();
        let (mut scanned, mut reached, mut complete) = (0u64, 0u64, true);
        for (n, person) in persons_of(&open.trees, project).enumerate() {
            if n >= MAX_REACH_SCANNED {
                complete = false;
                break;
            }
            let Some(person) = person? else { continue };
            let Some(id) = person.distinct_ids.last() else {
                continue;
            };
            scanned += 1;
            let hash_key = Some(person.first_distinct_id.as_str()).filter(|f| *f != id);
            let ctx = Context {
                distinct_id: id,
                anon_distinct_id: None,
                hash_key_override: hash_key,
                person_properties: Some(&person.properties),
                groups: &groups,
                group_properties: &group_properties,
                now,
            };
            let eval = rules.evaluate(&ctx);
            let Some(f) = eval.flags.iter().find(|f| f.key == key && f.enabled) else {
                continue;
            };
            reached += 1;
            let value = f.variant.clone().unwrap_or_else(|| "true".into());
            *values.entry(value).or_default() += 1;
            if examples.len() < REACH_EXAMPLES {
                examples.push(person_json(&person));
            }
        }
        Ok(
            json!({"scanned": scanned, "complete": complete, "reached": reached,
                  "values": values, "examples": examples}),
        )
    })
    .await?;
    Ok(response::json(StatusCode::OK, &answer))
}
