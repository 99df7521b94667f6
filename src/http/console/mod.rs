//! The web console at `/console/`: its page and embedded assets, sign-in with a
//! personal API key into a session cookie, and its JSON endpoints under
//! `/console/api/`. The session stands in for the key: flags go through the
//! management API's own code (`flags_api::serve`), events and persons through the
//! read API's (`api::serve`), so nothing here writes a flag file. Every request that
//! changes state must come from the console's own origin and carry the session's
//! token; the cookie alone never suffices.

mod assets;
mod counts;
mod data;
pub mod find;
mod flag;
mod insights;
pub mod persons;
mod range;
mod reach;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use super::error::ApiError;
use super::response::{self, Body};
use crate::app::App;
use crate::manage::session::{self, Session};
use crate::projects::Caller;
use crate::support::memory::Reservation;

/// The session cookie's name.
pub const COOKIE: &str = "flagpost_console";
/// The header a state-changing request echoes the session's token in.
pub const TOKEN_HEADER: &str = "x-flagpost-token";
/// A sign-in body holds one key; anything larger is not one.
const MAX_SIGN_IN_BYTES: usize = 4096;
/// Every failed sign-in waits this long before it is answered, on top of the
/// failed-authentication limit, so guessing is slow even within the burst.
const FAILED_SIGN_IN_DELAY: Duration = Duration::from_millis(300);

pub async fn handle(
    app: &Arc<App>,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Result<Response<Body>, ApiError> {
    if !app.config.console {
        return Err(ApiError::NotFound);
    }
    let path = req.uri().path().to_owned();
    let rest = path.strip_prefix("/console").unwrap_or("");
    let mut response = match rest {
        "" => Ok(redirect("/console/")),
        _ if rest.starts_with("/api/") => api(app, req, peer, &rest["/api/".len()..]).await,
        _ => {
            if req.method() != Method::GET && req.method() != Method::HEAD {
                return Err(ApiError::MethodNotAllowed);
            }
            assets::serve(rest, req.headers())
        }
    }
    .unwrap_or_else(ApiError::into_response);
    guard_headers(response.headers_mut());
    Ok(response)
}

/// Headers on every console answer: no framing, no sniffing, only its own scripts.
fn guard_headers(h: &mut HeaderMap) {
    let set = |h: &mut HeaderMap, name: &'static str, value: &'static str| {
        h.insert(name, HeaderValue::from_static(value));
    };
    set(
        h,
        "content-security-policy",
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
         connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    );
    set(h, "x-frame-options", "DENY");
    set(h, "x-content-type-options", "nosniff");
    set(h, "referrer-policy", "same-origin");
    if !h.contains_key(header::CACHE_CONTROL) {
        set(h, "cache-control", "no-store");
    }
}

fn redirect(to: &'static str) -> Response<Body> {
    let mut r = response::empty(StatusCode::PERMANENT_REDIRECT);
    r.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static(to));
    r
}

async fn api(
    app: &Arc<App>,
    req: Request<Incoming>,
    peer: SocketAddr,
    rest: &str,
) -> Result<Response<Body>, ApiError> {
    let rest = rest.strip_suffix('/').unwrap_or(rest).to_owned();
    let method = req.method().clone();
    if rest == "session" {
        return match method {
            // Asked by every page load, so no session is an answer, not an error.
            Method::GET => Ok(response::json(
                StatusCode::OK,
                &match current(app, req.headers()) {
                    Ok(s) => describe(app, &s),
                    Err(_) => json!({"signed_in": false}),
                },
            )),
            Method::POST => sign_in(app, req, peer).await,
            Method::DELETE => {
                let (id, s, _) = signed_in(app, req.headers())?;
                same_site(req.headers(), &s)?;
                app.sessions.remove(&id);
                let mut r = response::empty(StatusCode::NO_CONTENT);
                set_cookie(&mut r, req.headers(), "", true);
                Ok(r)
            }
            _ => Err(ApiError::MethodNotAllowed),
        };
    }
    let (_, s, caller) = signed_in(app, req.headers())?;
    if method != Method::GET && method != Method::HEAD {
        same_site(req.headers(), &s)?;
    }
    if let Some(flags) = rest.strip_prefix("feature_flags") {
        let api_path = format!("/api/projects/{}/feature_flags{flags}", s.project);
        let (_, path) = super::flags_api::parse_path(&api_path).ok_or(ApiError::NotFound)?;
        return super::flags_api::serve(app, caller, path, req).await;
    }
    if method != Method::GET {
        return Err(ApiError::MethodNotAllowed);
    }
    let (parts, _) = req.into_parts();
    let (headers, query) = (&parts.headers, parts.uri.query());
    // The session has its key's rights, no more: a scoped key's pages refuse as the
    // API would.
    let needs = match rest.as_str() {
        "events" | "exposures" | "insights/counts" | "insights/top" | "insights/surveys"
        | "flag_exposures" | "properties" => Some("query:read"),
        "persons" | "person_flags" | "flag_reach" => Some("person:read"),
        _ => None,
    };
    // Property names of persons are persons' data.
    if rest == "properties" && super::params::Params::parse(query).get("of") == Some("persons") {
        super::personal::require(&caller, "person:read")?;
    }
    if let Some(scope) = needs {
        super::personal::require(&caller, scope)?;
    }
    match rest.as_str() {
        "events" => find::events(app, s.project, headers, parts.uri.path(), query).await,
        "persons" => persons::persons(app, s.project, headers, parts.uri.path(), query).await,
        "properties" => find::properties(app, s.project, query).await,
        "flag_exposures" => flag::exposures(app, s.project, query).await,
        "flag_reach" => flag::reach(app, s.project, query).await,
        "person_flags" => data::person_flags(app, s.project, query),
        "exposures" => insights::exposures_page(app, s.project, query).await,
        "health" => Ok(response::json(
            StatusCode::OK,
            &data::health(app, s.project),
        )),
        "insights/counts" => counts::counts(app, s.project, query).await,
        "insights/top" => insights::top(app, s.project, query).await,
        "insights/surveys" => insights::surveys(app, s.project, query).await,
        _ => Err(ApiError::NotFound),
    }
}

