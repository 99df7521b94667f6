//! The v1 capture endpoint (`POST /i/v1/analytics/events`, with or without the
//! trailing slash), as PostHog's capture serves it: the project key in
//! `Authorization: Bearer`, a JSON batch compressed by `Content-Encoding` (gzip,
//! deflate, br, zstd or none), and a 200 that reports each event by uuid. Events go
//! through the same pipeline as `/batch/` (see [`crate::capture::v1`]) and the same
//! log, and the 200 comes only once they are on disk.

pub mod error;
mod headers;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, RETRY_AFTER};
use hyper::{Request, Response, StatusCode};
use serde_json::{Map, Value};

use super::body;
use super::capture::INLINE_DECODE_BYTES;
use super::error::ApiError;
use super::inflate::{self, Encoding};
use super::response::{self, Body};
use crate::app::App;
use crate::capture::v1::{self as model, Checked, Status};
use crate::capture::Context;
use crate::support::memory::Reservation;
pub use error::Error;

/// Answers the request. Refusals are answered here, in v1's shape, so `http::error`
/// need not know this endpoint's errors; only a server shutting down answers as every
/// endpoint does.
pub async fn handle(
    app: &Arc<App>,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Result<Response<Body>, ApiError> {
    match accept(app, req, peer).await {
        Ok(response) => Ok(response),
        Err(Stop::Refused(e)) => Ok(e.into_response()),
        Err(Stop::Draining) => Err(ApiError::Draining),
    }
}

/// Why a request was not taken.
enum Stop {
    Refused(Error),
    /// The heavy-decode slots closed: the server is shutting down.
    Draining,
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Stop::Refused(e)
    }
}

