//! The headers of a v1 capture request, checked in the order PostHog's capture
//! checks them: the `Authorization` header first (401), then every required header
//! at once (400), then each one's value.

use hyper::header::{AUTHORIZATION, CONTENT_ENCODING, CONTENT_TYPE, USER_AGENT};
use hyper::HeaderMap;
use uuid::Uuid;

use super::error::Error;
use crate::capture::timestamp;
use crate::http::inflate::Encoding;
use crate::projects::key_shape_is_valid;

pub const SDK_INFO: &str = "PostHog-Sdk-Info";
pub const ATTEMPT: &str = "PostHog-Attempt";
pub const REQUEST_ID: &str = "PostHog-Request-Id";
pub const REQUEST_TIMESTAMP: &str = "PostHog-Request-Timestamp";

/// Every request carries these, named as PostHog names them in its answer.
const REQUIRED: [&str; 6] = [
    SDK_INFO,
    ATTEMPT,
    REQUEST_ID,
    REQUEST_TIMESTAMP,
    "content-type",
    "user-agent",
];

/// What the headers say.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    /// The project key from `Authorization: Bearer <key>`, trimmed.
    pub key: String,
    pub encoding: Option<Encoding>,
    /// `PostHog-Request-Timestamp` in unix milliseconds: the client's clock when it
    /// sent, what clock-skew correction compares the event times with.
    pub sent_at_ms: i64,
    pub sdk_info: String,
}

pub fn read(headers: &HeaderMap) -> Result<Request, Error> {
    if !headers.contains_key(AUTHORIZATION) {
        return Err(Error::MissingAuthorization);
    }
    let missing: Vec<&'static str> = REQUIRED
        .into_iter()
        .filter(|name| !headers.contains_key(*name))
        .collect();
    if !missing.is_empty() {
        return Err(Error::MissingRequiredHeaders(missing));
    }
    let auth = text(headers, AUTHORIZATION.as_str())?;
    let key = match auth.get(..7) {
        Some(scheme) if auth.len() > 7 && scheme.eq_ignore_ascii_case("Bearer ") => {
            auth[7..].trim()
        }
        _ => {
            return Err(Error::InvalidHeaderValue(
                "Authorization must use Bearer scheme".into(),
            ))
        }
    };
    if !key_shape_is_valid(key) || key.contains('\0') {
        return Err(Error::InvalidApiToken);
    }
    let content_type = text(headers, CONTENT_TYPE.as_str())?;
    let mime = content_type.split(';').next().unwrap_or("").trim();
    if !mime.eq_ignore_ascii_case("application/json") {
        return Err(Error::UnsupportedContentType(content_type.into()));
    }
    let encoding = match headers.get(CONTENT_ENCODING) {
        None => None,
        Some(v) => {
            let v = v.to_str().map_err(|_| {
                Error::InvalidHeaderValue(
                    "Content-Encoding contains non-visible ASCII characters".into(),
                )
            })?;
            Some(Encoding::from_header(v).ok_or_else(|| Error::UnsupportedEncoding(v.into()))?)
        }
    };
    let request_id = text(headers, REQUEST_ID)?;
    Uuid::parse_str(request_id).map_err(|_| {
        Error::InvalidHeaderValue(format!("{REQUEST_ID} is not a valid UUID: {request_id}"))
    })?;
    let attempt = text(headers, ATTEMPT)?;
    attempt
        .parse::<u32>()
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| {
            Error::InvalidHeaderValue(format!("{ATTEMPT} must be a positive integer: {attempt}"))
        })?;
    let sent_at = text(headers, REQUEST_TIMESTAMP)?;
    let sent_at_ms = timestamp::parse_rfc3339_ms(sent_at).ok_or_else(|| {
        Error::InvalidHeaderValue(format!(
            "{REQUEST_TIMESTAMP} is not valid RFC 3339: {sent_at}"
        ))
    })?;
    text(headers, USER_AGENT.as_str())?;
    let sdk_info = text(headers, SDK_INFO)?.to_owned();
    Ok(Request {
        key: key.to_owned(),
        encoding,
        sent_at_ms,
        sdk_info,
    })
}

/// A header known to be present, as text.
fn text<'h>(headers: &'h HeaderMap, name: &str) -> Result<&'h str, Error> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            Error::InvalidHeaderValue(format!("{name} contains non-visible ASCII characters"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn valid() -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("authorization", "Bearer phc_key"),
            (SDK_INFO, "posthog-rs/0.30.0"),
            (ATTEMPT, "1"),
            (REQUEST_ID, "0190f7b4-6a36-7c5d-8b8e-4c6a2d5e9f01"),
            (REQUEST_TIMESTAMP, "2023-11-14T22:13:20+00:00"),
            ("content-type", "application/json"),
            ("user-agent", "posthog-rs/0.30.0"),
        ] {
            h.insert(k, HeaderValue::from_static(v));
        }
        h
    }

    fn with(name: &'static str, value: &'static str) -> Result<Request, Error> {
        let mut h = valid();
        h.insert(name, HeaderValue::from_static(value));
        read(&h)
    }

    #[test]
    fn a_valid_request() {
        assert_eq!(
            read(&valid()),
            Ok(Request {
                key: "phc_key".into(),
                encoding: None,
                sent_at_ms: 1_700_000_000_000,
                sdk_info: "posthog-rs/0.30.0".into(),
            })
        );
        let r = with("authorization", "bEaReR   phc_key  ").unwrap();
        assert_eq!(r.key, "phc_key");
        let r = with("content-encoding", "ZSTD").unwrap();
        assert_eq!(r.encoding, Some(Encoding::Zstd));
        assert!(with("content-type", "Application/JSON; charset=utf-8").is_ok());
    }

    #[test]
    fn refusals_in_order() {
        let mut h = valid();
        h.remove("authorization");
        h.remove("user-agent");
        assert_eq!(read(&h), Err(Error::MissingAuthorization));
        let mut h = valid();
        h.remove("user-agent");
        h.remove(SDK_INFO);
        assert_eq!(
            read(&h),
            Err(Error::MissingRequiredHeaders(vec![SDK_INFO, "user-agent"]))
        );
        assert_eq!(
            with("authorization", "Basic abc"),
            Err(Error::InvalidHeaderValue(
                "Authorization must use Bearer scheme".into()
            ))
        );
        assert_eq!(
            with("authorization", "Bearer phx_personal"),
            Err(Error::InvalidApiToken)
        );
        assert_eq!(
            with("authorization", "Bearer  "),
            Err(Error::InvalidApiToken)
        );
        assert_eq!(
            with("content-type", "text/plain"),
            Err(Error::UnsupportedContentType("text/plain".into()))
        );
        assert_eq!(
            with("content-encoding", "lz4"),
            Err(Error::UnsupportedEncoding("lz4".into()))
        );
        assert!(matches!(
            with(REQUEST_ID, "nope"),
            Err(Error::InvalidHeaderValue(_))
        ));
        assert!(matches!(
            with(ATTEMPT, "0"),
            Err(Error::InvalidHeaderValue(_))
        ));
        assert!(matches!(
            with(REQUEST_TIMESTAMP, "yesterday"),
            Err(Error::InvalidHeaderValue(_))
        ));
    }
}
