//! The console's reads that the read API has no endpoint for: the flags a person
//! gets now (the evaluation `/decide` runs), and the
//! server's health (the numbers behind `/metrics` and readiness). Flag exposures are
//! with the other insights (`insights`).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::super::error::ApiError;
use super::super::params::Params;
use super::super::response::{self, Body};
use crate::app::App;

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
/// The numbers are the server's; the files' problems and the sessions are `project`'s
/// own, as a key of one project must learn nothing of another's files.
pub fn health(app: &App, project: u64) -> Value {
    let c = &app.compactor;
    let sink_lag = app
        .config
        .sink
        .as_ref()
        .map(|_| app.metrics.sink.lag_seconds.get());
    let reload_errors = reload_errors(app, project);
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
        "upstream": upstream_forwarding(app),
        "disk": {
            "free_bytes": app.space.free_bytes(),
            "min_free_bytes": app.config.min_free_disk_bytes,
        },
        "flags_version": app.rules.current().version(),
        "upstream": {
            "url": app.upstream.as_ref().map(|u| u.base()),
            "flag_sync": app.flag_sync.to_json(),
        },
        "reload_errors": reload_errors,
        "sessions": app.sessions.count_of(project),
    })
}

/// The problems of the last reloads that are `project`'s: those of its own files
/// (`flags/<id>.json`, `surveys/<id>.json`, `early_access/<id>.json`), or every one
/// (`projects.json`'s, files named for no project or for a project not listed) when it
/// is the server's only project, so nothing in them is another's.
fn reload_errors(app: &App, project: u64) -> Vec<Value> {
    let only = app.projects.load().len() == 1;
    let mine = |of: Option<i64>| only || of.and_then(|id| u64::try_from(id).ok()) == Some(project);
    let mut errors = Vec::new();
    if only {
        if let Some(p) = crate::support::sync::lock(&app.projects_problem).clone() {
            errors.push(json!({"of": "projects", "problem": p}));
        }
    }
    for (file, problems) in [
        ("flags", app.rules.problems_by_project()),
        ("surveys", app.surveys.problems()),
        ("early_access", app.early_access.problems()),
    ] {
        errors.extend(
            problems
                .iter()
                .filter(|(of, _)| mine(*of))
                .map(|(_, line)| json!({"of": file, "problem": line})),
        );
    }
    errors
}

/// Edge mode's forwarding: what is owed upstream, how late, what it refused.
fn upstream_forwarding(app: &App) -> Value {
    let Some(client) = &app.upstream else {
        return json!({"enabled": false});
    };
    let f = crate::support::sync::lock(&app.upstream_figures).clone();
    let paused: Vec<Value> = f
        .paused
        .iter()
        .map(|(project, reason)| json!({"project": project, "reason": reason}))
        .collect();
    json!({
        "enabled": true,
        "url": client.base(),
        "backlog_events": f.backlog_events,
        "backlog_bytes": f.backlog_bytes,
        "lag_seconds": f.lag_seconds,
        "dead_letters": app.metrics.upstream.dead_letters.get(),
        "paused": paused,
        "retrying": f.retrying,
    })
}
