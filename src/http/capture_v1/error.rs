//! The errors of the v1 capture path and their answers, in the shape PostHog's v1
//! capture gives them: `{"error": <tag>, "error_description", "error_uri"}` with its
//! status codes, plus the `Accept` and `Accept-Encoding` headers it sends on every
//! error. The endpoint answers these itself ([`Error::into_response`]).

use hyper::header::{HeaderValue, ACCEPT, ACCEPT_ENCODING, RETRY_AFTER};
use hyper::{Response, StatusCode};
use serde_json::json;

use crate::capture::v1 as model;
use crate::http::response::{self, Body};

/// Where every error points, as in PostHog.
const ERROR_URI: &str = "https://posthog.com/docs/api";
/// The encodings the endpoint accepts, advertised on every error.
const ACCEPTED_ENCODINGS: &str = "gzip, deflate, br, zstd";
/// Seconds to wait before retrying a 5xx or an event answered `retry`.
pub const RETRY_AFTER_SECONDS: &str = "1";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    MissingAuthorization,
    /// The standard names, in the order PostHog checks them.
    MissingRequiredHeaders(Vec<&'static str>),
    InvalidHeaderValue(String),
    /// A key of the wrong shape, or one that is no project's.
    InvalidApiToken,
    UnsupportedContentType(String),
    UnsupportedEncoding(String),
    EmptyBody,
    RequestDecoding,
    RequestParsing,
    PayloadTooLarge(String),
    RequestTimeout,
    Batch(model::Error),
    ServiceUnavailable,
    Internal,
}

impl Error {
    pub fn tag(&self) -> &'static str {
        use model::Error as B;
        match self {
            Error::MissingAuthorization => "missing_authorization",
            Error::MissingRequiredHeaders(_) => "missing_required_headers",
            Error::InvalidHeaderValue(_) => "invalid_header_value",
            Error::InvalidApiToken => "invalid_api_token",
            Error::UnsupportedContentType(_) => "unsupported_content_type",
            Error::UnsupportedEncoding(_) => "unsupported_encoding",
            Error::EmptyBody => "empty_body",
            Error::RequestDecoding => "request_decoding_error",
            Error::RequestParsing => "request_parsing_error",
            Error::PayloadTooLarge(_) => "payload_too_large",
            Error::RequestTimeout => "request_timeout",
            Error::Batch(B::EmptyBatch) => "empty_batch",
            Error::Batch(B::InvalidCreatedAt(_)) => "invalid_batch",
            Error::Batch(B::MissingEventUuid) => "missing_event_uuid",
            Error::Batch(B::InvalidEventUuid(_)) => "invalid_event_uuid",
            Error::Batch(B::DuplicateEventUuid(_)) => "duplicate_event_uuid",
            Error::ServiceUnavailable => "service_unavailable",
            Error::Internal => "internal_error",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Error::MissingAuthorization | Error::InvalidApiToken => StatusCode::UNAUTHORIZED,
            Error::UnsupportedContentType(_) | Error::UnsupportedEncoding(_) => {
                StatusCode::UNSUPPORTED_MEDIA_TYPE
            }
            Error::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Error::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            Error::ServiceUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Error::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    pub fn description(&self) -> String {
        use model::Error as B;
        match self {
            Error::MissingAuthorization => "request is missing the Authorization header".into(),
            Error::MissingRequiredHeaders(names) => {
                format!("request is missing required headers: {names:?}")
            }
            Error::InvalidHeaderValue(why) => format!("invalid header value: {why}"),
            Error::InvalidApiToken => "The provided API token is not valid.".into(),
            Error::UnsupportedContentType(v) => format!("unsupported content type: {v}"),
            Error::UnsupportedEncoding(v) => format!("unsupported content encoding: {v}"),
            Error::EmptyBody => "request body is empty".into(),
            Error::RequestDecoding => "Failed to decode request body.".into(),
            Error::RequestParsing => "Failed to parse request body.".into(),
            Error::PayloadTooLarge(why) => format!("payload too large: {why}"),
            Error::RequestTimeout => "request timed out".into(),
            Error::Batch(B::EmptyBatch) => "request batch is empty".into(),
            Error::Batch(B::InvalidCreatedAt(v)) => {
                format!("invalid batch: created_at is not valid RFC 3339: {v}")
            }
            Error::Batch(B::MissingEventUuid) => "event submitted without a uuid".into(),
            Error::Batch(B::InvalidEventUuid(v)) => format!("invalid event uuid: {v}"),
            Error::Batch(B::DuplicateEventUuid(v)) => format!("duplicate event uuid: {v}"),
            Error::ServiceUnavailable => "Service Unavailable".into(),
            Error::Internal => "Internal Server Error".into(),
        }
    }

    pub fn into_response(self) -> Response<Body> {
        let status = self.status();
        let mut r = response::json(
            status,
            &json!({
                "error": self.tag(),
                "error_description": self.description(),
                "error_uri": ERROR_URI,
            }),
        );
        let headers = r.headers_mut();
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        headers.insert(
            ACCEPT_ENCODING,
            HeaderValue::from_static(ACCEPTED_ENCODINGS),
        );
        if status.is_server_error() {
            headers.insert(RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECONDS));
        }
        r
    }
}

impl From<model::Error> for Error {
    fn from(e: model::Error) -> Self {
        Error::Batch(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_tags() {
        for (e, status, tag) in [
            (Error::MissingAuthorization, 401, "missing_authorization"),
            (Error::InvalidApiToken, 401, "invalid_api_token"),
            (Error::RequestParsing, 400, "request_parsing_error"),
            (
                Error::UnsupportedEncoding("lz4".into()),
                415,
                "unsupported_encoding",
            ),
            (Error::PayloadTooLarge("x".into()), 413, "payload_too_large"),
            (Error::Batch(model::Error::EmptyBatch), 400, "empty_batch"),
            (Error::ServiceUnavailable, 503, "service_unavailable"),
        ] {
            assert_eq!((e.status().as_u16(), e.tag()), (status, tag));
        }
        assert_eq!(
            Error::MissingRequiredHeaders(vec!["PostHog-Sdk-Info", "user-agent"]).description(),
            r#"request is missing required headers: ["PostHog-Sdk-Info", "user-agent"]"#
        );
    }
}
