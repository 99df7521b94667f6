//! The event forwarder: every event the edge stored goes to upstream's `/batch/`, at
//! least once, in the order the compactor committed it, each resend byte for byte the
//! same event. It is the outbox's `forward` reader, beside the ClickHouse sink's, so
//! the compactor writes each change once whoever reads it.
//!
//! A pass ([`Forwarder::step`]) reads the new outbox entries, moves the reader's
//! checkpoint past what every project delivered and fixes a window of entries for
//! each project with events to send ([`cursor`]), then sends each project's window as
//! gzip'd requests of one token each, recent and historical events apart ([`batch`]),
//! one request at a time per project, handling every answer ([`deliver`]), the next
//! request's body compressed while one is in flight. A project's progress is
//! recorded after each request upstream took and flushed to disk when its window is
//! through, and only then; after a crash the window's requests since its last flush
//! are sent again, the same events byte for byte, which upstream deduplicates by
//! uuid.
//!
//! The figures go to the `flagpost_upstream_*` metrics ([`crate::edge::Stats`]) and to
//! [`Figures`], which the server copies into capture's backlog bound and the console.

pub mod batch;
pub mod cursor;
pub mod dead;
pub mod deliver;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use self::batch::Line;
use self::cursor::{Cache, State, Window};
use self::dead::DeadLetters;
use self::deliver::{Ended, Pending, Target};
use super::answer::{Backoff, BACKOFF_START, PAUSE_RETRY};
use super::{Client, Stats};
use crate::projects::Projects;
use crate::store::block::Files;
use crate::store::outbox::{Outbox, Reader, FORWARD};

/// How often an outbox with nothing to send is looked at again.
pub const POLL: Duration = Duration::from_millis(200);

/// The longest wait between tries to deliver: edge mode's research caps retries at
/// five minutes, but a backlog must drain well within the time it built up in, so an
/// outage's end is noticed within half a minute (one small request a project).
pub const RETRY_CAP: Duration = Duration::from_secs(30);

/// What the forwarder owes upstream, for capture's bound and the console.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    pub backlog_events: u64,
    /// Bytes the unforwarded events' blocks take on disk (compressed).
    pub backlog_bytes: u64,
    /// Seconds since the oldest unforwarded event was stored; 0 when all is sent.
    pub lag_seconds: f64,
    /// Projects upstream refuses (401/403, or gone from projects.json), with why.
    pub paused: Vec<(u64, String)>,
    /// Projects waiting to retry after a failed request.
    pub retrying: usize,
}

/// One project's window on its way.
struct Sending {
    state: State,
    lines: Arc<Vec<Line>>,
    parts: Vec<(Vec<usize>, bool)>,
    /// The current part's runs still to send, kept between tries.
    pending: Option<Pending>,
    backoff: Backoff,
    next_try: Option<Instant>,
    paused: Option<String>,
    /// The key upstream refused, to notice when projects.json changes it.
    paused_key: Option<String>,
}

pub struct Forwarder {
    client: Client,
    reader: Reader,
    events: sled::Tree,
    files: Files,
    projects: Arc<ArcSwap<Projects>>,
    stats: Stats,
    dead: Arc<DeadLetters>,
    historical_after: Duration,
    cache: Cache,
    sending: HashMap<u64, Sending>,
    figures: Arc<Mutex<Figures>>,
}