/// What the page learns about its session: the project, who signed in, the token to
/// echo, and how long an idle session lasts.
fn describe(app: &App, s: &Session) -> Value {
    let projects = app.projects.load();
    let name = projects.by_id(s.project).map(|p| p.name.clone());
    let mut project = json!({"id": s.project, "name": name});
    // Only in edge mode, for a project whose flags are synced (read-only here).
    if let Some(upstream) = super::flags_api::synced_from(app, s.project) {
        project["synced_from"] = json!(upstream);
    }
    json!({
        "signed_in": true,
        "project": project,
        "signed_in_as": s.label,
        "token": s.token,
        "idle_expiry_seconds": session::IDLE_EXPIRY.as_secs(),
        "version": env!("CARGO_PKG_VERSION"),
    })
}

async fn sign_in(
    app: &Arc<App>,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Result<Response<Body>, ApiError> {
    let (parts, incoming) = req.into_parts();
    // No session yet, so no token: the origin and a JSON body (which another site can
    // only send after a CORS preflight this server never grants) stand in for it.
    own_origin(&parts.headers)?;
    let is_json = super::header_str(&parts.headers, header::CONTENT_TYPE)
        .is_some_and(|t| t.starts_with("application/json"));
    if !is_json {
        return Err(ApiError::CrossSite(
            "sign in with a JSON body from the console's own page",
        ));
    }
    // The token is taken before the body is read: sign-ins whose bodies are held back
    // each hold one, so however many are sent at once, no more than the address's
    // tokens are ever checked.
    let ip = super::client_ip(app, peer, &parts.headers);
    let attempt = app.failed_auth.take(ip).map_err(ApiError::Throttled)?;
    let mut held = Reservation::default();
    let raw = super::body::read(
        incoming,
        super::content_length(&parts.headers),
        MAX_SIGN_IN_BYTES,
        app.config.limits.body_read_timeout,
        &app.budget,
        &mut held,
    )
    .await?;
    let key = serde_json::from_slice::<Value>(&raw)
        .ok()
        .and_then(|v| v.get("key")?.as_str().map(|k| k.trim().to_owned()))
        .unwrap_or_default();
    let found = app
        .projects
        .load()
        .personal_key(&key)
        .map(|(_, caller)| caller);
    let Some(caller) = found else {
        drop(attempt);
        tokio::time::sleep(FAILED_SIGN_IN_DELAY).await;
        return Err(ApiError::SignedOut(
            "that is not a personal API key of any project",
        ));
    };
    attempt.passed();
    let (id, s) = app
        .sessions
        .create(caller.project, &key, &caller.label)
        .map_err(|e| {
            tracing::error!(error = %e, "console sign-in failed");
            ApiError::Internal
        })?;
    tracing::info!(project = s.project, who = %s.label, "console sign-in");
    let mut r = response::json(StatusCode::OK, &describe(app, &s));
    set_cookie(&mut r, &parts.headers, &id, false);
    Ok(r)
}

/// The session of this request's cookie, with its key still in `projects.json`.
fn current(app: &App, headers: &HeaderMap) -> Result<Session, ApiError> {
    signed_in(app, headers).map(|(_, s, _)| s)
}

/// The session's id, the session, and its key as `projects.json` has it now (with its
/// scopes as they are now).
fn signed_in(app: &App, headers: &HeaderMap) -> Result<(String, Session, Caller), ApiError> {
    let id = cookie(headers).ok_or(ApiError::SignedOut("sign in first"))?;
    let s = app
        .sessions
        .touch(&id)
        .ok_or(ApiError::SignedOut("the session ended; sign in again"))?;
    let caller = app
        .projects
        .load()
        .personal_key(&s.key)
        .filter(|(p, _)| p.id == s.project)
        .map(|(_, caller)| Caller {
            label: s.label.clone(),
            ..caller
        });
    let Some(caller) = caller else {
        app.sessions.remove(&id);
        return Err(ApiError::SignedOut("the key was removed; sign in again"));
    };
    Ok((id, s, caller))
}

/// A state-changing request must come from the console's own origin and carry the
/// session's token.
fn same_site(headers: &HeaderMap, s: &Session) -> Result<(), ApiError> {
    own_origin(headers)?;
    let token = headers
        .get(TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or(ApiError::CrossSite("the session token header is missing"))?;
    if !session::same_secret(token, &s.token) {
        return Err(ApiError::CrossSite("the session token does not match"));
    }
    Ok(())
}

fn own_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    let origin = headers
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .ok_or(ApiError::CrossSite("the request has no Origin"))?;
    if Some(origin) == origin_of(headers).as_deref() {
        Ok(())
    } else {
        Err(ApiError::CrossSite("the request comes from another origin"))
    }
}

/// `scheme://host` as a browser on this console writes its Origin: the scheme from
/// X-Forwarded-Proto (nginx says when it took https), the host as sent, without the
/// scheme's default port.
fn origin_of(headers: &HeaderMap) -> Option<String> {
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let https = is_https(headers);
    let host = match (https, host.rsplit_once(':')) {
        (true, Some((h, "443"))) | (false, Some((h, "80"))) => h,
        _ => host,
    };
    Some(format!("{}://{host}", if https { "https" } else { "http" }))
}

fn is_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
        .filter(|v| !v.is_empty())
}

