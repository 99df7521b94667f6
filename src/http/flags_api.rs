//! PostHog's feature flag and cohort REST API over the management store
//! (`crate::manage`), for holders of a personal API key of the project:
//! `/api/projects/{id}/feature_flags/` (list, create), `.../feature_flags/{id}/` (get,
//! update, `{"deleted": true}` to delete), `.../feature_flags/{id}/activity/` and
//! `.../feature_flags/activity/`, and `/api/projects/{id}/cohorts/[{id}/]`. `{id}` may be
//! `@current`, the key's own project, as PostHog's clients send it. A write is
//! published through the flag reloader before it is answered, so `/decide` already
//! serves it.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use super::body;
use super::error::ApiError;
use super::params::Params;
use super::response::{self, Body};
use crate::app::App;
use crate::manage::{ActivityQuery, ListQuery, Store};
use crate::projects::Caller;
use crate::support::memory::Reservation;

/// Largest body taken, refused from its Content-Length before a byte is read (PostHog's
/// own limit for API bodies).
pub const MAX_BODY_BYTES: usize = 20 * 1024 * 1024;
/// PostHog's page size for flags and cohorts, and the most one page may hold.
const PAGE: usize = 100;
const MAX_PAGE: usize = 1000;
/// PostHog's page size for activity.
const ACTIVITY_PAGE: usize = 10;

/// What a management path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    Flags,
    Flag(i64),
    FlagActivity(Option<i64>),
    Cohorts,
    Cohort(i64),
}

impl Path {
    pub fn label(self) -> &'static str {
        match self {
            Path::Flags | Path::Flag(_) => "api_feature_flags",
            Path::FlagActivity(_) => "api_feature_flag_activity",
            Path::Cohorts | Path::Cohort(_) => "api_cohorts",
        }
    }
}

/// `/api/projects/{id|@current}/...`, trailing slash optional; `None` for `@current`.
pub fn parse_path(path: &str) -> Option<(Option<u64>, Path)> {
    let rest = path.strip_prefix("/api/projects/")?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let mut parts = rest.split('/');
    let project = match parts.next()? {
        "@current" => None,
        id => Some(id.parse().ok()?),
    };
    let id = |s: &str| s.parse::<i64>().ok();
    let what = match (parts.next()?, parts.next(), parts.next(), parts.next()) {
        ("feature_flags", None, None, None) => Path::Flags,
        ("feature_flags", Some("activity"), None, None) => Path::FlagActivity(None),
        ("feature_flags", Some(n), None, None) => Path::Flag(id(n)?),
        ("feature_flags", Some(n), Some("activity"), None) => Path::FlagActivity(Some(id(n)?)),
        ("cohorts", None, None, None) => Path::Cohorts,
        ("cohorts", Some(n), None, None) => Path::Cohort(id(n)?),
        _ => return None,
    };
    Some((project, what))
}

pub async fn handle(
    app: &Arc<App>,
    project: Option<u64>,
    path: Path,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Result<Response<Body>, ApiError> {
    if !allowed(path, req.method()) {
        return Err(ApiError::MethodNotAllowed);
    }
    let caller = authenticate(app, req.headers(), peer, project)?;
    serve(app, caller, path, req).await
}

/// The upstream a project's flags and cohorts are synced from (edge mode, with an
/// `upstream_secret_key`): they are changed there, not here.
pub fn synced_from(app: &App, project: u64) -> Option<&str> {
    let upstream = app.upstream.as_ref()?;
    let projects = app.projects.load();
    projects
        .by_id(project)?
        .upstream_secret_key
        .as_ref()
        .map(|_| upstream.base())
}

fn allowed(path: Path, method: &Method) -> bool {
    match path {
        Path::Flags | Path::Cohorts => method == Method::GET || method == Method::POST,
        Path::Flag(_) | Path::Cohort(_) => method == Method::GET || method == Method::PATCH,
        Path::FlagActivity(_) => method == Method::GET,
    }
}

/// The scope a personal key needs for this request, as PostHog's viewsets name them:
/// a flag's history (both activity paths) is PostHog's activity log, which takes
/// `activity_log:read` rather than the flag's own scope.
fn scope(path: Path, method: &Method) -> &'static str {
    let read = method == Method::GET;
    match (path, read) {
        (Path::FlagActivity(_), _) => "activity_log:read",
        (Path::Flags | Path::Flag(_), true) => "feature_flag:read",
        (Path::Flags | Path::Flag(_), false) => "feature_flag:write",
        (Path::Cohorts | Path::Cohort(_), true) => "cohort:read",
        (Path::Cohorts | Path::Cohort(_), false) => "cohort:write",
    }
}

