//! One request of a window, to its end: the answer table applied to it. A 2xx is
//! done; a 400 is bisected until the one refused event is found, which goes to the
//! dead-letter file while the rest goes on; a 413 is split the same way, a single
//! event still too large dead-lettered; a 401/403 pauses the project; anything else
//! (429, 5xx, a timeout, a reset, a refused connection) leaves the same events to be
//! sent again, byte for byte, after a backoff.
//!
//! The runs still to send are kept between tries ([`Pending`]), so a retry resends
//! exactly the run that failed, not the halves already delivered.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;

use super::batch::{self, Lines};
use super::dead::{DeadLetters, DEAD_LETTER};
use super::work::Work;
use crate::edge::answer::Outcome;
use crate::edge::client::Error;
use crate::edge::{Client, Stats};

/// How long one request may take, answer included: a 20 MB body over a slow link.
pub const DEADLINE: Duration = Duration::from_secs(60);
/// Upstream's answers are short; anything longer is cut.
const MAX_ANSWER: usize = 64 * 1024;

/// A request's runs of events (indices into its part's list) not yet delivered,
/// the first one next.
pub type Pending = Vec<Range<usize>>;

/// How a request ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Ended {
    /// Every event delivered or dead-lettered.
    Done,
    /// Upstream refused the project's token.
    Unauthorized(String),
    /// Try again later, no sooner than upstream asked. `unreachable` when no
    /// connection could be made at all: nothing reached upstream, so trying again
    /// soon costs it nothing.
    Retry {
        after: Option<Duration>,
        unreachable: bool,
    },
}

/// What a delivery needs besides its events.
pub struct Target<'a> {
    pub client: &'a Client,
    pub stats: &'a Stats,
    pub dead: &'a Arc<DeadLetters>,
    pub project: u64,
    pub api_key: &'a str,
    pub historical: bool,
}

/// Send `pending` runs of `events` (the part's lines, by index into `lines`) until
/// all are through or one must wait. `ready` is the body of all of `events`, made
/// beforehand ([`encode`]); it goes first if the whole part is pending.
pub async fn deliver(
    target: &Target<'_>,
    lines: &Lines,
    events: &[usize],
    pending: &mut Pending,
    mut ready: Option<Vec<u8>>,
) -> Ended {
    while let Some(run) = pending.first().cloned() {
        let chosen = &events[run.clone()];
        let body = match ready.take() {
            Some(body) if run == (0..events.len()) => body,
            _ => batch::body(
                target.api_key,
                target.historical,
                crate::support::clock::now_ms(),
                lines,
                chosen,
            ),
        };
        let request = Request::post("/batch/")
            .header("content-type", "application/json")
            .header("content-encoding", "gzip")
            .body(Full::new(Bytes::from(body)));
        let Ok(request) = request else {
            // Only static headers: the request always builds.
            return Ended::Retry {
                after: None,
                unreachable: false,
            };
        };
        let result = target.client.send(request, DEADLINE, MAX_ANSWER).await;
        let status = match &result {
            Ok(a) => a.status.as_u16().to_string(),
            Err(e) => e.label().to_string(),
        };
        target.stats.answered("batch", &status);
        let refused = match Outcome::of(&result) {
            Outcome::Delivered => {
                pending.remove(0);
                continue;
            }
            Outcome::Refused(reason) => reason,
            Outcome::TooLarge => "413 too large for upstream".to_string(),
            Outcome::Unauthorized(reason) => return Ended::Unauthorized(reason),
            Outcome::Retry { after } => {
                let unreachable = matches!(result, Err(Error::Connect(..)));
                return Ended::Retry { after, unreachable };
            }
        };
        pending.remove(0);
        if run.len() == 1 {
            let line = lines.line(events[run.start]);
            let (dead, project, uuid) = (target.dead.clone(), target.project, line.uuid);
            let (json, why) = (lines.json(events[run.start]).to_vec(), refused.clone());
            let kept = tokio::task::spawn_blocking(move || dead.keep(project, uuid, &json, &why))
                .await
                .map_err(std::io::Error::other)
                .and_then(|r| r);
            match kept {
                Ok(true) => {
                    target.stats.dead_letters.inc();
                    tracing::warn!(uuid = %line.uuid, reason = %refused, "forwarder: upstream refused an event; kept in {DEAD_LETTER}");
                }
                // Found again after a restart cut its request's bisection short.
                Ok(false) => {
                    tracing::debug!(uuid = %line.uuid, "forwarder: refused again; kept already")
                }
                Err(e) => {
                    // Not lost yet: the event stays in the window, tried again later.
                    tracing::error!(error = %e, "forwarder: cannot write the dead-letter file");
                    pending.insert(0, run);
                    return Ended::Retry {
                        after: None,
                        unreachable: false,
                    };
                }
            }
        } else {
            let [a, b] = batch::halves(run);
            pending.insert(0, b);
            pending.insert(0, a);
        }
    }
    Ended::Done
}

/// The gzip'd body of all of `events`, made on the forwarder's own threads
/// ([`Work`]): compressing a thousand events takes milliseconds the reactor's other
/// work should not wait for, and several requests' bodies are made at once.
pub async fn encode(
    work: &Work,
    api_key: &str,
    historical: bool,
    lines: &Arc<Lines>,
    events: &[usize],
) -> Option<Vec<u8>> {
    let (api_key, lines, events) = (api_key.to_string(), Arc::clone(lines), events.to_vec());
    work.run(move || {
        batch::body(
            &api_key,
            historical,
            crate::support::clock::now_ms(),
            &lines,
            &events,
        )
    })
    .await
}