async fn accept(
    app: &Arc<App>,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Result<Response<Body>, Stop> {
    let (parts, incoming) = req.into_parts();
    if app.refuses_capture() {
        let refusal = Error::ServiceUnavailable.into_response();
        let limits = &app.config.limits;
        return Ok(super::capture::refuse(refusal, &parts.headers, incoming, limits).await);
    }
    let head = headers::read(&parts.headers)?;
    let (project, anonymize_ips) = app
        .projects
        .load()
        .by_api_key(&head.key)
        .map(|p| (p.id, p.anonymize_ips))
        .ok_or(Error::InvalidApiToken)?;
    let limits = &app.config.limits;
    let mut held = Reservation::default();
    let raw = super::capture::read_body(app, &parts.headers, incoming, &mut held)
        .await
        .map_err(|e| match e {
            body::Error::TooLarge => Error::PayloadTooLarge(format!(
                "Request body exceeds limit of {} bytes",
                limits.max_body_bytes
            )),
            body::Error::Timeout => Error::RequestTimeout,
            body::Error::Overloaded => Error::ServiceUnavailable,
            body::Error::Broken => Error::RequestDecoding,
        })?;
    if raw.is_empty() {
        return Err(Error::EmptyBody.into());
    }
    let job = Job {
        raw,
        encoding: head.encoding,
        max_decoded: limits.max_decompressed_bytes,
        sdk_info: head.sdk_info,
        ctx: Context {
            project,
            now: crate::support::clock::now_ms(),
            sent_at: Some(head.sent_at_ms),
            historical: false,
            ip: Some(super::client_ip(app, peer, &parts.headers)),
        },
        fixing: app
            .config
            .upstream
            .is_some()
            .then_some(crate::capture::Fixing { anonymize_ips }),
    };
    let small = match job.encoding {
        _ if job.raw.len() > INLINE_DECODE_BYTES => None,
        None => Some(job.raw.to_vec()),
        Some(encoding) => job.inflate_small(encoding)?,
    };
    let (mut checked, records) = match small {
        Some(decoded) => job.process(&decoded)?,
        None => {
            let _slot = app
                .heavy_decodes
                .acquire()
                .await
                .map_err(|_| Stop::Draining)?;
            tokio::task::spawn_blocking(move || {
                let decoded = match job.encoding {
                    None => job.raw.to_vec(),
                    Some(encoding) => job.inflate(encoding, job.max_decoded)?,
                };
                job.process(&decoded)
            })
            .await
            .map_err(|_| Error::Internal)??
        }
    };
    let count = records.len() as u64;
    let mut retry = false;
    if count > 0 {
        if let Err(e) = app.wal.append(records).await {
            // Not on disk: every event that was to be stored may be sent again.
            tracing::warn!("v1 capture: events not stored: {e:?}");
            for c in checked.iter_mut().filter(|c| c.status == Status::Ok) {
                c.status = Status::Retry;
                c.details = Some("not_persisted");
            }
            retry = true;
        } else {
            app.metrics.events_accepted.inc_by(count);
        }
    }
    drop(held);
    Ok(answer(&checked, retry))
}

/// A request's body and what processing it needs, movable to the blocking pool.
struct Job {
    raw: Bytes,
    encoding: Option<Encoding>,
    max_decoded: usize,
    sdk_info: String,
    ctx: Context,
    /// Edge mode: the keys forwarding relies on are fixed in each event.
    fixing: Option<crate::capture::Fixing>,
}

impl Job {
    fn inflate(&self, encoding: Encoding, max: usize) -> Result<Vec<u8>, Error> {
        inflate::decode(encoding, &self.raw, max).map_err(|e| match e {
            inflate::Error::Corrupt => Error::RequestDecoding,
            inflate::Error::TooLarge => Error::PayloadTooLarge(format!(
                "decompressed {} payload exceeds limit of {} bytes",
                encoding.as_str(),
                self.max_decoded
            )),
        })
    }

    /// The body inflated on the reactor when it stays within
    /// [`INLINE_DECODE_BYTES`]; `None` when it grows past that and is worth
    /// inflating elsewhere.
    fn inflate_small(&self, encoding: Encoding) -> Result<Option<Vec<u8>>, Error> {
        if self.max_decoded <= INLINE_DECODE_BYTES {
            return self.inflate(encoding, self.max_decoded).map(Some);
        }
        match self.inflate(encoding, INLINE_DECODE_BYTES) {
            Err(Error::PayloadTooLarge(_)) => Ok(None),
            other => other.map(Some),
        }
    }

    /// Parse, check and encode: everything between the inflated body and the log.
    fn process(mut self, decoded: &[u8]) -> Result<(Vec<Checked>, Vec<Vec<u8>>), Error> {
        let batch: model::Batch =
            serde_json::from_slice(decoded).map_err(|_| Error::RequestParsing)?;
        self.ctx.historical = batch.historical_migration;
        let sdk = model::sdk_lib_and_version(&self.sdk_info);
        let mut checked = model::check(batch, sdk)?;
        let records = model::encode(&mut checked, &self.ctx, self.fixing);
        Ok((checked, records))
    }
}

/// `200 {"results": {"<uuid>": {"result": ..., "details"?: ...}}}`, in batch order,
/// with `Retry-After` when any event is to be sent again.
fn answer(checked: &[Checked], retry: bool) -> Response<Body> {
    let mut results = Map::with_capacity(checked.len());
    for c in checked {
        let mut entry = Map::new();
        entry.insert("result".into(), Value::from(c.status.as_str()));
        if let Some(details) = c.details {
            entry.insert("details".into(), Value::from(details));
        }
        results.insert(c.uuid.hyphenated().to_string(), Value::Object(entry));
    }
    let body = serde_json::to_vec(&serde_json::json!({ "results": results })).unwrap_or_default();
    let mut r = response::with_type(StatusCode::OK, "application/json", body);
    if retry {
        r.headers_mut().insert(
            RETRY_AFTER,
            HeaderValue::from_static(error::RETRY_AFTER_SECONDS),
        );
    }
    r
}
