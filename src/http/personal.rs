//! Authentication by personal API key, the one path every endpoint that takes one goes
//! through (the read API, the flag management API, the definitions feed and remote
//! config payloads), so the limit on failed attempts (`manage::FailedAuth`) covers all
//! of them alike: a key guessed against one endpoint costs the same tries as against
//! another.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::header::AUTHORIZATION;
use hyper::HeaderMap;

use super::error::ApiError;
use crate::app::App;
use crate::projects::{Caller, Project, PERSONAL_KEY_PREFIX};

/// The personal API key of `Authorization: Bearer phx_...`; anything else is not one.
pub fn personal_key(headers: &HeaderMap) -> Result<&str, ApiError> {
    headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|k| k.starts_with(PERSONAL_KEY_PREFIX))
        .ok_or(ApiError::NotAuthenticated)
}

/// The project whose personal key the request carries, and who the key says the caller
/// is. Every attempt takes a token of the address's failed-authentication limit before
/// its key is looked at (so an address out of tokens gets 429, whatever it sends); a
/// known key gives it back, whatever the caller then asks for (a key of another project
/// gets 403 from the caller's check), so only a missing or unknown key costs one.
pub fn authenticate(
    app: &App,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Result<(Arc<Project>, Caller), ApiError> {
    let ip = super::client_ip(app, peer, headers);
    let attempt = app.failed_auth.take(ip).map_err(ApiError::Throttled)?;
    let found = personal_key(headers).and_then(|key| {
        let projects = app.projects.load();
        projects
            .personal_key(key)
            .map(|(project, caller)| (project.clone(), caller))
            .ok_or(ApiError::NotAuthenticated)
    })?;
    attempt.passed();
    Ok(found)
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