/// A request of a caller already known to hold a key of its project (checked by
/// `authenticate`, or a console session): the one code path that reads and writes
/// flags and cohorts, whoever asks.
pub async fn serve(
    app: &Arc<App>,
    caller: Caller,
    path: Path,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let (parts, incoming) = req.into_parts();
    let method = parts.method.clone();
    if !allowed(path, &method) {
        return Err(ApiError::MethodNotAllowed);
    }
    super::personal::require(&caller, scope(path, &method))?;
    let project = caller.project;
    if method == Method::GET {
        let query = parts.uri.query();
        let page = |count: usize, results: Vec<Value>, limit: usize, offset: usize| {
            let link = |o| page_url(app, &parts.headers, parts.uri.path(), query, limit, o);
            let next = (offset + limit < count).then(|| link(Some(offset + limit)));
            let previous = (offset > 0).then(|| link(offset.checked_sub(limit).filter(|o| *o > 0)));
            json!({"count": count, "next": next, "previous": previous, "results": results})
        };
        let q = Params::parse(query);
        let value = match path {
            Path::Flags => {
                let list = ListQuery {
                    limit: q.page_size(PAGE)?,
                    offset: q.number("offset", 0)?,
                    search: q.get("search").map(str::to_owned),
                    active: match q.get("active") {
                        Some("true") => Some(true),
                        Some("false") => Some(false),
                        _ => None,
                    },
                };
                let (limit, offset) = (list.limit, list.offset);
                let got = blocking(app, move |s| s.list(project, &list)).await?;
                page(got.count, got.results, limit, offset)
            }
            Path::Cohorts => {
                let (limit, offset) = (q.page_size(PAGE)?, q.number("offset", 0)?);
                let got = blocking(app, move |s| s.list_cohorts(project, limit, offset)).await?;
                page(got.count, got.results, limit, offset)
            }
            Path::Flag(id) => blocking(app, move |s| s.get(project, id)).await?,
            Path::Cohort(id) => blocking(app, move |s| s.get_cohort(project, id)).await?,
            Path::FlagActivity(item_id) => {
                let (limit, page_no) = (q.page_size(ACTIVITY_PAGE)?, q.number("page", 1)?.max(1));
                let aq = ActivityQuery {
                    scope: "FeatureFlag",
                    item_id,
                    limit,
                    page: page_no,
                };
                let (total, results) = blocking(app, move |s| s.activity(project, &aq)).await?;
                let link = |p: usize| {
                    let mut url = super::links::base(app, &parts.headers);
                    url.push_str(parts.uri.path());
                    url.push_str(&with_params(
                        query,
                        &[("limit", Some(limit)), ("page", Some(p))],
                    ));
                    url
                };
                json!({
                    "results": results,
                    "next": (page_no * limit < total).then(|| link(page_no + 1)),
                    "previous": (page_no > 1).then(|| link(page_no - 1)),
                    "total_count": total,
                })
            }
        };
        return Ok(response::json(StatusCode::OK, &value));
    }
    if let Some(upstream) = synced_from(app, project) {
        let what = match path {
            Path::Cohorts | Path::Cohort(_) => "cohorts",
            _ => "flags",
        };
        return Err(ApiError::Manage(crate::manage::Error::Conflict(format!(
            "project {project}'s {what} are synced from {upstream}; change them there"
        ))));
    }
    let mut held = Reservation::default();
    let raw = body::read(
        incoming,
        super::content_length(&parts.headers),
        MAX_BODY_BYTES,
        app.config.limits.body_read_timeout,
        &app.budget,
        &mut held,
    )
    .await?;
    let body: Value = if raw.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&raw).map_err(|e| ApiError::ParseJson(e.to_string()))?
    };
    drop(raw);
    let who = caller.label.clone();
    let now = crate::support::clock::format_ms(crate::support::clock::now_ms());
    let (status, value) = match path {
        Path::Flags => (
            StatusCode::CREATED,
            write(app, move |s| s.create(project, &body, &who, &now)).await?,
        ),
        Path::Flag(id) => (
            StatusCode::OK,
            write(app, move |s| s.update(project, id, &body, &who, &now)).await?,
        ),
        Path::Cohorts => (
            StatusCode::CREATED,
            write(app, move |s| s.create_cohort(project, &body, &who, &now)).await?,
        ),
        Path::Cohort(id) => (
            StatusCode::OK,
            write(app, move |s| {
                s.update_cohort(project, id, &body, &who, &now)
            })
            .await?,
        ),
        Path::FlagActivity(_) => return Err(ApiError::MethodNotAllowed),
    };
    Ok(response::json(status, &value))
}

