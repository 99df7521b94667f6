//! Who a personal key is, as PostHog's API clients ask before anything else (PostHog's
//! agent toolkit and MCP tools read the key's scopes and project from these):
//! `/api/personal_api_keys/@current` and `/api/users/@me/`. flagpost has no user
//! accounts or organizations: each key stands for a user of its own, named by its
//! label, in one organization that holds every project, and is scoped to its one
//! project. Its scopes are the PostHog scopes of what flagpost serves a key.

use std::net::SocketAddr;

use hyper::{HeaderMap, Response, StatusCode};
use serde_json::json;
use uuid::Uuid;

use super::error::ApiError;
use super::response::{self, Body};
use crate::app::App;
use crate::projects::{hash_key, mask_key};

/// The PostHog scopes a key listed without scopes is described with: those of the
/// endpoints it reaches here whose PostHog scope names nothing else, so an agent that
/// picks its tools by the key's scopes (PostHog's agent toolkit) offers only tools
/// flagpost serves. Such a key is let in everywhere whatever this says: events
/// (`query:read`, which also names PostHog's query API) and `/api/users/@me`
/// (`user:read`, which also names its organizations) too.
pub const SCOPES: &[&str] = &[
    "feature_flag:write",
    "cohort:write",
    "activity_log:read",
    "person:read",
    "group:read",
];

/// What `/api/users/@me` takes, as PostHog's user viewset does; a key's own
/// description (`@current`) takes no scope, as in PostHog.
pub const ME_SCOPE: &str = "user:read";

/// Which of the two paths, trailing slash optional.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    CurrentKey,
    Me,
}

pub fn parse_path(path: &str) -> Option<Path> {
    match path.strip_suffix('/').unwrap_or(path) {
        "/api/personal_api_keys/@current" => Some(Path::CurrentKey),
        "/api/users/@me" => Some(Path::Me),
        _ => None,
    }
}

/// The one organization: the same id on every server, as nothing distinguishes them.
fn organization_id() -> Uuid {
    Uuid::new_v5(&Uuid::NAMESPACE_URL, b"flagpost:organization")
}

pub fn handle(
    app: &App,
    path: Path,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Result<Response<Body>, ApiError> {
    let (project, caller) = super::personal::authenticate(app, headers, peer)?;
    if path == Path::Me {
        super::personal::require(&caller, ME_SCOPE)?;
    }
    let key = super::personal::personal_key(headers)?;
    // Stable for the key, and telling nothing about it.
    let id = Uuid::new_v5(&organization_id(), hash_key(key).as_bytes()).to_string();
    let organization = organization_id().to_string();
    let body = match path {
        Path::CurrentKey => json!({
            "id": id,
            "label": caller.label,
            "value": null,
            "mask_value": mask_key(key),
            "created_at": null,
            "last_used_at": null,
            "user_id": null,
            "scopes": caller.scopes.as_deref().map_or_else(|| json!(SCOPES), |s| json!(s)),
            "scoped_teams": [project.id],
            "scoped_organizations": [],
        }),
        Path::Me => json!({
            "uuid": id,
            "distinct_id": id,
            "first_name": caller.label,
            "last_name": "",
            "email": null,
            "is_staff": false,
            "team": {
                "id": project.id,
                "project_id": project.id,
                "organization": organization,
                "api_token": project.api_key,
                "name": project.name,
            },
            "organization": {"id": organization, "name": "flagpost"},
            "organizations": [{"id": organization, "name": "flagpost"}],
        }),
    };
    Ok(response::json(StatusCode::OK, &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(
            parse_path("/api/personal_api_keys/@current"),
            Some(Path::CurrentKey)
        );
        assert_eq!(parse_path("/api/users/@me/"), Some(Path::Me));
        assert_eq!(parse_path("/api/users/@me/x/"), None);
        assert_eq!(parse_path("/api/personal_api_keys/"), None);
    }
}
