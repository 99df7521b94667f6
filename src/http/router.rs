//! Which handler answers which path, plus the small endpoints that need no module of
//! their own (health, metrics). Every answer is counted by route and status here.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};

use super::capture;
use super::error::ApiError;
use super::response::{self, Body};
use crate::app::App;

/// What a path is, independent of method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Capture {
        engage: bool,
    },
    /// `/i/v1/analytics/events`: PostHog's v1 capture format.
    CaptureV1,
    /// `/decide` or, with `flags: true`, `/flags`.
    Decide {
        flags: bool,
    },
    /// `/api/feature_flag/local_evaluation/` and `/flags/definitions`.
    Definitions,
    /// `/array/<project key>/config`, `config.js`, `array.js`: posthog-js's start-up.
    RemoteConfig,
    /// `/static/...`: posthog-js's own files.
    Static,
    /// `/api/projects/<project>/feature_flags/<key>/remote_config`.
    FlagPayload,
    /// Paths of features flagpost does not keep, each with a deliberate answer.
    NotKept(super::not_kept::Path),
    /// `/s/` in edge mode: session recordings, kept and forwarded upstream.
    Recordings,
    /// `/api/surveys/?token=`.
    Surveys,
    /// `/api/early_access_features/?token=`.
    EarlyAccess,
    Liveness,
    Readiness,
    Metrics,
    Api(u64, super::api::Resource),
    /// Flags and cohorts through PostHog's REST API; `None` is `@current`.
    Manage(Option<u64>, super::flags_api::Path),
    /// `/api/personal_api_keys/@current`, `/api/users/@me/`: who a personal key is.
    WhoAmI(super::whoami::Path),
    /// `/console/...`: the web console, its assets and its JSON endpoints.
    Console,
    NotFound,
}

impl Route {
    pub fn of(path: &str) -> Route {
        let trimmed = path.strip_suffix('/').unwrap_or(path);
        match trimmed {
            // posthog-node sends `$ai_*` events to their own path, in the `/batch/` shape.
            "/e" | "/i/v0/e" | "/capture" | "/track" | "/batch" | "/i/v0/ai/batch" => {
                Route::Capture { engage: false }
            }
            "/engage" => Route::Capture { engage: true },
            "/i/v1/analytics/events" => Route::CaptureV1,
            "/decide" => Route::Decide { flags: false },
            "/flags" => Route::Decide { flags: true },
            "/api/feature_flag/local_evaluation" | "/flags/definitions" => Route::Definitions,
            "/api/surveys" => Route::Surveys,
            "/api/early_access_features" => Route::EarlyAccess,
            "/_liveness" => Route::Liveness,
            "/_readiness" => Route::Readiness,
            "/metrics" => Route::Metrics,
            _ if path.starts_with("/static/") => Route::Static,
            _ if path.starts_with("/console/") => Route::Console,
            "/console" => Route::Console,
            _ if super::remote_config::parse_path(path).is_some() => Route::RemoteConfig,
            _ if super::definitions::payload_path(path).is_some() => Route::FlagPayload,
            _ => {
                if let Some((project, resource)) = super::api::parse_path(path) {
                    Route::Api(project, resource)
                } else if let Some((project, p)) = super::flags_api::parse_path(path) {
                    Route::Manage(project, p)
                } else if let Some(p) = super::whoami::parse_path(path) {
                    Route::WhoAmI(p)
                } else if let Some(p) = super::not_kept::of(path) {
                    Route::NotKept(p)
                } else {
                    Route::NotFound
                }
            }
        }
    }

    /// The metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Route::Capture { engage: false } => "capture",
            Route::Capture { engage: true } => "engage",
            Route::CaptureV1 => "capture_v1",
            Route::Decide { flags: false } => "decide",
            Route::Decide { flags: true } => "flags",
            Route::Definitions => "flag_definitions",
            Route::RemoteConfig => "remote_config",
            Route::Static => "static",
            Route::FlagPayload => "flag_payload",
            Route::NotKept(p) => p.label(),
            Route::Recordings => "recordings",
            Route::Surveys => "surveys",
            Route::EarlyAccess => "early_access_features",
            Route::Liveness => "liveness",
            Route::Readiness => "readiness",
            Route::Metrics => "metrics",
            Route::Api(_, super::api::Resource::Events) => "api_events",
            Route::Api(_, super::api::Resource::Persons) => "api_persons",
            Route::Api(_, super::api::Resource::Groups) => "api_groups",
            Route::Manage(_, p) => p.label(),
            Route::WhoAmI(super::whoami::Path::CurrentKey) => "api_personal_api_key",
            Route::WhoAmI(super::whoami::Path::Me) => "api_user",
            Route::Console => "console",
            Route::NotFound => "not_found",
        }
    }

    /// Browsers call these from other origins, so every answer on them, errors
    /// included, carries CORS headers (else a browser sees status 0). Unknown paths
    /// too, so a page can read the 404. Not the endpoints of personal keys.
    fn is_cors(self) -> bool {
        matches!(
            self,
            Route::Capture { .. }
                | Route::CaptureV1
                | Route::Decide { .. }
                | Route::RemoteConfig
                | Route::Static
                | Route::NotKept(_)
                | Route::Recordings
                | Route::NotFound
                | Route::Surveys
                | Route::EarlyAccess
        )
    }
}