/// The caller, whose key must belong to `project` (any project for `@current`).
fn authenticate(
    app: &App,
    headers: &HeaderMap,
    peer: SocketAddr,
    project: Option<u64>,
) -> Result<Caller, ApiError> {
    let (_, caller) = match project {
        Some(id) => super::personal::authorize(app, headers, peer, id)?,
        None => super::personal::authenticate(app, headers, peer)?,
    };
    Ok(caller)
}

/// A read on the blocking pool.
async fn blocking<T: Send + 'static>(
    app: &Arc<App>,
    f: impl FnOnce(&Store) -> Result<T, crate::manage::Error> + Send + 'static,
) -> Result<T, ApiError> {
    let app = app.clone();
    tokio::task::spawn_blocking(move || f(&app.manage))
        .await
        .map_err(|_| ApiError::Internal)?
        .map_err(ApiError::Manage)
}

/// A write on the blocking pool, published through the flag reloader before it is
/// answered (the same path a hand edit takes, only sooner than the next poll).
async fn write(
    app: &Arc<App>,
    f: impl FnOnce(&Store) -> Result<Value, crate::manage::Error> + Send + 'static,
) -> Result<Value, ApiError> {
    let app = app.clone();
    tokio::task::spawn_blocking(move || {
        let value = f(&app.manage)?;
        app.rules.reload_if_changed(&app.config.flags_dir());
        Ok(value)
    })
    .await
    .map_err(|_| ApiError::Internal)?
    .map_err(ApiError::Manage)
}

/// The same request with `limit` and `offset` set, or `offset` dropped (DRF's
/// `LimitOffsetPagination` links).
fn page_url(
    app: &App,
    headers: &HeaderMap,
    path: &str,
    query: Option<&str>,
    limit: usize,
    offset: Option<usize>,
) -> String {
    let mut url = super::links::base(app, headers);
    url.push_str(path);
    url.push_str(&with_params(
        query,
        &[("limit", Some(limit)), ("offset", offset)],
    ));
    url
}

/// `?query` with each named parameter replaced (or removed when `None`).
fn with_params(query: Option<&str>, set: &[(&str, Option<usize>)]) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if !set.iter().any(|(name, _)| *name == k) {
            q.append_pair(&k, &v);
        }
    }
    for (k, v) in set {
        if let Some(v) = v {
            q.append_pair(k, &v.to_string());
        }
    }
    format!("?{}", q.finish())
}

/// The management API's parameters.
impl Params {
    /// `limit`: a page's size, `default` when absent, at most [`MAX_PAGE`].
    fn page_size(&self, default: usize) -> Result<usize, ApiError> {
        match self.number("limit", default)? {
            0 => Err(ApiError::BadQuery(
                "limit must be a positive integer".into(),
            )),
            n => Ok(n.min(MAX_PAGE)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let p = |s| parse_path(s);
        assert_eq!(
            p("/api/projects/1/feature_flags/"),
            Some((Some(1), Path::Flags))
        );
        assert_eq!(
            p("/api/projects/@current/feature_flags"),
            Some((None, Path::Flags))
        );
        assert_eq!(
            p("/api/projects/2/feature_flags/7/"),
            Some((Some(2), Path::Flag(7)))
        );
        assert_eq!(
            p("/api/projects/2/feature_flags/7/activity/"),
            Some((Some(2), Path::FlagActivity(Some(7))))
        );
        assert_eq!(
            p("/api/projects/2/feature_flags/activity"),
            Some((Some(2), Path::FlagActivity(None)))
        );
        assert_eq!(
            p("/api/projects/3/cohorts/"),
            Some((Some(3), Path::Cohorts))
        );
        assert_eq!(
            p("/api/projects/3/cohorts/4"),
            Some((Some(3), Path::Cohort(4)))
        );
        assert_eq!(p("/api/projects/3/feature_flags/x/"), None);
        assert_eq!(p("/api/projects/x/feature_flags/"), None);
        assert_eq!(p("/api/projects/1/feature_flags/1/other/"), None);
        assert_eq!(p("/api/projects/1/events/"), None);
    }

    #[test]
    fn page_links_replace_limit_and_offset() {
        assert_eq!(
            with_params(
                Some("search=a%20b&offset=5&limit=2"),
                &[("limit", Some(2)), ("offset", Some(7))]
            ),
            "?search=a+b&limit=2&offset=7"
        );
        assert_eq!(
            with_params(Some("offset=2"), &[("limit", Some(2)), ("offset", None)]),
            "?limit=2"
        );
    }
}
