//! The console's reads that the read API has no endpoint for: persons found by a
//! property, the flags a person gets now (the evaluation `/decide` runs), and the
//! server's health (the numbers behind `/metrics` and readiness). Flag exposures are
//! with the other insights (`insights`).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use hyper::{HeaderMap, Response, StatusCode};
use serde_json::{json, Value};

use super::super::api::{self, Resource};
use super::super::error::ApiError;
use super::super::params::Params;
use super::super::response::{self, Body};
use crate::app::App;

/// Persons examined at most when looking one up by a property: the lookup scans, so
/// it is bounded, and the answer says when it stopped early.
const MAX_PERSONS_SCANNED: usize = 200_000;
/// Persons a property lookup returns at most.
const MAX_PERSONS_FOUND: usize = 100;

/// `?distinct_id=` as the read API answers it; `?property=&value=` finds persons whose
/// property equals the value (as text, so `42` finds the number and the string).
pub async fn persons(
    app: &Arc<App>,
    project: u64,
    headers: &HeaderMap,
    path: &str,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let params = Params::parse(query);
    let Some(property) = params.get("property").map(str::to_owned) else {
        return api::serve(app, project, Resource::Persons, headers, path, query).await;
    };
    let value = params.get("value").unwrap_or("").to_owned();
    // Held for the request: a reopen of the database waits for it.
    let open = app.store.get().ok_or(ApiError::Storage)?;
    let (found, complete) = super::insights::blocking(move || {
        let mut found = Vec::new();
        let mut scanned = 0;
        for entry in open
            .trees
            .persons
            .scan_prefix(crate::store::keys::project(project))
        {
            let (_, bytes) = entry?;
            scanned += 1;
            if scanned > MAX_PERSONS_SCANNED {
                return Ok::<_, sled::Error>((found, false));
            }
            let Ok(person) = serde_json::from_slice::<crate::persons::Person>(&bytes) else {
                continue;
            };
            let matches = person.properties.get(&property).is_some_and(|v| match v {
                Value::String(s) => *s == value,
                other => serde_json::to_string(other).is_ok_and(|t| t == value),
            });
            if matches {
                found.push(api::person_json(&person));
                if found.len() >= MAX_PERSONS_FOUND {
                    break;
                }
            }
        }
        Ok((found, true))
    })
    .await?;
    Ok(response::json(
        StatusCode::OK,
        &json!({"results": found, "next": null, "complete": complete}),
    ))
}

/// `?distinct_id=`: what `/flags?v=2` answers for that id right now.
pub fn person_flags(
    app: &Arc<App>,
    project: u64,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let params = Params::parse(query);
    let id = params
        .get("distinct_id")
        .ok_or_else(|| ApiError::BadQuery("distinct_id is required".into()))?;
    let project = app
        .projects
        .load()
        .by_id(project)
        .cloned()
        .ok_or(ApiError::Missing("project"))?;
    let body = super::super::decide::for_person(app, &project, id);
    Ok(response::with_type(
        StatusCode::OK,
        "application/json",
        body,
    ))
}

/// What an operator checks: is the server keeping up, is there disk, did a file fail.
pub fn health(app: &App) -> Value {
    let c = &app.compactor;
    let sink_lag = app
        .config
        .sink
        .as_ref()
        .map(|_| app.metrics.sink.lag_seconds.get());
    let problems = |file: &str, lines: &[String]| -> Vec<Value> {
        lines
            .iter()
            .map(|l| json!({"of": file, "problem": l}))
            .collect()
    };
    let mut reload_errors = Vec::new();
    if let Some(p) = crate::support::sync::lock(&app.projects_problem).clone() {
        reload_errors.push(json!({"of": "projects", "problem": p}));
    }
    reload_errors.extend(problems("flags", &app.rules.problems()));
    reload_errors.extend(problems("surveys", &app.surveys.problems()));
    reload_errors.extend(problems("early_access", &app.early_access.problems()));
    app.backlog.check(app.log.bytes());
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_seconds": app.started.elapsed().as_secs(),
        "ready": app.is_ready(),
        "accepts_writes": app.accepts_writes(),
        "log_depth": app
            .store
            .get()
            .map_or(0, |open| crate::compactor::log_depth(&open.trees, &app.log)),
        "log_segments": app.log.segments(),
        "log": {
            "bytes": app.backlog.bytes(),
            "max_bytes": app.backlog.max(),
            "backpressure": !app.backlog.is_ok(),
        },
        "compactor": {
            "healthy": c.healthy.load(Relaxed),
            "lag_seconds": c.lag_ms.load(Relaxed) as f64 / 1000.0,
            "applied": c.applied.load(Relaxed),
        },
        "sink": {"enabled": sink_lag.is_some(), "lag_seconds": sink_lag},
        "disk": {
            "free_bytes": app.space.free_bytes(),
            "min_free_bytes": app.config.min_free_disk_bytes,
        },
        "flags_version": app.rules.current().version(),
        "reload_errors": reload_errors,
        "sessions": app.sessions.len(),
    })
}

/// The console's parameters.
impl Params {
    /// `hours`: 1 to 90 days' worth, 24 unless given.
    pub fn hours(&self) -> Result<i64, ApiError> {
        match self.get("hours") {
            None => Ok(24),
            Some(v) => v
                .parse::<i64>()
                .ok()
                .filter(|h| (1..=90 * 24).contains(h))
                .ok_or_else(|| ApiError::BadQuery("hours must be 1 to 2160".into())),
        }
    }
}
