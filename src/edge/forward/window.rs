//! Sending one project's window: its requests go [`IN_FLIGHT`] at a time, each
//! handled to its end by [`deliver`], and the window's progress (`part`, the requests
//! upstream took) moves only over the first ones taken without a gap. A request taken
//! past one still failing is remembered in memory, so a retry does not send it again;
//! after a crash it is sent again, the same events byte for byte, which upstream
//! deduplicates by uuid. PostHog does not care in what order a batch's requests
//! arrive: its ingestion orders events by their timestamps.
//!
//! A pass begins with one request alone: against an upstream that is down or
//! refusing, one failure is enough to learn it, and only after a success do the
//! others follow. (A build that started every window after a success with
//! [`IN_FLIGHT`] at once drained slower than the one before in three drains of three
//! side by side, with upstream spending more CPU; so each window still begins
//! alone.) A failed request ends the pass once those already on their way are
//! answered. Upstream unreachable (no connection at all) is tried again every
//! [`PROBE`], not after the backoff's growing wait: nothing reached it, so the try
//! costs it nothing, and the backlog starts draining within seconds of its return.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use super::batch::Lines;
use super::cursor::{self, State};
use super::deliver::{self, Ended, Pending, Target};
use super::work::Work;
use super::{pause, Forwarder, Sending};
use crate::edge::{Client, Stats};

/// Requests of one project on their way at once: upstream's intake overlaps them
/// (its parse, its log's fsync), where one at a time waits out each in turn.
pub const IN_FLIGHT: usize = 4;
/// How soon an unreachable upstream is tried again: a refused connection costs it
/// nothing, and a backlog should start draining within seconds of its return.
pub const PROBE: Duration = Duration::from_secs(2);

/// What one request needs, owned, to run as a task of its own.
struct Request {
    client: Client,
    work: Work,
    stats: Stats,
    dead: Arc<super::dead::DeadLetters>,
    project: u64,
    api_key: String,
    historical: bool,
    lines: Arc<Lines>,
    events: Vec<usize>,
    pending: Pending,
}

impl Request {
    /// Deliver the part; its body made on the forwarder's threads when it goes whole.
    async fn run(mut self, part: usize) -> (usize, Pending, Ended) {
        let whole = self.pending.len() == 1 && self.pending[0] == (0..self.events.len());
        let ready = match whole {
            true => {
                let (key, lines) = (&self.api_key, &self.lines);
                deliver::encode(&self.work, key, self.historical, lines, &self.events).await
            }
            false => None,
        };
        let target = Target {
            client: &self.client,
            stats: &self.stats,
            dead: &self.dead,
            project: self.project,
            api_key: &self.api_key,
            historical: self.historical,
        };
        let ended = deliver::deliver(&target, &self.lines, &self.events, &mut self.pending, ready);
        let ended = ended.await;
        (part, self.pending, ended)
    }
}

impl Forwarder {
    /// Send what is left of `project`'s window, unless it waits; the events of the
    /// requests delivered (or dead-lettered) meanwhile.
    pub(super) async fn send_window(
        &mut self,
        project: u64,
        state: &State,
    ) -> Result<u64, sled::Error> {
        let Some(window) = state.window.clone() else {
            return Ok(0);
        };
        if !self.sending.contains_key(&project) {
            let sending = self.load(project, state.clone(), &window).await?;
            self.sending.insert(project, sending);
        }
        let projects = self.projects.load();
        let api_key = projects.by_id(project).map(|p| p.api_key.clone());
        let Some(s) = self.sending.get_mut(&project) else {
            return Ok(0);
        };
        // A paused project's key changed in projects.json: try it at once.
        let fixed = s.paused.is_some() && s.paused_key != api_key;
        if s.next_try.is_some_and(|t| Instant::now() < t) && !fixed {
            return Ok(0);
        }
        let Some(api_key) = api_key else {
            pause(
                s,
                project,
                None,
                "the project is not in projects.json".into(),
            );
            return Ok(0);
        };
        let Some(mut w) = s.state.window.clone() else {
            return Ok(0);
        };
        let mut flight: JoinSet<(usize, Pending, Ended)> = JoinSet::new();
        let (mut next, mut limit, mut failed) = (w.part, 1, false);
        let mut delivered = 0;
        loop {
            while !failed && flight.len() < limit && next < s.parts.len() {
                if !s.taken.contains(&next) {
                    let (events, historical) = s.parts[next].clone();
                    let whole = std::iter::once(0..events.len()).collect();
                    let request = Request {
                        client: self.client.clone(),
                        work: self.work.clone(),
                        stats: self.stats.clone(),
                        dead: self.dead.clone(),
                        project,
                        api_key: api_key.clone(),
                        historical,
                        lines: s.lines.clone(),
                        pending: s.pending.remove(&next).unwrap_or(whole),
                        events,
                    };
                    flight.spawn(request.run(next));
                }
                next += 1;
            }
            let Some(joined) = flight.join_next().await else {
                break;
            };
            let Ok((part, pending, ended)) = joined else {
                // A request's task panicked: its part is tried again next pass.
                failed = true;
                continue;
            };
            match ended {
                Ended::Done => {
                    if let Some(why) = s.paused.take() {
                        tracing::info!(project, was = %why, "forwarder: upstream takes this project's events again");
                    }
                    if s.backoff.failures() > 0 {
                        tracing::info!(project, "forwarder: upstream is taking events again");
                    }
                    s.backoff.succeeded();
                    s.next_try = None;
                    s.taken.insert(part);
                    limit = IN_FLIGHT;
                    delivered += s.parts[part].0.len() as u64;
                }
                Ended::Unauthorized(why) => {
                    s.pending.insert(part, pending);
                    if !failed {
                        pause(s, project, Some(api_key.clone()), why);
                    }
                    failed = true;
                }
                Ended::Retry { after, unreachable } => {
                    s.pending.insert(part, pending);
                    if !failed {
                        retry_later(s, project, after, unreachable);
                    }
                    failed = true;
                }
            }
        }
        // The taken requests from the window's progress on, without a gap.
        let before = w.part;
        while s.taken.remove(&w.part) {
            w.part += 1;
        }
        // Every part through (or none to send, its blocks gone): the window is done.
        let done = w.part >= s.parts.len();
        if w.part == before && !done {
            return Ok(delivered);
        }
        s.state.window = Some(w.clone());
        if done {
            s.state = State {
                done: w.last,
                window: None,
            };
        }
        // Flushed only at the window's end: a crash before it sends the window's
        // taken requests again, the same events byte for byte, which upstream
        // deduplicates by uuid; one flush a window instead of one a request.
        let (reader, state) = (self.reader.clone(), s.state.clone());
        self.blocking(move || cursor::save(&reader, project, &state, done))
            .await?;
        Ok(delivered)
    }
}

/// Set when `s` is tried again after a failed request, and say so once.
fn retry_later(s: &mut Sending, project: u64, after: Option<Duration>, unreachable: bool) {
    if s.backoff.failures() == 0 {
        tracing::warn!(
            project,
            "forwarder: upstream is not taking events; retrying with backoff"
        );
    }
    let wait = s.backoff.next(after);
    let wait = match (unreachable, after) {
        (true, None) => wait.min(PROBE),
        _ => wait,
    };
    s.next_try = Some(Instant::now() + wait);
}

/// Parts taken out of order, kept in memory only.
pub(super) type Taken = BTreeSet<usize>;
/// Parts partly delivered (a bisection under way), by part.
pub(super) type Partial = HashMap<usize, Pending>;
