//! The console's insights: event counts over time in hour or day buckets (total and
//! unique persons, several events at once), the top events of a range, flag
//! exposures by variant, and survey responses. Each is read from the rollups the
//! compactor keeps (`store::rollup`: whole hours, unique persons estimated past 128 a
//! bucket), or counted from the stored events of the range while a backfill is still
//! building them; every answer says which (`rollups`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::super::error::ApiError;
use super::super::response::{self, Body};
use crate::app::App;
use crate::http::params::Params;
use crate::store::event::StoredEvent;
use crate::store::query::{self, EventFilter};
use crate::store::rollup::{self, hour_of, Status};
use crate::store::Trees;

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;
/// Events charted at once at most: a legend past this is unreadable anyway.
const MAX_SERIES: usize = 10;
/// Events the top list names.
const TOP: usize = 20;

/// `?event=a&event=b&interval=hour|day&hours=N`: per bucket, each event's count and
/// its unique persons (an event without a person counts its distinct id). Buckets are
/// whole hours or UTC days, each counted whole (the current one too).
pub async fn counts(
    app: &Arc<App>,
    project: u64,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let params = Params::parse(query);
    let hours = params.hours()?;
    let step = match params.get("interval").unwrap_or("day") {
        "hour" => HOUR_MS,
        "day" => DAY_MS,
        _ => return Err(ApiError::BadQuery("interval must be hour or day".into())),
    };
    let mut events = params.all("event");
    events.dedup();
    if events.is_empty() || events.len() > MAX_SERIES {
        return Err(ApiError::BadQuery(format!(
            "name 1 to {MAX_SERIES} events with event="
        )));
    }
    let now = crate::support::clock::now_ms();
    let first = (now - hours * HOUR_MS).div_euclid(step) * step;
    let buckets: Vec<i64> = (0..)
        .map(|i| first + i * step)
        .take_while(|t| *t <= now)
        .collect();
    // Held for the request: a reopen of the database waits for it.
    let open = app.store.get().ok_or(ApiError::Storage)?;
    let n = buckets.len();
    let names = events.clone();
    let (series, status) = blocking(move || {
        let trees = &open.trees;
        let status = rollup::status(&trees.meta)?;
        let series = match status {
            Status::Ready => {
                let mut out = HashMap::new();
                for name in names {
                    let series = rollup::series(&trees.rollups, project, &name, (first, step, n))?;
                    out.insert(name, series);
                }
                out
            }
            Status::Building(_) => scan_counts(trees, project, &names, first, step, n, now)?,
        };
        Ok((series, status))
    })
    .await?;
    let series: Vec<Value> = events
        .iter()
        .map(|e| {
            let zero = (vec![0u64; n], vec![0u64; n]);
            let (total, unique) = series.get(e).unwrap_or(&zero);
            json!({"event": e, "total": total, "unique": unique})
        })
        .collect();
    let times: Vec<String> = buckets
        .iter()
        .map(|t| crate::support::clock::format_ms(*t))
        .collect();
    Ok(response::json(
        StatusCode::OK,
        &json!({"interval_seconds": step / 1000, "buckets": times, "series": series,
                "rollups": describe(status)}),
    ))
}

/// Each event's totals and unique persons per bucket.
type Series = HashMap<String, (Vec<u64>, Vec<u64>)>;

