//! The console's insights beside the counts over time (`counts`): the top events of a
//! range, flag exposures by variant, and survey responses. Each is read from the rollups the
//! compactor keeps (`store::rollup`: whole hours, unique persons estimated past 128 a
//! bucket), or counted from the stored events of the range while a backfill is still
//! building them; every answer says which (`rollups`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::super::error::ApiError;
use super::super::response::{self, Body};
use super::range::Range;
use crate::app::App;
use crate::http::params::Params;
use crate::store::event::StoredEvent;
use crate::store::query::{self, EventFilter};
use crate::store::rollup::{self, Status};
use crate::store::Trees;

/// Events the top list names.
const TOP: usize = 20;

/// The rollups' state as the page shows it.
pub fn describe(status: Status) -> Value {
    match status {
        Status::Ready => json!({"ready": true}),
        Status::Building(percent) => json!({"ready": false, "percent": percent}),
    }
}

/// `?hours=N`: the most frequent events of the range, most first.
pub async fn top(
    app: &Arc<App>,
    project: u64,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let range = Range::parse(&Params::parse(query), crate::support::clock::now_ms())?;
    let (counts, status) = over_range(
        app,
        range,
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
        &json!({"events": events, "rollups": describe(status)}),
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
    let range = Range::parse(&Params::parse(query), crate::support::clock::now_ms())?;
    let (flags, status) = exposures(app, project, range).await?;
    Ok(response::json(
        StatusCode::OK,
        &json!({"flags": flags, "rollups": describe(status)}),
    ))
}

/// Flag exposures in a range, by flag and returned value.
pub async fn exposures(
    app: &Arc<App>,
    project: u64,
    range: Range,
) -> Result<(BTreeMap<String, BTreeMap<String, u64>>, Status), ApiError> {
    over_range(
        app,
        range,
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
    let range = Range::parse(&Params::parse(query), crate::support::clock::now_ms())?;
    let (by_survey, status) = over_range(
        app,
        range,
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
        &json!({"surveys": surveys, "rollups": describe(status)}),
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
        person_id: None,
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

/// A read over a range: from the rollups (the whole hours covering it) once they are
/// built, else by scanning the stored events of the range; with the rollups' state,
/// which the answer reports.
async fn over_range<T: Send + 'static>(
    app: &Arc<App>,
    range: Range,
    from_rollups: impl FnOnce(&rollup::Rollups, i64, i64) -> Result<T, sled::Error> + Send + 'static,
    by_scan: impl FnOnce(&Trees, i64, i64) -> Result<T, sled::Error> + Send + 'static,
) -> Result<(T, Status), ApiError> {
    // Held for the request: a reopen of the database waits for it.
    let open = app.store.get().ok_or(ApiError::Storage)?;
    blocking(move || {
        let status = rollup::status(&open.trees.meta)?;
        let value = match status {
            Status::Ready => {
                let (from, to) = range.hours();
                from_rollups(&open.trees.rollups, from, to)?
            }
            Status::Building(_) => by_scan(&open.trees, range.from, range.to)?,
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
        person_id: None,
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
pub(super) fn scan(
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
        person_id: None,
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