/// The session cookie: script cannot read it, other sites' requests do not carry it,
/// and behind https it only travels encrypted. It ends with the browser; the server's
/// idle expiry ends it sooner.
fn set_cookie(r: &mut Response<Body>, request: &HeaderMap, id: &str, clear: bool) {
    let mut value = format!("{COOKIE}={id}; Path=/console/; HttpOnly; SameSite=Strict");
    if is_https(request) {
        value.push_str("; Secure");
    }
    if clear {
        value.push_str("; Max-Age=0");
    }
    if let Ok(v) = HeaderValue::from_str(&value) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_own_origin_follows_host_and_forwarded_scheme() {
        let h = headers(&[("host", "a.example:8000")]);
        assert_eq!(origin_of(&h).as_deref(), Some("http://a.example:8000"));
        let h = headers(&[("host", "a.example:443"), ("x-forwarded-proto", "https")]);
        assert_eq!(origin_of(&h).as_deref(), Some("https://a.example"));
        assert_eq!(origin_of(&HeaderMap::new()), None);
    }

    /// Only the exact origin passes: a host that starts or ends like it, another port
    /// or scheme, `null`, or the origin with anything around it is another site.
    #[test]
    fn look_alike_origins_are_not_the_own_origin() {
        let own = |origin: &str, extra: &[(&'static str, &str)]| {
            let mut pairs = vec![("host", "console.example:8000"), ("origin", origin)];
            pairs.extend_from_slice(extra);
            own_origin(&headers(&pairs)).is_ok()
        };
        assert!(own("http://console.example:8000", &[]));
        for origin in [
            "http://console.example:8000.evil.example",
            "http://console.example:80001",
            "http://console.example:800",
            "http://console.example",
            "https://console.example:8000",
            "http://evil.console.example:8000",
            "http://xconsole.example:8000",
            "null",
            "",
            "http://console.example:8000/",
            "http://evil.example/http://console.example:8000",
            "http://console.example:8000, http://evil.example",
        ] {
            assert!(!own(origin, &[]), "{origin:?} taken for the own origin");
        }
        let https = [("x-forwarded-proto", "https")];
        assert!(own("https://console.example:8000", &https));
        assert!(!own("http://console.example:8000", &https));
        // No Origin at all, or no Host to compare it with, is refused too.
        assert!(own_origin(&headers(&[("host", "console.example")])).is_err());
        assert!(own_origin(&headers(&[("origin", "http://console.example")])).is_err());
    }

    /// A state change needs both: the exact origin and the session's own token.
    #[test]
    fn a_state_change_needs_the_own_origin_and_the_session_token() {
        let sessions = crate::manage::session::Sessions::default();
        let (_, s) = sessions.create(1, "phx_k", "k").unwrap();
        let host = ("host", "console.example");
        let own = ("origin", "http://console.example");
        let token = s.token.clone();
        let same = |pairs: &[(&'static str, &str)]| same_site(&headers(pairs), &s).is_ok();
        assert!(same(&[host, own, (TOKEN_HEADER, &token)]));
        assert!(!same(&[host, own]), "no token");
        assert!(!same(&[host, own, (TOKEN_HEADER, "0000")]), "another token");
        let other = ("origin", "http://console.example.evil.example");
        assert!(
            !same(&[host, other, (TOKEN_HEADER, &token)]),
            "another origin"
        );
        assert!(!same(&[host, (TOKEN_HEADER, &token)]), "no origin");
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let h = headers(&[("cookie", "a=1; flagpost_console=abc; b=2")]);
        assert_eq!(cookie(&h).as_deref(), Some("abc"));
        assert_eq!(cookie(&headers(&[("cookie", "flagpost_console=")])), None);
        assert_eq!(cookie(&headers(&[("cookie", "xflagpost_console=1")])), None);
    }
}

#[cfg(test)]
#[path = "tests/session.rs"]
mod session_tests;
