//! The console's files, compiled into the binary: one HTML page, its stylesheet, one
//! script per page of the console, and the vendored chart library. Nothing is fetched
//! from elsewhere, so the console works offline and needs no build step.

use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Response, StatusCode};

use super::super::error::ApiError;
use super::super::response::{self, Body};

/// (path under `/console`, content type, bytes).
const FILES: &[(&str, &str, &[u8])] = &[
    ("/", HTML, include_bytes!("static/index.html")),
    (
        "/assets/console.css",
        CSS,
        include_bytes!("static/console.css"),
    ),
    (
        "/assets/console.js",
        JS,
        include_bytes!("static/console.js"),
    ),
    ("/assets/flags.js", JS, include_bytes!("static/flags.js")),
    (
        "/assets/flag_page.js",
        JS,
        include_bytes!("static/flag_page.js"),
    ),
    (
        "/assets/flag_form.js",
        JS,
        include_bytes!("static/flag_form.js"),
    ),
    ("/assets/events.js", JS, include_bytes!("static/events.js")),
    (
        "/assets/persons.js",
        JS,
        include_bytes!("static/persons.js"),
    ),
    ("/assets/health.js", JS, include_bytes!("static/health.js")),
    (
        "/assets/insights.js",
        JS,
        include_bytes!("static/insights.js"),
    ),
    (
        "/assets/uPlot.iife.min.js",
        JS,
        include_bytes!("static/vendor/uPlot.iife.min.js"),
    ),
    (
        "/assets/uPlot.min.css",
        CSS,
        include_bytes!("static/vendor/uPlot.min.css"),
    ),
    (
        "/assets/favicon.svg",
        "image/svg+xml",
        include_bytes!("static/favicon.svg"),
    ),
];

const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";

/// The file at `path`; `/index.html` is the page too.
pub fn serve(path: &str, request: &HeaderMap) -> Result<Response<Body>, ApiError> {
    let path = if path == "/index.html" { "/" } else { path };
    let (_, content_type, bytes) = FILES
        .iter()
        .find(|(p, _, _)| *p == path)
        .ok_or(ApiError::NotFound)?;
    // The binary's version names the files' content: a browser revalidates once per
    // version and is told 304 until the binary changes.
    let etag = concat!("\"", env!("CARGO_PKG_VERSION"), "-console\"");
    let fresh = request
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag) && !cfg!(debug_assertions));
    let mut r = if fresh {
        response::empty(StatusCode::NOT_MODIFIED)
    } else {
        response::with_type(StatusCode::OK, content_type, *bytes)
    };
    let h = r.headers_mut();
    h.insert(header::ETAG, HeaderValue::from_static(etag));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_served_with_its_type() {
        for (path, content_type, bytes) in FILES {
            let r = serve(path, &HeaderMap::new()).unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{path}");
            assert_eq!(r.headers()[header::CONTENT_TYPE], *content_type, "{path}");
            assert!(!bytes.is_empty(), "{path}");
        }
        assert!(matches!(
            serve("/assets/nope.js", &HeaderMap::new()),
            Err(ApiError::NotFound)
        ));
    }
}
