//! The one place where an error becomes an HTTP status and a JSON body
//! `{"type", "code", "detail", "attr"}`, in the shape PostHog's clients read.
//! Bodies say what was wrong with the request and never anything about internals.

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
    /// A query parameter that does not parse.
    BadQuery(String),
    /// A storage read failed; the body says no more than that.
    Storage,
    /// A request's work failed unexpectedly (a background task did not finish).
    Internal,
    /// A PostHog feature whose data flagpost does not keep (`http::not_kept`).
    NotKept(&'static str),
    /// A flag asked for as remote config that is not marked `is_remote_configuration`.
    NotRemoteConfig,
    /// The v1 capture path answers its errors in PostHog's v1 shape.
    CaptureV1(super::capture_v1::Error),
}

/// Why a decide request is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecideError {
    MissingKey,
    InvalidKey,
    MissingDistinctId,
    /// The body is not a JSON object of the expected shape.
    InvalidBody(&'static str),
}

impl std::fmt::Display for DecideError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecideError::MissingKey => f.write_str("API key is missing: send api_key or token"),
            DecideError::InvalidKey => f.write_str("API key is not valid"),
            DecideError::MissingDistinctId => f.write_str("distinct_id is required"),
            DecideError::InvalidBody(why) => write!(f, "invalid request body: {why}"),
        }
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

impl From<super::capture_v1::Error> for ApiError {
    fn from(e: super::capture_v1::Error) -> Self {
        ApiError::CaptureV1(e)
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
            ApiError::Forbidden => (
                StatusCode::FORBIDDEN,
                AUTHENTICATION,
                "permission_denied",
                "this key cannot read this project".into(),
            ),
            ApiError::BadQuery(detail) => (
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
            ApiError::NotRemoteConfig => (
                StatusCode::NOT_FOUND,
                VALIDATION,
                "not_found",
                "this flag is not a remote config flag: set \"is_remote_configuration\": true \
                 on it to serve its payload here"
                    .into(),
            ),
            ApiError::CaptureV1(e) => (e.status(), VALIDATION, e.tag(), e.description()),
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
        }
    }

    pub fn into_response(self) -> Response<Body> {
        let (status, kind, code, detail) = match self {
            ApiError::CaptureV1(e) => return e.into_response(),
            other => other.parts(),
        };
        let mut r = response::json(
            status,
            &json!({"type": kind, "code": code, "detail": detail, "attr": null}),
        );
        if status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECONDS));
        }
        r
    }
}