/// [`counts`] from the stored events themselves, while the rollups are being built.
fn scan_counts(
    trees: &Trees,
    project: u64,
    names: &[String],
    first: i64,
    step: i64,
    n: usize,
    now: i64,
) -> Result<Series, sled::Error> {
    let wanted: HashSet<&String> = names.iter().collect();
    let mut totals: HashMap<String, Vec<u64>> = HashMap::new();
    let mut seen: HashMap<String, Vec<HashSet<String>>> = HashMap::new();
    scan(trees, project, first, now, |e| {
        if !wanted.contains(&e.event) {
            return;
        }
        let Ok(i) = usize::try_from((e.timestamp - first) / step) else {
            return;
        };
        if i >= n {
            return;
        }
        totals.entry(e.event.clone()).or_insert_with(|| vec![0; n])[i] += 1;
        let who = e
            .person_id
            .map_or_else(|| e.distinct_id.clone(), |p| p.to_string());
        seen.entry(e.event.clone())
            .or_insert_with(|| vec![HashSet::new(); n])[i]
            .insert(who);
    })?;
    Ok(totals
        .into_iter()
        .map(|(k, t)| {
            let u = seen
                .get(&k)
                .map(|v| v.iter().map(|s| s.len() as u64).collect())
                .unwrap_or_default();
            (k, (t, u))
        })
        .collect())
}

/// The rollups' state as the page shows it.
pub fn describe(status: Status) -> Value {
    match status {
        Status::Ready => json!({"ready": true}),
        Status::Building(percent) => json!({"ready": false, "percent": percent}),
    }
}

/// The whole hours covering `hours` back from `now`, through the current one.
fn hour_range(hours: i64, now: i64) -> (i64, i64) {
    (hour_of(now - hours * HOUR_MS), hour_of(now) + HOUR_MS)
}

/// `?hours=N`: the most frequent events of the range, most first.
pub async fn top(
    app: &Arc<App>,
    project: u64,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let hours = Params::parse(query).hours()?;
    let (counts, status) = over_hours(
        app,
        hours,
        move |rollups, from, to| rollup::top(rollups, project, from, to),
        move |trees, after, before| {
            let mut counts: HashMap<String, u64> = HashMap::new();
            scan(trees, project, after, before, |e| {
                *counts.entry(e.event.clone()).or_default() += 1;
            })?;
            Ok(counts)
        },
    )
    .await?;
    let mut list: Vec<(String, u64)> = counts.into_iter().collect();
    list.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    list.truncate(TOP);
    let events: Vec<Value> = list
        .into_iter()
        .map(|(event, count)| json!({"event": event, "count": count}))
        .collect();
    Ok(response::json(
        StatusCode::OK,
        &json!({"hours": hours, "events": events, "rollups": describe(status)}),
    ))
}

/// Flags called in the last `hours` (default 24, whole hours through the current one),
/// by flag and by the value each call returned: `{"hours", "flags": {key: {value:
/// count}}, "rollups"}`.
pub async fn exposures_page(
    app: &Arc<App>,
    project: u64,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let hours = Params::parse(query).hours()?;
    let (flags, status) = exposures(app, project, hours).await?;
    Ok(response::json(
        StatusCode::OK,
        &json!({"hours": hours, "flags": flags, "rollups": describe(status)}),
    ))
}

/// Flag exposures in the last `hours`, by flag and returned value.
pub async fn exposures(
    app: &Arc<App>,
    project: u64,
    hours: i64,
) -> Result<(BTreeMap<String, BTreeMap<String, u64>>, Status), ApiError> {
    over_hours(
        app,
        hours,
        move |rollups, from, to| rollup::exposures(rollups, project, from, to),
        move |trees, after, before| scan_exposures(trees, project, after, before),
    )
    .await
}

/// `?hours=N`: `survey sent` events by survey, with each answer's count.
pub async fn surveys(
    app: &Arc<App>,
    project: u64,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let hours = Params::parse(query).hours()?;
    let (by_survey, status) = over_hours(
        app,
        hours,
        move |rollups, from, to| rollup::surveys(rollups, project, from, to),
        move |trees, after, before| scan_surveys(trees, project, after, before),
    )
    .await?;
    let surveys: Vec<Value> = by_survey
        .into_iter()
        .map(|(id, (name, n, answers))| {
            json!({"id": id, "name": name, "responses": n, "answers": answers})
        })
        .collect();
    Ok(response::json(
        StatusCode::OK,
        &json!({"hours": hours, "surveys": surveys, "rollups": describe(status)}),
    ))
}

