//! The event forwarder: every event the edge stored goes to upstream's `/batch/`, at
//! least once, in the order the compactor committed it, each resend byte for byte the
//! same event. It is the outbox's `forward` reader, beside the ClickHouse sink's, so
//! the compactor writes each change once whoever reads it.
//!
//! A pass ([`Forwarder::step`]) reads the new outbox entries, moves the reader's
//! checkpoint past what every project delivered and fixes a window of entries for
//! each project with events to send ([`cursor`]), then sends each project's window as
//! gzip'd requests of one token each, recent and historical events apart ([`batch`]),
//! several requests of a project at a time ([`window`]), handling every answer
//! ([`deliver`]). A project's progress moves over the requests upstream took without
//! a gap, and is flushed to disk when its window is through, and only then; after a
//! crash the window's requests since its last flush are sent again, the same events
//! byte for byte, which upstream deduplicates by uuid.
//!
//! The figures go to the `flagpost_upstream_*` metrics ([`crate::edge::Stats`]) and to
//! [`Figures`], which the server copies into capture's backlog bound and the console.

pub mod batch;
pub mod cursor;
pub mod dead;
pub mod deliver;
pub mod window;
pub mod work;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use self::batch::Lines;
use self::cursor::{Cache, State, Window};
use self::dead::DeadLetters;
use self::work::Work;
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
    lines: Arc<Lines>,
    parts: Vec<(Vec<usize>, bool)>,
    /// Parts partly delivered (a bisection under way), their runs still to send.
    pending: window::Partial,
    /// Parts upstream took past one it has not, in memory only.
    taken: window::Taken,
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
    work: Work,
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
            work: Work::new(0),
        }
    }

    /// Do the blocking work at `nice` (the compactor's, as the server runs it), so
    /// capture's requests come first when the cores are busy.
    pub fn with_nice(mut self, nice: i32) -> Forwarder {
        self.work = Work::new(nice);
        self
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
        let (cache, plan) = self
            .blocking(move || {
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
        let mut delivered = 0;
        for (project, state) in &plan.windows {
            delivered += self.send_window(*project, state).await?;
        }
        self.report(&plan, delivered);
        Ok(if delivered > 0 { Duration::ZERO } else { POLL })
    }

    /// The figures as of the pass's end: the plan's backlog, counted before the pass
    /// sent anything, less what it `delivered`, so the backlog does not lag a window
    /// behind what upstream has.
    fn report(&self, plan: &cursor::Plan, delivered: u64) {
        let now = crate::support::clock::now_ms();
        let lag = plan
            .oldest_ms
            .map_or(0.0, |t| (now - t).max(0) as f64 / 1000.0);
        let backlog_events = plan.backlog_events.saturating_sub(delivered);
        self.stats.forward_backlog_events.set(backlog_events as i64);
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
            backlog_events,
            backlog_bytes: plan.backlog_bytes,
            lag_seconds: lag,
            paused,
            retrying,
        };
        *crate::support::sync::lock(&self.figures) = figures;
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
        let (lines, missing) = self
            .blocking(move || cursor::window_lines(&cache, &events, &files, project, &w))
            .await?;
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
            pending: window::Partial::new(),
            taken: window::Taken::new(),
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

impl Forwarder {
    /// Run a storage step on the forwarder's threads.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> sled::Result<T> + Send + 'static,
    ) -> Result<T, sled::Error> {
        let failed = || sled::Error::Io(std::io::Error::other("a forwarder thread failed"));
        self.work.run(f).await.ok_or_else(failed)?
    }
}

#[cfg(test)]
mod tests;
