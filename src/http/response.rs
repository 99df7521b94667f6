//! Building responses: JSON bodies and the CORS headers browsers need.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Response, StatusCode};

pub type Body = Full<Bytes>;

pub fn json(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    with_type(status, "application/json", bytes)
}

pub fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    with_type(
        status,
        "text/plain; charset=utf-8",
        body.as_bytes().to_vec(),
    )
}

pub fn with_type(status: StatusCode, content_type: &'static str, body: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

pub fn empty(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = status;
    r
}

/// Allow the calling page's origin, with credentials, as PostHog's service does.
pub fn add_cors(request: &HeaderMap, response: &mut Response<Body>) {
    let h = response.headers_mut();
    match request.get(header::ORIGIN) {
        Some(origin) => {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
            h.insert(
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
            h.append(header::VARY, HeaderValue::from_static("Origin"));
        }
        None => {
            h.insert(
                header::ACCESS_CONTROL_ALLOW_ORIGIN,
                HeaderValue::from_static("*"),
            );
        }
    }
}

/// The answer to a browser's preflight.
pub fn preflight(request: &HeaderMap) -> Response<Body> {
    let mut r = empty(StatusCode::OK);
    add_cors(request, &mut r);
    let h = r.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    let allow_headers = request
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static("content-type"));
    h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, allow_headers);
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("86400"),
    );
    r
}
