//! `/s/` in edge mode: posthog-js's session recording batches, taken when their key
//! is one of the edge's projects and their body decodes (gzip, lz64, base64, a form,
//! as capture decodes them), kept durably in the recordings spool before the 2xx,
//! and forwarded one to one to upstream by `edge::recordings::worker`. They are
//! refused as capture refuses events (503 with `Retry-After`) when the disk reserve
//! or the upstream backlog is reached. Outside edge mode `/s/` answers as
//! `http::not_kept` says.

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
use crate::edge::recordings::{Arrival, Spool, MAX_BODY_BYTES};
use crate::projects::key_shape_is_valid;
use crate::support::memory::Reservation;

/// What PostHog's capture answers a recording it took.
const ACCEPTED: &[u8] = br#"{"status":1}"#;

/// `/s` or `/s/`, the paths PostHog's capture takes recordings on.
pub fn is_path(path: &str) -> bool {
    matches!(path, "/s" | "/s/")
}

pub async fn handle(
    app: &Arc<App>,
    spool: &Arc<Spool>,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Result<Response<Body>, ApiError> {
    let (parts, incoming) = req.into_parts();
    let limits = &app.config.limits;
    if app.refuses_capture() {
        let refusal = ApiError::Wal(crate::log::writer::Error::Storage).into_response();
        return Ok(super::capture::refuse(refusal, &parts.headers, incoming, limits).await);
    }
    let mut held = Reservation::default();
    let raw = body::read(
        incoming,
        super::content_length(&parts.headers),
        MAX_BODY_BYTES,
        limits.body_read_timeout,
        &app.budget,
        &mut held,
    )
    .await?;
    let query_text = parts.uri.query().map(str::to_string);
    let content_type = super::header_str(&parts.headers, CONTENT_TYPE);
    let content_encoding = super::header_str(&parts.headers, CONTENT_ENCODING);
    let arrival = Arrival {
        project: 0,
        ip: Some(super::client_ip(app, peer, &parts.headers).to_string()),
        query: query_text,
        content_type,
        content_encoding,
        received_at: crate::support::clock::now_ms(),
    };
    let _slot = app
        .heavy_decodes
        .acquire()
        .await
        .map_err(|_| ApiError::Draining)?;
    let (app2, spool) = (app.clone(), spool.clone());
    tokio::task::spawn_blocking(move || keep(&app2, &spool, arrival, &raw))
        .await
        .map_err(|_| ApiError::Internal)??;
    drop(held);
    Ok(response::with_type(
        StatusCode::OK,
        "application/json",
        Bytes::from_static(ACCEPTED),
    ))
}

/// Decode to find the project, then keep the body as sent.
fn keep(app: &App, spool: &Spool, mut arrival: Arrival, raw: &Bytes) -> Result<(), ApiError> {
    let query = Query::parse(arrival.query.as_deref());
    let located = Located::find(
        &query,
        arrival.content_type.as_deref(),
        arrival.content_encoding.as_deref(),
        raw,
    );
    let mut decoded = located.decode(app.config.limits.max_decompressed_bytes)?;
    let payload = crate::capture::parse(&mut decoded, false)?;
    let key = payload.key()?;
    if !key_shape_is_valid(key) {
        return Err(crate::capture::Error::InvalidKey.into());
    }
    let projects = app.projects.load();
    let project = projects
        .by_api_key(key)
        .ok_or(crate::capture::Error::InvalidKey)?;
    arrival.project = project.id;
    spool.put(&arrival, raw).map_err(|e| {
        tracing::warn!(error = %e, "recording not kept: the spool could not be written");
        ApiError::Wal(crate::log::writer::Error::Storage)
    })
}
