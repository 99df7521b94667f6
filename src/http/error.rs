//! The one place where an error becomes an HTTP status and a JSON body
//! `{"type", "code", "detail", "attr"}`, in the shape PostHog's clients read.
//! Bodies say what was wrong with the request and never anything about internals.
//! The v1 capture path answers its refusals in PostHog's v1 shape instead, from
//! `capture_v1::error`.

use hyper::header::{HeaderValue, RETRY_AFTER};
use hyper::{Response, StatusCode};
use serde_json::json;

use super::response::{self, Body};
use super::{body, decode};
use crate::capture;
use crate::log::writer as wal;

/// Seconds a client should wait before retrying after a 503.
const RETRY_AFTER_SECONDS: &str = "5";

#[derive(Debug)]
pub enum ApiError {
    Capture(capture::Error),
    Decide(DecideError),
    Decode(decode::Error),
    Body(body::Error),
    Wal(wal::Error),
    NotFound,
    /// A resource of an existing endpoint that does not exist ("group").
    Missing(&'static str),
    MethodNotAllowed,
    /// The server is shutting down.
    Draining,
    /// The read API without a personal API key, or with a key that is not one.
    NotAuthenticated,
    /// A valid personal key of another project.
    Forbidden,
    /// A personal key whose scopes do not hold the one named (`feature_flag:write`).
    MissingScope(&'static str),
    /// A project secret key anywhere but the definitions feeds.
    SecretKeyElsewhere,
    /// A console request that may come from another site: its Origin is not the
    /// console's own, or it lacks the session's token. The reason is the body.
    CrossSite(&'static str),
    /// A console request without a live session, or a sign-in with a key that is not
    /// a personal key of any project.
    SignedOut(&'static str),
    /// A query parameter that does not parse.
    BadQuery(String),
    /// A query parameter that does not parse, named in `attr` as PostHog's API names
    /// the field at fault (`properties`).
    BadParam(&'static str, String),
    /// A storage read failed; the body says no more than that.
    Storage,
    /// A request's work failed unexpectedly (a background task did not finish).
    Internal,
    /// A PostHog feature whose data flagpost does not keep (`http::not_kept`).
    NotKept(&'static str),
    /// A flag asked for as remote config that does not exist or is not marked
    /// `is_remote_configuration`: an empty 404, as PostHog answers, so SDKs throw
    /// rather than hand an error body to the application as its configuration.
    NoRemoteConfig,
    /// A management API change refused or failed (`crate::manage`).
    Manage(crate::manage::Error),
    /// Too many failed authentications from this address; retry after the seconds.
    Throttled(u64),
    /// A management API body that is not JSON.
    ParseJson(String),
}

/// Why a decide request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    #[error("API key is missing: send api_key or token")]
    MissingKey,
    #[error("API key is not valid")]
    InvalidKey,
    #[error("distinct_id is required")]
    MissingDistinctId,
    /// The body is not a JSON object of the expected shape.
    #[error("invalid request body: {0}")]
    InvalidBody(&'static str),
}

/// Run a storage read on the blocking pool for a handler: a storage error is logged
/// with `who` (the read API, the console) and answered as [`ApiError::Storage`]; a read
/// that panicked is an [`ApiError::Internal`].
pub async fn storage_read<T: Send + 'static>(
    who: &'static str,
    f: impl FnOnce() -> Result<T, sled::Error> + Send + 'static,
) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "{who} storage error");
            Err(ApiError::Storage)
        }
        Err(_) => Err(ApiError::Internal),
    }
}

impl From<capture::Error> for ApiError {
    fn from(e: capture::Error) -> Self {
        ApiError::Capture(e)
    }
}

impl From<DecideError> for ApiError {
    fn from(e: DecideError) -> Self {
        ApiError::Decide(e)
    }
}

impl From<decode::Error> for ApiError {
    fn from(e: decode::Error) -> Self {
        ApiError::Decode(e)
    }
}

impl From<body::Error> for ApiError {
    fn from(e: body::Error) -> Self {
        ApiError::Body(e)
    }
}

impl From<wal::Error> for ApiError {
    fn from(e: wal::Error) -> Self {
        ApiError::Wal(e)
    }
}

const VALIDATION: &str = "validation_error";
const AUTHENTICATION: &str = "authentication_error";
const SERVER: &str = "server_error";
const INVALID_REQUEST: &str = "invalid_request";

impl ApiError {
    /// Status, error type, code and detail.
    fn parts(&self) -> (StatusCode, &'static str, &'static str, String) {
        use capture::Error as C;
        match self {
            ApiError::Capture(e) => {
                let (status, kind, code) = match e {
                    C::MissingKey => (StatusCode::UNAUTHORIZED, AUTHENTICATION, "missing_api_key"),
                    C::InvalidKey => (StatusCode::UNAUTHORIZED, AUTHENTICATION, "invalid_api_key"),
                    C::MixedKeys => (StatusCode::BAD_REQUEST, VALIDATION, "multiple_api_keys"),
                    C::EmptyBatch => (StatusCode::BAD_REQUEST, VALIDATION, "empty_batch"),
                    C::InvalidJson(_) | C::WrongType { .. } => {
                        (StatusCode::BAD_REQUEST, VALIDATION, "invalid_payload")
                    }
                };
                (status, kind, code, e.to_string())
            }
            ApiError::Decide(e) => {
                use DecideError as D;
                let (status, kind, code) = match e {
                    D::MissingKey => (StatusCode::UNAUTHORIZED, AUTHENTICATION, "missing_api_key"),
                    D::InvalidKey => (StatusCode::UNAUTHORIZED, AUTHENTICATION, "invalid_api_key"),
                    D::MissingDistinctId => {
                        (StatusCode::BAD_REQUEST, VALIDATION, "missing_distinct_id")
                    }
                    D::InvalidBody(_) => (StatusCode::BAD_REQUEST, VALIDATION, "invalid_payload"),
                };
                (status, kind, code, e.to_string())
            }
            ApiError::Decode(decode::Error::TooLarge) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                VALIDATION,
                "payload_too_large",
                decode::Error::TooLarge.to_string(),
            ),
            ApiError::Decode(e) => (
                StatusCode::BAD_REQUEST,
                VALIDATION,
                "invalid_payload",
                e.to_string(),
            ),
            ApiError::Body(body::Error::TooLarge) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                VALIDATION,
                "payload_too_large",
                "the request body is larger than the limit".into(),
            ),
            ApiError::Body(body::Error::Timeout) => (
                StatusCode::REQUEST_TIMEOUT,
                VALIDATION,
                "request_timeout",
                "the request body did not arrive in time".into(),
            ),
            ApiError::Body(body::Error::Broken) => (
                StatusCode::BAD_REQUEST,
                VALIDATION,
                "invalid_payload",
                "the request body could not be read".into(),
            ),
            ApiError::Body(body::Error::Overloaded) | ApiError::Wal(wal::Error::Overloaded) => (
                StatusCode::SERVICE_UNAVAILABLE,
                SERVER,
                "overloaded",
                "the server is overloaded; retry later".into(),
            ),
            ApiError::Wal(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                SERVER,
                "unavailable",
                "events could not be stored; retry later".into(),
            ),
            ApiError::Draining => (
                StatusCode::SERVICE_UNAVAILABLE,
                SERVER,
                "shutting_down",
                "the server is shutting down; retry later".into(),
            ),
            ApiError::Missing(what) => (
                StatusCode::NOT_FOUND,
                VALIDATION,
                "not_found",
                format!("no such {what}"),
            ),
            ApiError::NotAuthenticated => (
                StatusCode::UNAUTHORIZED,
                AUTHENTICATION,
                "not_authenticated",
                "send a personal API key of this project: Authorization: Bearer phx_...".into(),
            ),
            ApiError::CrossSite(why) => (
                StatusCode::FORBIDDEN,
                AUTHENTICATION,
                "cross_site",
                (*why).into(),
            ),
            ApiError::SignedOut(why) => (
                StatusCode::UNAUTHORIZED,
                AUTHENTICATION,
                "not_authenticated",
                (*why).into(),
            ),
            ApiError::Forbidden => (
                StatusCode::FORBIDDEN,
                AUTHENTICATION,
                "permission_denied",
                "this key cannot read this project".into(),
            ),
            ApiError::MissingScope(scope) => (
                StatusCode::FORBIDDEN,
                AUTHENTICATION,
                "permission_denied",
                format!("API key missing required scope '{scope}'"),
            ),
            ApiError::SecretKeyElsewhere => (
                StatusCode::FORBIDDEN,
                AUTHENTICATION,
                "permission_denied",
                "a project secret key (phs_) only reads flag definitions: \
                 /flags/definitions and /api/feature_flag/local_evaluation"
                    .into(),
            ),
            ApiError::BadQuery(detail) | ApiError::BadParam(_, detail) => (
                StatusCode::BAD_REQUEST,
                VALIDATION,
                "invalid_input",
                detail.clone(),
            ),
            ApiError::Storage => (
                StatusCode::INTERNAL_SERVER_ERROR,
                SERVER,
                "storage_error",
                "the data could not be read; try again".into(),
            ),
            ApiError::Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                SERVER,
                "internal_error",
                "the request could not be processed; try again".into(),
            ),
            ApiError::NotKept(feature) => (
                StatusCode::NOT_FOUND,
                VALIDATION,
                "not_kept",
                format!(
                    "flagpost does not keep {feature}; its remote config tells clients it is off"
                ),
            ),
            ApiError::NoRemoteConfig => (
                StatusCode::NOT_FOUND,
                VALIDATION,
                "not_found",
                "no remote config flag by that key or id".into(),
            ),
            ApiError::NotFound => (
                StatusCode::NOT_FOUND,
                VALIDATION,
                "not_found",
                "no such endpoint".into(),
            ),
            ApiError::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                VALIDATION,
                "method_not_allowed",
                "method not allowed on this endpoint".into(),
            ),
            ApiError::Manage(_) | ApiError::Throttled(_) | ApiError::ParseJson(_) => {
                let (status, kind, code, detail, _) = self.manage_parts().unwrap_or((
                    StatusCode::INTERNAL_SERVER_ERROR,
                    SERVER,
                    "internal_error",
                    String::new(),
                    None,
                ));
                (status, kind, code, detail)
            }
        }
    }

    /// The management API's errors, as PostHog's API (drf-exceptions-hog) writes them,
    /// with the field at fault in `attr`.
    fn manage_parts(
        &self,
    ) -> Option<(
        StatusCode,
        &'static str,
        &'static str,
        String,
        Option<&'static str>,
    )> {
        use crate::manage::Error as M;
        Some(match self {
            ApiError::Manage(M::Invalid { code, detail, attr }) => (
                StatusCode::BAD_REQUEST,
                VALIDATION,
                *code,
                detail.clone(),
                *attr,
            ),
            // PostHog's `Conflict` has no type of its own, which its handler writes as
            // `server_error`.
            ApiError::Manage(M::Conflict(detail)) => (
                StatusCode::CONFLICT,
                SERVER,
                "conflict",
                detail.clone(),
                None,
            ),
            ApiError::Manage(M::NotFound) => (
                StatusCode::NOT_FOUND,
                INVALID_REQUEST,
                "not_found",
                "Not found.".into(),
                None,
            ),
            ApiError::Manage(M::TooMany(n)) => (
                StatusCode::BAD_REQUEST,
                VALIDATION,
                "max_flags",
                format!(
                    "This project has {n} feature flags, the most it may have. Delete some first."
                ),
                None,
            ),
            ApiError::Manage(M::Io(e)) => {
                tracing::error!(error = %e, "management API: flags file unusable");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    SERVER,
                    "flags_file_unusable",
                    "the project's flags file could not be read or written; the server log says why".into(),
                    None,
                )
            }
            ApiError::Throttled(seconds) => (
                StatusCode::TOO_MANY_REQUESTS,
                "throttled_error",
                "throttled",
                format!(
                    "Request was throttled. Expected available in {seconds} second{}.",
                    if *seconds == 1 { "" } else { "s" }
                ),
                None,
            ),
            ApiError::ParseJson(e) => (
                StatusCode::BAD_REQUEST,
                INVALID_REQUEST,
                "parse_error",
                format!("JSON parse error - {e}"),
                None,
            ),
            _ => return None,
        })
    }

    pub fn into_response(self) -> Response<Body> {
        if let ApiError::NoRemoteConfig = self {
            return response::empty(StatusCode::NOT_FOUND);
        }
        let (status, kind, code, detail, attr) = match self.manage_parts() {
            Some(parts) => parts,
            None => {
                let (status, kind, code, detail) = self.parts();
                let attr = match &self {
                    ApiError::BadParam(attr, _) => Some(*attr),
                    _ => None,
                };
                (status, kind, code, detail, attr)
            }
        };
        let mut r = response::json(
            status,
            &json!({"type": kind, "code": code, "detail": detail, "attr": attr}),
        );
        if status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECONDS));
        }
        if let ApiError::Throttled(seconds) = self {
            if let Ok(v) = HeaderValue::from_str(&seconds.to_string()) {
                r.headers_mut().insert(RETRY_AFTER, v);
            }
        }
        r
    }
}
