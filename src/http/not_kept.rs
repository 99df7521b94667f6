//! The paths a PostHog host answers that flagpost deliberately does not keep data
//! for, each with a documented answer instead of a bare 404: an empty list where the
//! feature costs nothing to answer (web experiments, product tours: there are none),
//! else a JSON error naming the feature (session replay, console logs, SDK metrics,
//! conversations, messaging). The client config turns these
//! features off, so the official clients do not send to them; the answers are for
//! clients configured by hand. LLM analytics batches (`/i/v0/ai/batch/`) are ordinary
//! events and go to the intake with the rest.

use hyper::{Response, StatusCode};
use serde_json::json;

use super::error::ApiError;
use super::response::{self, Body};
use crate::app::App;

/// A path with a deliberate answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// `/api/web_experiments/?token=`: `{"experiments": []}`.
    WebExperiments,
    /// `/api/product_tours/?token=`: `{"product_tours": []}`.
    ProductTours,
    /// Anything else listed in [`of`]: 404 naming the feature.
    NotKept(&'static str),
}

impl Path {
    pub fn label(self) -> &'static str {
        match self {
            Path::WebExperiments => "web_experiments",
            Path::ProductTours => "product_tours",
            Path::NotKept(_) => "not_kept",
        }
    }
}

/// Path prefixes of features flagpost does not keep, with the feature's name.
const NOT_KEPT: &[(&str, &str)] = &[
    ("/s", "session replay"),
    ("/i/v1/logs", "logs"),
    ("/i/v1/metrics", "SDK metrics"),
    ("/api/conversations", "conversations"),
    ("/api/projects/@current/messaging", "messaging"),
];

/// Which deliberate answer a path gets, if any. Prefixes match whole segments.
pub fn of(path: &str) -> Option<Path> {
    let trimmed = path.strip_suffix('/').unwrap_or(path);
    match trimmed {
        "/api/web_experiments" => return Some(Path::WebExperiments),
        "/api/product_tours" => return Some(Path::ProductTours),
        _ => {}
    }
    NOT_KEPT.iter().find_map(|(prefix, feature)| {
        let rest = path.strip_prefix(prefix)?;
        (rest.is_empty() || rest.starts_with('/')).then_some(Path::NotKept(feature))
    })
}

pub fn handle(app: &App, path: Path, query: Option<&str>) -> Result<Response<Body>, ApiError> {
    let listing = match path {
        Path::NotKept(feature) => return Err(ApiError::NotKept(feature)),
        Path::WebExperiments => "experiments",
        Path::ProductTours => "product_tours",
    };
    // Public like surveys: the project key in `token` names the project.
    let token = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned())
        .ok_or(super::error::DecideError::MissingKey)?;
    super::project_key::project_of(app, &token)?;
    Ok(response::json(StatusCode::OK, &json!({ listing: [] })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(of("/s/"), Some(Path::NotKept("session replay")));
        assert_eq!(of("/s"), Some(Path::NotKept("session replay")));
        assert_eq!(of("/i/v1/logs"), Some(Path::NotKept("logs")));
        assert_eq!(
            of("/api/conversations/v1/widget/message"),
            Some(Path::NotKept("conversations"))
        );
        assert_eq!(of("/api/web_experiments/"), Some(Path::WebExperiments));
        assert_eq!(of("/api/product_tours"), Some(Path::ProductTours));
        assert_eq!(of("/static/x.js"), None);
        assert_eq!(of("/search"), None);
        assert_eq!(of("/i/v1/logsx"), None);
        // The v1 capture format is kept: an intake path of its own.
        assert_eq!(of("/i/v1/analytics/events"), None);
        assert_eq!(of("/i/v1/analytics/events/"), None);
    }
}