impl Forwarder {
    /// A forwarder over the store's outbox (as its `forward` reader), event trees and
    /// block files, sending to `client`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        outbox: Outbox,
        events: sled::Tree,
        files: Files,
        projects: Arc<ArcSwap<Projects>>,
        stats: Stats,
        db_dir: PathBuf,
        historical_after: Duration,
    ) -> Forwarder {
        Forwarder {
            client,
            reader: outbox.reader(FORWARD),
            events,
            files,
            projects,
            stats,
            dead: Arc::new(DeadLetters::new(&db_dir)),
            historical_after,
            cache: Cache::new(),
            sending: HashMap::new(),
            figures: Arc::default(),
        }
    }

    /// Report figures into `figures` (the server's, shown by the console).
    pub fn with_figures(mut self, figures: Arc<Mutex<Figures>>) -> Forwarder {
        self.figures = figures;
        self
    }

    /// One pass; returns how long to wait before the next (none while there is more
    /// to send at once).
    pub async fn step(&mut self) -> Result<Duration, sled::Error> {
        let (reader, events) = (self.reader.clone(), self.events.clone());
        let mut cache = std::mem::take(&mut self.cache);
        let after = self.historical_after.as_millis() as i64;
        let now = crate::support::clock::now_ms();
        let (cache, plan) = blocking(move || {
            let plan = cursor::plan(&reader, &events, &mut cache, now, after);
            plan.map(|p| (cache, p))
        })
        .await?;
        self.cache = cache;
        self.sending.retain(|p, s| {
            plan.windows
                .iter()
                .any(|(q, w)| q == p && w.window == s.state.window)
        });
        let mut progress = false;
        for (project, state) in &plan.windows {
            progress |= self.send_window(*project, state).await?;
        }
        self.report(&plan);
        Ok(if progress { Duration::ZERO } else { POLL })
    }

    fn report(&self, plan: &cursor::Plan) {
        let now = crate::support::clock::now_ms();
        let lag = plan
            .oldest_ms
            .map_or(0.0, |t| (now - t).max(0) as f64 / 1000.0);
        self.stats
            .forward_backlog_events
            .set(plan.backlog_events as i64);
        self.stats.forward_lag_seconds.set(lag);
        let mut paused: Vec<(u64, String)> = self
            .sending
            .iter()
            .filter_map(|(p, s)| s.paused.clone().map(|r| (*p, r)))
            .collect();
        paused.sort();
        let retrying = self
            .sending
            .values()
            .filter(|s| s.paused.is_none() && s.backoff.failures() > 0)
            .count();
        let figures = Figures {
            backlog_events: plan.backlog_events,
            backlog_bytes: plan.backlog_bytes,
            lag_seconds: lag,
            paused,
            retrying,
        };
        *crate::support::sync::lock(&self.figures) = figures;
    }

    /// Send what is left of `project`'s window, unless it waits; true if any request
    /// was delivered.
    async fn send_window(&mut self, project: u64, state: &State) -> Result<bool, sled::Error> {
        let Some(window) = state.window.clone() else {
            return Ok(false);
        };
        if !self.sending.contains_key(&project) {
            let sending = self.load(project, state.clone(), &window).await?;
            self.sending.insert(project, sending);
        }
        let Some(s) = self.sending.get_mut(&project) else {
            return Ok(false);
        };
        let projects = self.projects.load();
        let api_key = projects.by_id(project).map(|p| p.api_key.clone());
        // A paused project's key changed in projects.json: try it at once.
        let fixed = s.paused.is_some() && s.paused_key != api_key;
        if s.next_try.is_some_and(|t| Instant::now() < t) && !fixed {
            return Ok(false);
        }
        let Some(api_key) = api_key else {
            pause(
                s,
                project,
                None,
                "the project is not in projects.json".into(),
            );
            return Ok(false);
        };
        let mut progress = false;
        // The next part's body, made while the current one is in flight.
        let mut next: Option<(usize, tokio::task::JoinHandle<Vec<u8>>)> = None;
        while let Some(mut w) = s.state.window.clone() {
            let Some((events, historical)) = s.parts.get(w.part).cloned() else {
                // Every part through: the window is done.
                s.state = State {
                    done: w.last,
                    window: None,
                };
                let (reader, state) = (self.reader.clone(), s.state.clone());
                blocking(move || cursor::save(&reader, project, &state, true)).await?;
                break;
            };
            let whole: Pending = std::iter::once(0..events.len()).collect();
            let fresh = s.pending.is_none();
            let mut pending = s.pending.take().unwrap_or(whole);
            let ready = match next.take() {
                Some((part, body)) if part == w.part => body.await.ok(),
                _ if fresh => deliver::encode(&api_key, historical, &s.lines, &events)
                    .await
                    .ok(),
                _ => None,
            };
            if let Some((following, historical)) = s.parts.get(w.part + 1) {
                let body = deliver::encode(&api_key, *historical, &s.lines, following);
                next = Some((w.part + 1, body));
            }
            let target = Target {
                client: &self.client,
                stats: &self.stats,
                dead: &self.dead,
                project,
                api_key: &api_key,
                historical,
            };
            match deliver::deliver(&target, &s.lines, &events, &mut pending, ready).await {
                Ended::Done => {
                    if let Some(why) = s.paused.take() {
                        tracing::info!(project, was = %why, "forwarder: upstream takes this project's events again");
                    }
                    if s.backoff.failures() > 0 {
                        tracing::info!(project, "forwarder: upstream is taking events again");
                    }
                    s.backoff.succeeded();
                    s.next_try = None;
                    w.part += 1;
                    s.state.window = Some(w);
                    // Not flushed: the window's end is. A crash before it sends the
                    // window's taken parts again, the same events byte for byte,
                    // which upstream deduplicates by uuid; one flush a window
                    // instead of one a request.
                    let (reader, state) = (self.reader.clone(), s.state.clone());
                    blocking(move || cursor::save(&reader, project, &state, false)).await?;
                    progress = true;
                }
                Ended::Unauthorized(why) => {
                    s.pending = Some(pending);
                    pause(s, project, Some(api_key.clone()), why);
                    break;
                }
                Ended::Retry { after } => {
                    s.pending = Some(pending);
                    if s.backoff.failures() == 0 {
                        tracing::warn!(
                            project,
                            "forwarder: upstream is not taking events; retrying with backoff"
                        );
                    }
                    s.next_try = Some(Instant::now() + s.backoff.next(after));
                    break;
                }
            }
        }
        Ok(progress)
    }

    /// A window's events, read from their blocks and cut into requests.
    async fn load(
        &self,
        project: u64,
        state: State,
        window: &Window,
    ) -> Result<Sending, sled::Error> {
        let (cache, events, files, w) = (
            self.cache
                .range(window.first..=window.last)
                .map(|(k, v)| (*k, v.clone()))
                .collect::<Cache>(),
            self.events.clone(),
            self.files.clone(),
            window.clone(),
        );
        let (lines, missing) =
            blocking(move || cursor::window_lines(&cache, &events, &files, project, &w)).await?;
        if missing > 0 {
            tracing::error!(
                project,
                missing,
                "forwarder: event blocks deleted before they were forwarded"
            );
        }
        let parts = batch::parts(&lines, window.cutoff, batch::MAX_BODY_BYTES);
        Ok(Sending {
            state,
            lines: Arc::new(lines),
            parts,
            pending: None,
            backoff: Backoff::new(BACKOFF_START, RETRY_CAP),
            next_try: None,
            paused: None,
            paused_key: None,
        })
    }
}

/// Stop sending `project`'s events until [`PAUSE_RETRY`] has passed or its key
/// changes; said once.
fn pause(s: &mut Sending, project: u64, key: Option<String>, why: String) {
    if s.paused.is_none() {
        tracing::error!(project, reason = %why, "forwarder: upstream refuses this project's events; they are kept and tried again every minute");
    }
    s.paused = Some(why);
    s.paused_key = key;
    s.next_try = Some(Instant::now() + PAUSE_RETRY);
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> sled::Result<T> + Send + 'static,
) -> Result<T, sled::Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| sled::Error::Io(std::io::Error::other(e)))?
}

#[cfg(test)]
mod tests;