pub async fn route(app: Arc<App>, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
    let route = match Route::of(req.uri().path()) {
        // Where the edge keeps recordings, `/s/` is a route of its own, counted apart.
        Route::NotKept(_)
            if app.recordings.is_some() && super::recordings::is_path(req.uri().path()) =>
        {
            Route::Recordings
        }
        route => route,
    };
    let request_headers = route.is_cors().then(|| req.headers().clone());
    let mut response = if req.method() == Method::OPTIONS && route.is_cors() {
        response::preflight(req.headers())
    } else {
        dispatch(&app, route, req, peer)
            .await
            .unwrap_or_else(ApiError::into_response)
    };
    if let Some(headers) = request_headers {
        if !response
            .headers()
            .contains_key(hyper::header::ACCESS_CONTROL_ALLOW_ORIGIN)
        {
            response::add_cors(&headers, &mut response);
        }
    }
    // A body refused for its size or its slowness was not read to its end, so the
    // connection cannot carry another request: say so rather than let hyper cut it.
    let status = response.status();
    if status == StatusCode::PAYLOAD_TOO_LARGE || status == StatusCode::REQUEST_TIMEOUT {
        response::close(&mut response);
    }
    app.metrics
        .request(route.label(), response.status().as_u16());
    response
}

/// Every request's future is as large as the largest handler it may await, and is
/// moved whole per request: the handlers only edge mode or the console reach are
/// boxed at their call so capture and `/decide` do not carry them (`tests/futures.rs`).
async fn dispatch(
    app: &Arc<App>,
    route: Route,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Result<Response<Body>, ApiError> {
    let method = req.method().clone();
    match route {
        Route::Capture { engage } => {
            if method != Method::GET && method != Method::POST {
                return Err(ApiError::MethodNotAllowed);
            }
            capture::handle(app, req, peer, engage).await
        }
        Route::CaptureV1 => {
            if method != Method::POST {
                return Err(ApiError::MethodNotAllowed);
            }
            super::capture_v1::handle(app, req, peer).await
        }
        Route::Decide { flags } => {
            if method != Method::GET && method != Method::POST {
                return Err(ApiError::MethodNotAllowed);
            }
            super::decide::handle(app, req, peer, flags).await
        }
        Route::Definitions => {
            if method != Method::GET {
                return Err(ApiError::MethodNotAllowed);
            }
            super::definitions::feed(app, req.headers(), req.uri().query(), peer)
        }
        Route::FlagPayload => {
            if method != Method::GET {
                return Err(ApiError::MethodNotAllowed);
            }
            let uri = req.uri();
            super::definitions::payload(app, req.headers(), uri.path(), uri.query(), peer)
        }
        Route::RemoteConfig => {
            if method != Method::GET && method != Method::HEAD {
                return Err(ApiError::MethodNotAllowed);
            }
            match &app.upstream_cache {
                Some(cache) => {
                    let path = req.uri().path();
                    Box::pin(super::upstream_config::remote_config(app, cache, path)).await
                }
                None => super::remote_config::handle(app, req.uri().path()).await,
            }
        }
        Route::Static => {
            if method != Method::GET && method != Method::HEAD {
                return Err(ApiError::MethodNotAllowed);
            }
            let (dir, named) = app.config.static_dir();
            let rest = req.uri().path().trim_start_matches("/static/");
            super::assets::serve(&dir, named, rest, req.headers()).await
        }
        Route::Recordings => {
            let Some(spool) = &app.recordings else {
                return Err(ApiError::NotFound);
            };
            if method != Method::POST {
                return Err(ApiError::MethodNotAllowed);
            }
            Box::pin(super::recordings::handle(app, spool, req, peer)).await
        }
        Route::NotKept(p) => super::not_kept::handle(app, p, req.uri().query()),
        Route::Surveys | Route::EarlyAccess => {
            if method != Method::GET {
                return Err(ApiError::MethodNotAllowed);
            }
            let query = req.uri().query();
            if let Some(cache) = &app.upstream_cache {
                let early_access = route == Route::EarlyAccess;
                let asking = super::upstream_config::surveys(app, cache, query, early_access);
                return Box::pin(asking).await;
            }
            if route == Route::Surveys {
                super::surveys::surveys(app, query)
            } else {
                super::surveys::early_access_features(app, query)
            }
        }
        Route::Liveness => Ok(if app.is_live() {
            response::text(StatusCode::OK, "ok")
        } else {
            response::text(
                StatusCode::SERVICE_UNAVAILABLE,
                "a component failed; restart",
            )
        }),
        Route::Readiness => {
            // After a failed write, the probe that asks is what finds the disk working
            // again when no event comes to try it.
            app.wal.probe();
            Ok(if app.is_ready() {
                response::text(StatusCode::OK, "ready")
            } else {
                response::text(StatusCode::SERVICE_UNAVAILABLE, "not ready")
            })
        }
        Route::Metrics => Ok(response::with_type(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            super::metrics_text(app).into_bytes(),
        )),
        Route::Api(project, resource) => {
            if method != Method::GET {
                return Err(ApiError::MethodNotAllowed);
            }
            let (parts, _) = req.into_parts();
            super::api::handle(app, project, resource, &parts.headers, &parts.uri, peer).await
        }
        Route::Manage(project, path) => {
            super::flags_api::handle(app, project, path, req, peer).await
        }
        Route::WhoAmI(path) => {
            if method != Method::GET {
                return Err(ApiError::MethodNotAllowed);
            }
            super::whoami::handle(app, path, req.headers(), peer)
        }
        Route::Console => Box::pin(super::console::handle(app, req, peer)).await,
        Route::NotFound => Err(ApiError::NotFound),
    }
}

#[cfg(test)]
#[path = "tests/futures.rs"]
mod futures;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_intake_path() {
        for p in [
            "/e",
            "/e/",
            "/i/v0/e",
            "/i/v0/e/",
            "/capture",
            "/capture/",
            "/track",
            "/track/",
            "/batch",
            "/batch/",
        ] {
            assert_eq!(Route::of(p), Route::Capture { engage: false }, "{p}");
        }
        assert_eq!(Route::of("/engage/"), Route::Capture { engage: true });
        assert_eq!(Route::of("/engage"), Route::Capture { engage: true });
        assert_eq!(Route::of("/captures"), Route::NotFound);
        assert_eq!(Route::of("/i/v1/analytics/events"), Route::CaptureV1);
        assert_eq!(Route::of("/i/v1/analytics/events/"), Route::CaptureV1);
        assert_eq!(Route::of("/i/v1/analytics/events//"), Route::NotFound);
        assert_eq!(Route::of("/i/v1/analytics/eventsx"), Route::NotFound);
        assert_eq!(Route::CaptureV1.label(), "capture_v1");
        assert!(Route::CaptureV1.is_cors());
        assert_eq!(Route::of("/e//"), Route::NotFound);
        assert_eq!(Route::of("/_readiness"), Route::Readiness);
        assert_eq!(Route::of("/decide/"), Route::Decide { flags: false });
        assert_eq!(Route::of("/flags"), Route::Decide { flags: true });
        assert_eq!(Route::of("/flags/definitions"), Route::Definitions);
        assert_eq!(
            Route::of("/api/feature_flag/local_evaluation/"),
            Route::Definitions
        );
        assert_eq!(Route::of("/array/phc_key/config"), Route::RemoteConfig);
        assert_eq!(Route::of("/array/phc_key/config.js"), Route::RemoteConfig);
        assert_eq!(Route::of("/array/phc_key/array.js"), Route::RemoteConfig);
        assert_eq!(Route::of("/array/phc_key/other.js"), Route::NotFound);
        assert_eq!(Route::of("/static/array.js"), Route::Static);
        assert_eq!(
            Route::of("/i/v0/ai/batch/"),
            Route::Capture { engage: false }
        );
        assert_eq!(
            Route::of("/api/projects/@current/feature_flags/k/remote_config"),
            Route::FlagPayload
        );
        assert_eq!(Route::of("/api/surveys/"), Route::Surveys);
        assert_eq!(Route::of("/api/surveys"), Route::Surveys);
        assert_eq!(Route::of("/api/early_access_features/"), Route::EarlyAccess);
        assert!(Route::Surveys.is_cors() && Route::EarlyAccess.is_cors());
        assert_eq!(Route::of("/array//config"), Route::NotFound);
        assert_eq!(Route::of("/console"), Route::Console);
        assert_eq!(Route::of("/console/"), Route::Console);
        assert_eq!(Route::of("/console/api/session"), Route::Console);
        assert_eq!(Route::of("/consoles"), Route::NotFound);
        assert!(!Route::Console.is_cors());
        assert_eq!(Route::of("/array/a/b/config"), Route::NotFound);
    }
}
