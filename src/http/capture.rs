//! The event intake endpoint (`/e`, `/i/v0/e`, `/capture`, `/track`, `/engage`,
//! `/batch`, with or without the trailing slash): decode, validate, normalise, append
//! to the write-ahead log, and answer only once the events are durable.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{CONTENT_ENCODING, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};

use super::body;
use super::decode::{Located, Query};
use super::error::ApiError;
use super::response::{self, Body};
use crate::app::App;
use crate::capture::{self, timestamp, Context, DropReason, Encoded};
use crate::projects::{key_shape_is_valid, Projects};
use crate::support::memory::Reservation;

/// Payloads up to this size, that also decode to no more than this, are decoded and
/// parsed right on the reactor: it takes a fraction of a millisecond (a gzip'd batch
/// of 100 events is ~60 KiB once inflated). Larger ones, and any that gzip or lz64
/// expand past it, move to the blocking pool so they never stall other requests; an
/// expanding one is inflated at most this far on the reactor first.
pub(super) const INLINE_DECODE_BYTES: usize = 64 * 1024;
/// A body decoded to at least this many bytes is freed in bulk: the blocking thread
/// that decoded it hands the memory back at once, as the pool's threads never go
/// quiet through [`crate::support::idle::idle`].
const FREED_AFTER_BYTES: usize = 1024 * 1024;
/// The body of every accepted capture, as PostHog answers it.
const ACCEPTED: &[u8] = br#"{"status":1}"#;

/// What one request turned into, ready to append.
struct Accepted {
    records: Vec<Vec<u8>>,
    dropped: Vec<DropReason>,
}

pub async fn handle(
    app: &Arc<App>,
    req: Request<Incoming>,
    peer: SocketAddr,
    engage: bool,
) -> Result<Response<Body>, ApiError> {
    let (parts, incoming) = req.into_parts();
    let limits = &app.config.limits;
    if app.refuses_capture() {
        let refusal = ApiError::Wal(crate::log::writer::Error::Storage).into_response();
        return Ok(refuse(refusal, &parts.headers, incoming, limits).await);
    }
    let query = Query::parse(parts.uri.query());
    let mut held = Reservation::default();
    let raw = read_body(app, &parts.headers, incoming, &mut held).await?;

    let payload = Located::find(
        &query,
        super::header_str(&parts.headers, CONTENT_TYPE).as_deref(),
        super::header_str(&parts.headers, CONTENT_ENCODING).as_deref(),
        &raw,
    );
    drop(raw);
    let request = Submission {
        query,
        payload,
        engage,
        max_decoded: limits.max_decompressed_bytes,
        ip: Some(super::client_ip(app, peer, &parts.headers)),
        now: crate::support::clock::now_ms(),
        edge: app.config.upstream.is_some(),
    };
    let beacon = request.query.beacon;
    let projects = app.projects.load_full();
    let small = if request.payload.len() <= INLINE_DECODE_BYTES {
        request
            .payload
            .decode_small(INLINE_DECODE_BYTES, request.max_decoded)?
    } else {
        None
    };
    let accepted = match small {
        Some(mut bytes) => accept(&request, &mut bytes, &projects)?,
        None => {
            let _slot = app
                .heavy_decodes
                .acquire()
                .await
                .map_err(|_| ApiError::Draining)?;
            tokio::task::spawn_blocking(move || {
                let mut bytes = request.payload.decode(request.max_decoded)?;
                let accepted = accept(&request, &mut bytes, &projects);
                if bytes.capacity() >= FREED_AFTER_BYTES {
                    drop(bytes);
                    crate::support::idle::freed();
                }
                accepted
            })
            .await
            .map_err(|_| ApiError::Internal)??
        }
    };
    for reason in &accepted.dropped {
        app.metrics.dropped(*reason);
    }
    let count = accepted.records.len() as u64;
    app.wal.append(accepted.records).await?;
    app.metrics.events_accepted.inc_by(count);
    drop(held);
    Ok(if beacon {
        response::empty(StatusCode::NO_CONTENT)
    } else {
        response::with_type(
            StatusCode::OK,
            "application/json",
            Bytes::from_static(ACCEPTED),
        )
    })
}

/// Answer `refusal` to a request whose body is not wanted, after reading and dropping
/// that body when it is small, so the client reads the answer instead of a reset.
pub(super) async fn refuse(
    mut refusal: Response<Body>,
    headers: &hyper::HeaderMap,
    incoming: Incoming,
    limits: &crate::config::Limits,
) -> Response<Body> {
    let declared = super::content_length(headers);
    if !body::discard(incoming, declared, limits.body_read_timeout).await {
        response::close(&mut refusal);
    }
    refusal
}

/// An intake request's body, within the capture limits (`--max-body-bytes`, the body
/// deadline) and the server's memory budget, which `held` keeps charged.
pub(super) async fn read_body(
    app: &App,
    headers: &hyper::HeaderMap,
    incoming: Incoming,
    held: &mut Reservation,
) -> Result<Bytes, body::Error> {
    let limits = &app.config.limits;
    body::read(
        incoming,
        super::content_length(headers),
        limits.max_body_bytes,
        limits.body_read_timeout,
        &app.budget,
        held,
    )
    .await
}

/// The request as the pure part of the pipeline needs it.
struct Submission {
    query: Query,
    payload: Located,
    engage: bool,
    max_decoded: usize,
    ip: Option<std::net::IpAddr>,
    now: i64,
    /// Edge mode: the keys forwarding relies on are fixed in each event.
    edge: bool,
}

/// Parse, authenticate and normalise: everything between the decoded bytes and the log.
fn accept(req: &Submission, bytes: &mut [u8], projects: &Projects) -> Result<Accepted, ApiError> {
    let payload = capture::parse(bytes, req.engage)?;
    let key = payload.key()?;
    if !key_shape_is_valid(key) {
        return Err(capture::Error::InvalidKey.into());
    }
    let project = projects.by_api_key(key).ok_or(capture::Error::InvalidKey)?;
    let ctx = Context {
        project: project.id,
        now: req.now,
        sent_at: payload
            .sent_at
            .and_then(timestamp::parse_ms)
            .or(req.query.sent_at_ms),
        historical: payload.historical,
        ip: req.ip,
    };
    let mut accepted = Accepted {
        records: Vec::with_capacity(payload.len()),
        dropped: Vec::new(),
    };
    let fixer = req.edge.then(|| {
        let fixing = capture::Fixing {
            anonymize_ips: project.anonymize_ips,
        };
        capture::Fixer::new(&ctx, fixing)
    });
    for event in payload.events() {
        let encoded = match &fixer {
            None => capture::encode_event(event, &ctx)?,
            Some(fixer) => fixer.encode(event)?,
        };
        match encoded {
            Encoded::Keep(record) => accepted.records.push(record),
            Encoded::Drop(reason) => accepted.dropped.push(reason),
        }
    }
    Ok(accepted)
}
