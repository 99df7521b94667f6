//! One conditional poll of a project's flag definitions, and what its answer means.
//! PostHog's current endpoint is `/flags/definitions`; an older self-hosted PostHog
//! only has `/api/feature_flag/local_evaluation`, which a 404 or 405 on the first
//! sends the sync to for good. Both take `?token=<project api key>&send_cohorts` and
//! the project's secret (or personal) key as a bearer token, and answer a matching
//! `If-None-Match` with a 304 (its weak ETag is sent back exactly as received).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{ACCEPT, AUTHORIZATION, ETAG, IF_NONE_MATCH};
use hyper::{Method, Request};

use crate::edge::client::{Answer, Client, Error};

/// How long one poll may take, connection and whole body included: posthog-python's
/// timeout for the same request.
pub const POLL_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest definitions body accepted: far above any real project's (a few MB for
/// thousands of flags), low enough that a broken upstream cannot exhaust memory.
pub const MAX_DEFINITIONS_BYTES: usize = 64 << 20;

/// Which of upstream's two feeds a project is polled on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Definitions,
    LocalEvaluation,
}

impl Endpoint {
    /// The `endpoint` label of `flagpost_upstream_requests_total`.
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Definitions => "flags_definitions",
            Endpoint::LocalEvaluation => "local_evaluation",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Endpoint::Definitions => "/flags/definitions",
            Endpoint::LocalEvaluation => "/api/feature_flag/local_evaluation",
        }
    }
}

/// What a poll's answer calls for.
#[derive(Debug)]
pub enum Polled {
    /// 200: new definitions, with their ETag if upstream sent one.
    Changed { body: Bytes, etag: Option<String> },
    /// 304: what the edge holds is current (upstream may send the ETag again).
    Unchanged { etag: Option<String> },
    /// 404 or 405 on `/flags/definitions`: an upstream without it.
    NoSuchEndpoint,
    /// 402: the project's flag quota is used up.
    QuotaLimited,
    /// Anything else (401, 403, 429, 5xx, no answer): keep the rules, back off.
    Failed {
        why: String,
        retry_after: Option<Duration>,
    },
}

/// The `status` label for an exchange's outcome.
pub fn status_label(result: &Result<Answer, Error>) -> String {
    match result {
        Ok(answer) => answer.status.as_u16().to_string(),
        Err(e) => e.label().to_string(),
    }
}

/// Ask upstream for `token`'s definitions.
pub async fn poll(
    client: &Client,
    endpoint: Endpoint,
    token: &str,
    key: &str,
    etag: Option<&str>,
) -> Result<Answer, Error> {
    let query: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("token", token)
        .finish();
    let uri = format!("{}?{query}&send_cohorts", endpoint.path());
    let mut request = Request::builder()
        .method(Method::GET)
        .uri(uri)
        .header(ACCEPT, "application/json")
        .header(AUTHORIZATION, format!("Bearer {key}"));
    if let Some(etag) = etag {
        request = request.header(IF_NONE_MATCH, etag);
    }
    let request = request
        .body(Full::new(Bytes::new()))
        .map_err(|e| Error::Request(format!("definitions request: {e}")))?;
    client
        .send(request, POLL_TIMEOUT, MAX_DEFINITIONS_BYTES)
        .await
}

/// What `result`, the answer to a poll of `endpoint`, calls for.
pub fn classify(endpoint: Endpoint, result: Result<Answer, Error>) -> Polled {
    let answer = match result {
        Ok(answer) => answer,
        Err(e) => {
            return Polled::Failed {
                why: e.to_string(),
                retry_after: None,
            }
        }
    };
    let etag = answer
        .headers
        .get(ETAG)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    match answer.status.as_u16() {
        200 => Polled::Changed {
            body: answer.body,
            etag,
        },
        304 => Polled::Unchanged { etag },
        402 => Polled::QuotaLimited,
        404 | 405 if endpoint == Endpoint::Definitions => Polled::NoSuchEndpoint,
        _ => Polled::Failed {
            why: crate::edge::answer::reason(&answer),
            retry_after: answer.retry_after(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::StatusCode;

    fn answer(status: u16, headers: &[(&str, &str)], body: &str) -> Result<Answer, Error> {
        let mut map = hyper::HeaderMap::new();
        for (k, v) in headers {
            map.insert(
                hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        Ok(Answer {
            status: StatusCode::from_u16(status).unwrap(),
            headers: map,
            body: Bytes::from(body.to_string()),
        })
    }

    #[test]
    fn answers_classified() {
        let d = Endpoint::Definitions;
        match classify(d, answer(200, &[("etag", "W/\"a\"")], "{}")) {
            Polled::Changed { body, etag } => {
                assert_eq!(&body[..], b"{}");
                assert_eq!(etag.as_deref(), Some("W/\"a\""));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            classify(d, answer(304, &[], "")),
            Polled::Unchanged { etag: None }
        ));
        assert!(matches!(
            classify(d, answer(402, &[], "")),
            Polled::QuotaLimited
        ));
        assert!(matches!(
            classify(d, answer(405, &[], "")),
            Polled::NoSuchEndpoint
        ));
        // The fallback endpoint missing too is a failure, not a loop between the two.
        assert!(matches!(
            classify(Endpoint::LocalEvaluation, answer(404, &[], "")),
            Polled::Failed { .. }
        ));
        match classify(d, answer(429, &[("retry-after", "9")], "")) {
            Polled::Failed { retry_after, .. } => {
                assert_eq!(retry_after, Some(Duration::from_secs(9)))
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            classify(d, Err(Error::Timeout(POLL_TIMEOUT))),
            Polled::Failed { .. }
        ));
    }
}
