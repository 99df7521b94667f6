//! The loop that sends the spool's recordings to upstream `/s/`, oldest first, one
//! request per recording as the browser sent it, with the browser's address in
//! `X-Forwarded-For` and its own query, content type and encoding. Each answer is
//! read by the table every forwarding loop shares ([`Outcome`]): a 2xx deletes the
//! file (and only a 2xx); 400 and 413 set it aside; 401/403 pause that project's
//! recordings for [`PAUSE_RETRY`] while the others go on; anything else (429, 5xx, a
//! timeout, a refused connection) waits a [`Backoff`] and sends the same file again.
//! Every try is counted in `flagpost_upstream_requests_total{endpoint="s"}`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONTENT_ENCODING, CONTENT_TYPE};
use hyper::Request;
use tokio::sync::watch;

use super::{Arrival, Spool};
use crate::edge::answer::{Backoff, Outcome, PAUSE_RETRY};
use crate::edge::client::Client;
use crate::edge::stats::Stats;

/// A recording upload of 25 MB on a slow link takes a while; past this the outcome
/// is unknown and the same bytes go again (recordings are at-least-once upstream).
const SEND_DEADLINE: Duration = Duration::from_secs(120);
/// Upstream's answer to `/s/` is a short JSON status.
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// With nothing to send, the spool is looked at again this often even unwoken: a
/// paused project's files come due, and files left by a previous run are found.
const IDLE_RESCAN: Duration = Duration::from_secs(5);
/// The metrics' endpoint label.
const ENDPOINT: &str = "s";

/// Send until `stop` turns true. A send under way when it does is dropped: its file
/// stays and goes again at the next start, so shutdown never waits on upstream.
pub async fn run(spool: Arc<Spool>, client: Client, stats: Stats, mut stop: watch::Receiver<bool>) {
    let mut backoff = Backoff::default();
    let mut paused: HashMap<u64, Instant> = HashMap::new();
    loop {
        let wait = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return,
            wait = pass(&spool, &client, &stats, &mut backoff, &mut paused) => wait,
        };
        let woken = spool.arrived.notified();
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(wait.unwrap_or(IDLE_RESCAN)) => {}
            _ = woken, if wait.is_none() => {}
        }
        if *stop.borrow() {
            return;
        }
    }
}

/// One pass over the spool; the wait before the next when upstream asked for one.
async fn pass(
    spool: &Arc<Spool>,
    client: &Client,
    stats: &Stats,
    backoff: &mut Backoff,
    paused: &mut HashMap<u64, Instant>,
) -> Option<Duration> {
    let listing = spool.clone();
    let names = tokio::task::spawn_blocking(move || listing.waiting())
        .await
        .unwrap_or_default();
    let now = Instant::now();
    paused.retain(|_, until| *until > now);
    for name in names {
        let reading = (spool.clone(), name.clone());
        let read = tokio::task::spawn_blocking(move || reading.0.read(&reading.1)).await;
        let (arrival, body) = match read {
            Ok(Ok(Some(found))) => found,
            Ok(Ok(None)) => continue,
            Ok(Err(e)) => {
                tracing::warn!(file = name, error = %e, "recording unreadable: set aside");
                settle(spool, name, Settle::Aside(format!("unreadable: {e}"))).await;
                continue;
            }
            Err(_) => continue,
        };
        if paused.contains_key(&arrival.project) {
            continue;
        }
        let result = match request(&arrival, body) {
            Some(request) => client.send(request, SEND_DEADLINE, MAX_ANSWER_BYTES).await,
            None => {
                settle(
                    spool,
                    name,
                    Settle::Aside("a header cannot be sent again".into()),
                )
                .await;
                continue;
            }
        };
        match &result {
            Ok(answer) => stats.answered(ENDPOINT, answer.status.as_str()),
            Err(e) => stats.answered(ENDPOINT, e.label()),
        }
        match Outcome::of(&result) {
            Outcome::Delivered => {
                backoff.succeeded();
                settle(spool, name, Settle::Delivered).await;
            }
            Outcome::Refused(reason) => {
                tracing::warn!(
                    file = name,
                    reason,
                    "upstream refused a recording: set aside"
                );
                settle(spool, name, Settle::Aside(reason)).await;
            }
            Outcome::TooLarge => {
                tracing::warn!(
                    file = name,
                    "upstream found a recording too large: set aside"
                );
                settle(
                    spool,
                    name,
                    Settle::Aside("413 too large for upstream".into()),
                )
                .await;
            }
            Outcome::Unauthorized(reason) => {
                tracing::warn!(
                    project = arrival.project,
                    reason,
                    "upstream refused this project's token: its recordings wait, retried every minute"
                );
                paused.insert(arrival.project, Instant::now() + PAUSE_RETRY);
            }
            Outcome::Retry { after } => {
                let wait = backoff.next(after);
                tracing::info!(
                    file = name,
                    wait_ms = wait.as_millis() as u64,
                    "recording not delivered: sent again after the wait"
                );
                return Some(wait);
            }
        }
    }
    None
}

enum Settle {
    Delivered,
    Aside(String),
}

async fn settle(spool: &Arc<Spool>, name: String, how: Settle) {
    let spool = spool.clone();
    let done = tokio::task::spawn_blocking(move || match how {
        Settle::Delivered => spool.delivered(&name),
        Settle::Aside(reason) => spool.set_aside(&name, &reason),
    })
    .await;
    if !matches!(done, Ok(Ok(()))) {
        // Left in the spool: sent once more (at-least-once, as upstream treats replay).
        tracing::warn!("a recording's file could not be removed from the spool");
    }
}

/// The request as the browser made it, to upstream `/s/`.
fn request(arrival: &Arrival, body: Bytes) -> Option<Request<Full<Bytes>>> {
    let uri = match arrival.query.as_deref().filter(|q| !q.is_empty()) {
        Some(query) => format!("/s/?{query}"),
        None => "/s/".to_string(),
    };
    let mut builder = Request::post(uri);
    if let Some(v) = &arrival.content_type {
        builder = builder.header(CONTENT_TYPE, v.as_str());
    }
    if let Some(v) = &arrival.content_encoding {
        builder = builder.header(CONTENT_ENCODING, v.as_str());
    }
    if let Some(ip) = &arrival.ip {
        builder = builder.header("x-forwarded-for", ip.as_str());
    }
    builder.body(Full::new(body)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_browsers_request_again() {
        let arrival = Arrival {
            project: 1,
            ip: Some("198.51.100.4".into()),
            query: Some("compression=gzip-js&ver=1.2".into()),
            content_type: Some("text/plain".into()),
            content_encoding: None,
            received_at: 1,
        };
        let r = request(&arrival, Bytes::from_static(b"xyz")).unwrap();
        assert_eq!(r.uri(), "/s/?compression=gzip-js&ver=1.2");
        assert_eq!(r.method(), hyper::Method::POST);
        assert_eq!(r.headers()["content-type"], "text/plain");
        assert_eq!(r.headers()["x-forwarded-for"], "198.51.100.4");
        assert!(r.headers().get("content-encoding").is_none());
        let bare = Arrival {
            query: None,
            ip: None,
            ..arrival
        };
        let r = request(&bare, Bytes::new()).unwrap();
        assert_eq!(r.uri(), "/s/");
        assert!(r.headers().get("x-forwarded-for").is_none());
    }
}
