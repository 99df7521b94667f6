//! Authentication by key, the one path every endpoint that takes a personal API key goes
//! through (the read API, the flag management API, the definitions feeds and remote
//! config payloads), so the limit on failed attempts (`manage::FailedAuth`) covers all
//! of them alike: a key guessed against one endpoint costs the same tries as against
//! another. The definitions feeds also take a project secret key (`phs_...`), through
//! the same limit; no other endpoint does. A personal key with scopes is held to them
//! here too ([`require`]), with PostHog's 403.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::header::AUTHORIZATION;
use hyper::HeaderMap;

use super::error::ApiError;
use crate::app::App;
use crate::projects::{Caller, Project, PERSONAL_KEY_PREFIX, SECRET_KEY_PREFIX};

/// The scope reading flag definitions needs, as PostHog's local evaluation does.
pub const FEED_SCOPE: &str = "feature_flag:read";

/// The key of `Authorization: Bearer <key>`, trimmed.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// The personal API key of `Authorization: Bearer phx_...`; anything else is not one.
pub fn personal_key(headers: &HeaderMap) -> Result<&str, ApiError> {
    bearer(headers)
        .filter(|k| k.starts_with(PERSONAL_KEY_PREFIX))
        .ok_or(ApiError::NotAuthenticated)
}

/// What a request's key turned out to be.
enum Holder {
    Personal(Arc<Project>, Caller),
    Secret(Arc<Project>),
}

/// The key the request carries, looked up. Every attempt takes a token of the address's
/// failed-authentication limit before its key is looked at (so an address out of tokens
/// gets 429, whatever it sends); a known key gives it back, whatever the caller then
/// asks for (a key of another project gets 403 from the caller's check), so only a
/// missing or unknown key costs one.
fn identify(app: &App, headers: &HeaderMap, peer: SocketAddr) -> Result<Holder, ApiError> {
    let ip = super::client_ip(app, peer, headers);
    let attempt = app.failed_auth.take(ip).map_err(ApiError::Throttled)?;
    let key = bearer(headers).ok_or(ApiError::NotAuthenticated)?;
    let projects = app.projects.load();
    let holder = if key.starts_with(SECRET_KEY_PREFIX) {
        projects
            .secret_key(key)
            .map(|(project, _)| Holder::Secret(project.clone()))
    } else {
        projects
            .personal_key(key)
            .filter(|_| key.starts_with(PERSONAL_KEY_PREFIX))
            .map(|(project, caller)| Holder::Personal(project.clone(), caller))
    };
    let holder = holder.ok_or(ApiError::NotAuthenticated)?;
    attempt.passed();
    Ok(holder)
}

/// The project whose personal key the request carries, and who the key says the caller
/// is. A project secret key is a good key in the wrong place: 403, and no failure.
pub fn authenticate(
    app: &App,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Result<(Arc<Project>, Caller), ApiError> {
    match identify(app, headers, peer)? {
        Holder::Personal(project, caller) => Ok((project, caller)),
        Holder::Secret(_) => Err(ApiError::SecretKeyElsewhere),
    }
}

/// [`authenticate`], for a request about `project`: a key of another project gets 403,
/// whether `project` exists or not, so the answer tells nothing about other projects.
pub fn authorize(
    app: &App,
    headers: &HeaderMap,
    peer: SocketAddr,
    project: u64,
) -> Result<(Arc<Project>, Caller), ApiError> {
    let (owner, caller) = authenticate(app, headers, peer)?;
    if owner.id != project {
        return Err(ApiError::Forbidden);
    }
    Ok((owner, caller))
}

/// The project whose flag definitions the request may read: a project secret key's, or
/// a personal key's when its scopes allow [`FEED_SCOPE`].
pub fn feed_reader(
    app: &App,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Result<Arc<Project>, ApiError> {
    match identify(app, headers, peer)? {
        Holder::Secret(project) => Ok(project),
        Holder::Personal(project, caller) => {
            require(&caller, FEED_SCOPE)?;
            Ok(project)
        }
    }
}

/// A 403 in PostHog's words unless the caller's key holds `scope`.
pub fn require(caller: &Caller, scope: &'static str) -> Result<(), ApiError> {
    if caller.allows(scope) {
        Ok(())
    } else {
        Err(ApiError::MissingScope(scope))
    }
}

#[cfg(test)]
#[path = "tests/personal.rs"]
mod tests;