/// Survey answers by survey: its name, its responses and each answer's count.
type BySurvey = BTreeMap<String, (String, u64, BTreeMap<String, u64>)>;

/// [`surveys`] from the stored `survey sent` events, while the rollups are being built.
fn scan_surveys(
    trees: &Trees,
    project: u64,
    after: i64,
    before: i64,
) -> Result<BySurvey, sled::Error> {
    let mut by_survey = BySurvey::new();
    let filter = EventFilter {
        after: Some(after),
        before: Some(before),
        event: Some("survey sent".into()),
        distinct_id: None,
    };
    for entry in query::events(trees, project, filter, None) {
        let (_, e) = entry?;
        let p = &e.properties;
        let Some(id) = p.get("$survey_id").and_then(Value::as_str) else {
            continue;
        };
        let name = p.get("$survey_name").and_then(Value::as_str).unwrap_or(id);
        let slot = by_survey
            .entry(id.to_owned())
            .or_insert_with(|| (name.to_owned(), 0, BTreeMap::new()));
        slot.1 += 1;
        for answer in rollup::answers(p.get("$survey_response")) {
            *slot.2.entry(answer).or_default() += 1;
        }
    }
    Ok(by_survey)
}

/// A read over the last `hours`: from the rollups (whole hours through the current
/// one) once they are built, else by scanning the stored events of the range; with the
/// rollups' state, which the answer reports.
async fn over_hours<T: Send + 'static>(
    app: &Arc<App>,
    hours: i64,
    from_rollups: impl FnOnce(&rollup::Rollups, i64, i64) -> Result<T, sled::Error> + Send + 'static,
    by_scan: impl FnOnce(&Trees, i64, i64) -> Result<T, sled::Error> + Send + 'static,
) -> Result<(T, Status), ApiError> {
    let now = crate::support::clock::now_ms();
    // Held for the request: a reopen of the database waits for it.
    let open = app.store.get().ok_or(ApiError::Storage)?;
    blocking(move || {
        let status = rollup::status(&open.trees.meta)?;
        let value = match status {
            Status::Ready => {
                let (from, to) = hour_range(hours, now);
                from_rollups(&open.trees.rollups, from, to)?
            }
            Status::Building(_) => by_scan(&open.trees, now - hours * HOUR_MS, now)?,
        };
        Ok((value, status))
    })
    .await
}

/// Exposures counted from the stored `$feature_flag_called` events themselves, while
/// the rollups are being built.
fn scan_exposures(
    trees: &crate::store::Trees,
    project: u64,
    after: i64,
    before: i64,
) -> Result<BTreeMap<String, BTreeMap<String, u64>>, sled::Error> {
    let filter = EventFilter {
        after: Some(after),
        before: Some(before),
        event: Some("$feature_flag_called".into()),
        distinct_id: None,
    };
    let mut by_flag: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for entry in query::events(trees, project, filter, None) {
        let (_, e) = entry?;
        let Some(flag) = e.properties.get("$feature_flag").and_then(Value::as_str) else {
            continue;
        };
        let value =
            crate::store::rollup::exposure_value(e.properties.get("$feature_flag_response"));
        *by_flag
            .entry(flag.to_owned())
            .or_default()
            .entry(value)
            .or_default() += 1;
    }
    Ok(by_flag)
}

/// Every stored event of the project between two times.
fn scan(
    trees: &Trees,
    project: u64,
    after: i64,
    before: i64,
    mut each: impl FnMut(&StoredEvent),
) -> Result<(), sled::Error> {
    let filter = EventFilter {
        after: Some(after),
        before: Some(before),
        event: None,
        distinct_id: None,
    };
    for entry in query::events(trees, project, filter, None) {
        each(&entry?.1);
    }
    Ok(())
}

/// A console read on the blocking pool: a storage error is logged and answered as one.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, sled::Error> + Send + 'static,
) -> Result<T, ApiError> {
    crate::http::error::storage_read("console", f).await
}
