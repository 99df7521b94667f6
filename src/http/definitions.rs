//! The flag endpoints for server-side SDKs, read with a personal API key of the
//! project (or, for the feeds, its project secret key): the definitions feed they
//! evaluate locally from (`/api/feature_flag/local_evaluation/`, `/flags/definitions`)
//! and a remote config flag's payload
//! (`/api/projects/@current/feature_flags/<key>/remote_config`).
//!
//! The feed is served as PostHog serves it: flag filters that name another flag get
//! that flag's key and a `dependency_chain`, remote config flags are left out (see
//! [`crate::flags::feed`], which builds each project's body once per published rules),
//! and an ETag lets a poller's `If-None-Match` get a 304 instead of the whole feed again.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::header::{HeaderValue, ETAG};
use hyper::{HeaderMap, Response, StatusCode};
use serde_json::Value;

use super::error::ApiError;
use super::error::DecideError;
use super::response::{self, Body};
use crate::app::App;
use crate::flags::ProjectRules;
use crate::projects::Project;

/// The project a key may read flags of: its own, which `token` (the project key, when
/// sent) must name too. The feeds take a project secret key or a personal key allowed
/// `feature_flag:read`; a payload only the latter.
fn project(
    app: &App,
    headers: &HeaderMap,
    peer: SocketAddr,
    token: Option<&str>,
    feed: bool,
) -> Result<Arc<Project>, ApiError> {
    let owner = if feed {
        super::personal::feed_reader(app, headers, peer)?
    } else {
        let (owner, caller) = super::personal::authenticate(app, headers, peer)?;
        super::personal::require(&caller, super::personal::FEED_SCOPE)?;
        owner
    };
    if let Some(t) = token {
        let projects = app.projects.load();
        let named = projects.by_api_key(t).ok_or(DecideError::InvalidKey)?;
        if named.id != owner.id {
            return Err(ApiError::Forbidden);
        }
    }
    Ok(owner)
}

fn query_pairs(query: Option<&str>) -> (Option<String>, bool) {
    let mut token = None;
    let mut send_cohorts = false;
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match &*k {
            "token" | "api_key" => token = Some(v.into_owned()),
            "send_cohorts" => send_cohorts = v != "false" && v != "0",
            _ => {}
        }
    }
    (token, send_cohorts)
}

fn rules_of(app: &App, project: &Project) -> Option<Arc<ProjectRules>> {
    let snapshot = app.rules.current();
    i64::try_from(project.id)
        .ok()
        .and_then(|id| snapshot.project(id).cloned())
}

/// `/api/feature_flag/local_evaluation/` and `/flags/definitions`.
pub fn feed(
    app: &App,
    headers: &HeaderMap,
    query: Option<&str>,
    peer: SocketAddr,
) -> Result<Response<Body>, ApiError> {
    let (token, send_cohorts) = query_pairs(query);
    let project = project(app, headers, peer, token.as_deref(), true)?;
    if i64::try_from(project.id).is_ok_and(|id| app.rules.current().quota_limited(id)) {
        // As upstream answered the edge, so SDKs clear their flags too.
        return Ok(response::json(
            StatusCode::PAYMENT_REQUIRED,
            &serde_json::json!({
                "type": "quota_limited",
                "code": "payment_required",
                "detail": "You have exceeded your feature flag request quota",
            }),
        ));
    }
    let rules = rules_of(app, &project);
    let built = app.feed.get(project.id, rules, send_cohorts);
    let mut r = if super::assets::none_match(headers, &built.etag) == Some(true) {
        response::empty(StatusCode::NOT_MODIFIED)
    } else {
        response::with_type(StatusCode::OK, "application/json", built.body.clone())
    };
    if let Ok(v) = HeaderValue::from_str(&built.etag) {
        r.headers_mut().insert(ETAG, v);
    }
    Ok(r)
}

/// `/api/projects/<@current | id>/feature_flags/<key or id>/remote_config`: the flag
/// key or id, and the project in the path (`None` for `@current`).
pub fn payload_path(path: &str) -> Option<(Option<u64>, &str)> {
    let rest = path.strip_prefix("/api/projects/")?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (project, rest) = rest.split_once('/')?;
    let flag = rest
        .strip_prefix("feature_flags/")?
        .strip_suffix("/remote_config")?;
    if flag.is_empty() || flag.contains('/') {
        return None;
    }
    let project = match project {
        "@current" => None,
        id => Some(id.parse().ok()?),
    };
    Some((project, flag))
}

/// A remote config flag's payload, as PostHog answers it: the JSON of
/// `payloads["true"]`, or `null` when it has none.
pub fn payload(
    app: &App,
    headers: &HeaderMap,
    path: &str,
    query: Option<&str>,
    peer: SocketAddr,
) -> Result<Response<Body>, ApiError> {
    let (in_path, flag) = payload_path(path).ok_or(ApiError::NotFound)?;
    let (token, _) = query_pairs(query);
    let project = project(app, headers, peer, token.as_deref(), false)?;
    if in_path.is_some_and(|id| id != project.id) {
        return Err(ApiError::Forbidden);
    }
    let rules = rules_of(app, &project).ok_or(ApiError::NoRemoteConfig)?;
    let flags = rules.definitions_json()["flags"].as_array();
    // PostHog reads a number as the flag's id, anything else as its key.
    let by_id = flag.parse::<i64>().ok();
    let found = flags
        .into_iter()
        .flatten()
        .find(|f| match by_id {
            Some(id) => f["id"].as_i64() == Some(id),
            None => f["key"].as_str() == Some(flag),
        })
        .filter(|f| f["deleted"] != Value::Bool(true))
        .ok_or_else(|| {
            tracing::debug!(
                flag,
                "remote config asked for a flag the project does not have"
            );
            ApiError::NoRemoteConfig
        })?;
    if found["is_remote_configuration"] != Value::Bool(true) {
        tracing::debug!(
            flag,
            "remote config asked for a flag without \"is_remote_configuration\": true"
        );
        return Err(ApiError::NoRemoteConfig);
    }
    let value = match &found["filters"]["payloads"]["true"] {
        Value::Null => Value::Null,
        // PostHog answers `payloads.get("true") or None`: an empty payload is null.
        Value::String(s) if s.is_empty() => Value::Null,
        v => v.clone(),
    };
    Ok(response::json(StatusCode::OK, &value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_paths() {
        assert_eq!(
            payload_path("/api/projects/@current/feature_flags/my-flag/remote_config"),
            Some((None, "my-flag"))
        );
        assert_eq!(
            payload_path("/api/projects/7/feature_flags/12/remote_config/"),
            Some((Some(7), "12"))
        );
        assert_eq!(
            payload_path("/api/projects/x/feature_flags/a/remote_config"),
            None
        );
        assert_eq!(
            payload_path("/api/projects/@current/feature_flags//remote_config"),
            None
        );
        assert_eq!(
            payload_path("/api/projects/@current/feature_flags/a/b/remote_config"),
            None
        );
        assert_eq!(payload_path("/api/projects/1/events/"), None);
    }
}
