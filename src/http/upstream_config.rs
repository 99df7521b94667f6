//! Edge mode's answers to posthog-js's start-up requests: `/array/<key>/config`,
//! `config.js` and `array.js`, `/api/surveys/?token=` and
//! `/api/early_access_features/?token=`, from upstream's answers as the cache keeps
//! them ([`crate::edge::cache`]), so what the browser turns on (session recording,
//! surveys, heatmaps, ...) is what upstream says. Only the edge's own projects are
//! asked for, so the edge is no open cache of upstream. With no copy and upstream
//! unreachable, the edge answers from its own files as it does outside edge mode.
//!
//! Upstream paths: PostHog's reverse-proxy guides send everything but `/static/` to
//! its main host (`us.i.posthog.com`), so `/array/` is asked of the `--upstream` host,
//! as posthog-js behind a proxy asks it of the proxy.

use std::sync::Arc;

use bytes::Bytes;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{HeaderMap, Response, StatusCode};

use super::error::ApiError;
use super::remote_config::{self, File};
use super::response::{self, Body};
use crate::app::App;
use crate::edge::cache::{Cache, Copy, Found};
use crate::projects::client_config::DECIDE_ONLY;
use crate::projects::{key_shape_is_valid, Project};

/// As the edge's own config answers: browsers pick a change up within a minute.
const CACHE_CONTROL_CONFIG: &str = "public, max-age=60";

/// `/array/<key>/...`.
pub async fn remote_config(
    app: &Arc<App>,
    cache: &Arc<Cache>,
    path: &str,
) -> Result<Response<Body>, ApiError> {
    let (token, file) = remote_config::parse_path(path).ok_or(ApiError::NotFound)?;
    let project = super::project_key::project_of(app, token)?;
    let (upstream, endpoint) = match file {
        File::Config => (config_path(&project.api_key), "config"),
        File::ConfigJs | File::ArrayJs => {
            (format!("{}.js", config_path(&project.api_key)), "config_js")
        }
    };
    let copy = match cache.get(&upstream, endpoint).await {
        Found::Copy(copy) => copy,
        Found::Refused(answer) => {
            return Ok(passed_on(answer.status, &answer.headers, answer.body))
        }
        Found::Nothing => return remote_config::handle(app, path).await,
    };
    let body = match file {
        // The library from the edge's files, upstream's config script after it.
        File::ArrayJs => Bytes::from(remote_config::array_js(app, &copy.body).await?),
        File::Config | File::ConfigJs => copy.body.clone(),
    };
    let mut r = with_content_type(StatusCode::OK, &copy.content_type, body);
    r.headers_mut().insert(
        CACHE_CONTROL,
        HeaderValue::from_static(CACHE_CONTROL_CONFIG),
    );
    Ok(r)
}

/// Members of upstream's remote config that a `/decide` answer has of its own.
const DECIDE_OWN: &[&str] = &[
    "token",
    "hasFeatureFlags",
    "flags",
    "featureFlags",
    "featureFlagPayloads",
    "errorsWhileComputingFlags",
    "requestId",
    "evaluatedAt",
    "quotaLimited",
    "config",
    "toolbarParams",
    "isAuthenticated",
];

/// In edge mode, the copy of upstream's remote config whose members `/decide` and
/// `/flags` end with ([`decide_members`]), so a browser asking `/flags?config=true`
/// turns on what upstream says (session recording included). `None` until the cache
/// has one: the edge's own members meanwhile.
pub fn decide_tail(app: &App, project: &Project) -> Option<Arc<Copy>> {
    let cache = app.upstream_cache.as_ref()?;
    let copy = cache.peek(&config_path(&project.api_key), "config")?;
    decide_members(&copy)?;
    Some(copy)
}

/// The `/decide` members a remote config copy gives, JSON text without braces.
pub fn decide_members(copy: &Copy) -> Option<&str> {
    let derived = copy.derived.get_or_init(|| {
        let config: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&copy.body).ok()?;
        let mut out = DECIDE_ONLY.to_string();
        let mut first = true;
        for (k, v) in config
            .iter()
            .filter(|(k, _)| !DECIDE_OWN.contains(&k.as_str()))
        {
            if !std::mem::take(&mut first) {
                out.push(',');
            }
            out.push_str(&serde_json::to_string(k).ok()?);
            out.push(':');
            out.push_str(&serde_json::to_string(v).ok()?);
        }
        Some(out)
    });
    derived.as_deref()
}

fn config_path(token: &str) -> String {
    let key = form_urlencoded::byte_serialize(token.as_bytes()).collect::<String>();
    format!("/array/{key}/config")
}

/// `/api/surveys/?token=` and, with `early_access`, `/api/early_access_features/`.
pub async fn surveys(
    app: &Arc<App>,
    cache: &Arc<Cache>,
    query: Option<&str>,
    early_access: bool,
) -> Result<Response<Body>, ApiError> {
    let params = super::surveys::Params::parse(query);
    let known = params
        .token
        .as_deref()
        .filter(|t| key_shape_is_valid(t))
        .and_then(|t| app.projects.load().by_api_key(t).cloned());
    let local = || match early_access {
        true => super::surveys::early_access_features(app, query),
        false => super::surveys::surveys(app, query),
    };
    // A missing or unknown key gets the edge's own refusal, never a trip upstream.
    let Some(project) = known else {
        return local();
    };
    let (upstream, endpoint) = upstream_path(&project.api_key, &params.stages, early_access);
    Ok(match cache.get(&upstream, endpoint).await {
        Found::Copy(copy) => {
            with_content_type(StatusCode::OK, &copy.content_type, copy.body.clone())
        }
        Found::Refused(answer) => passed_on(answer.status, &answer.headers, answer.body),
        Found::Nothing => return local(),
    })
}

/// The upstream path and query of a project's surveys or early access features.
fn upstream_path(token: &str, stages: &[String], early_access: bool) -> (String, &'static str) {
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.append_pair("token", token);
    let (path, endpoint) = match early_access {
        true => {
            for stage in stages {
                query.append_pair("stage", stage);
            }
            ("/api/early_access_features/", "early_access_features")
        }
        false => ("/api/surveys/", "surveys"),
    };
    (format!("{path}?{}", query.finish()), endpoint)
}

/// Upstream's refusal as upstream wrote it.
fn passed_on(status: StatusCode, headers: &HeaderMap, body: Bytes) -> Response<Body> {
    let content_type = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    with_content_type(status, content_type, body)
}

fn with_content_type(status: StatusCode, content_type: &str, body: Bytes) -> Response<Body> {
    let mut r = response::with_type(status, "application/json", body);
    if let Ok(v) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r
}
