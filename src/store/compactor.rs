//! The compactor: a background thread that turns the write-ahead log into stored
//! events, persons and groups, in order and exactly once.
//!
//! Each [`Compactor::step`] takes a chunk of the log and, in ONE sled transaction,
//! applies the records, moves the ones that belong to a slower lane (historical
//! imports, spiking distinct ids) into that lane's tree, removes them from the log and
//! advances the checkpoint. sled recovers a transaction entirely or not at all, so a
//! kill at any instant leaves every record either still in the log or applied once.
//! Records are also deduplicated by uuid, so a client's retry is not stored twice.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};
use sled::IVec;

use super::apply::{self, ProjectSettings, Tx};
use super::overflow::Limiter;
use super::{keys, Record, Trees};
use crate::projects::Projects;

/// Log records per realtime step: large enough to amortise a transaction, small
/// enough that one step stays in the low milliseconds.
const REALTIME_CHUNK: usize = 1024;
/// Records per step from each slower lane: they progress even while realtime is
/// saturated, at a quarter of its pace.
const LANE_CHUNK: usize = 256;
/// With nothing to do, look again after this long (the lag floor at low load).
const IDLE_WAIT: Duration = Duration::from_millis(5);
/// After a storage error, wait before retrying the same step.
const ERROR_BACKOFF: Duration = Duration::from_millis(500);
/// How often old events are deleted.
const RETENTION_INTERVAL: Duration = Duration::from_secs(600);
/// Events deleted per retention batch, so the pass never holds much in memory.
const RETENTION_BATCH: usize = 10_000;
const DAY_MS: i64 = 24 * 60 * 60 * 1000;

pub const CHECKPOINT_KEY: &[u8] = b"compactor.applied_seq";

#[derive(Debug, Clone)]
pub struct Settings {
    /// Spike detection: tokens per second and burst per (project, distinct id).
    pub overflow_rate: f64,
    pub overflow_burst: f64,
    /// Events older than this many days are deleted; 0 keeps them forever.
    pub retention_days: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            overflow_rate: super::overflow::DEFAULT_RATE_PER_SECOND,
            overflow_burst: super::overflow::DEFAULT_BURST,
            retention_days: DEFAULT_RETENTION_DAYS,
        }
    }
}

/// A year: long enough for product questions, bounded so the disk is too.
pub const DEFAULT_RETENTION_DAYS: u32 = 365;

/// Counters for metrics and readiness.
#[derive(Debug, Default)]
pub struct Stats {
    pub applied: AtomicU64,
    pub duplicates: AtomicU64,
    pub to_overflow: AtomicU64,
    pub to_historical: AtomicU64,
    pub corrupt: AtomicU64,
    pub retention_deleted: AtomicU64,
    pub steps: AtomicU64,
    /// Milliseconds between now and the arrival of the oldest record still in the log.
    pub lag_ms: AtomicI64,
    /// False while steps fail; the server then stops acknowledging writes.
    pub healthy: AtomicBool,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StepReport {
    pub realtime: usize,
    pub historical: usize,
    pub overflow: usize,
}

impl StepReport {
    pub fn is_idle(&self) -> bool {
        self.realtime + self.historical + self.overflow == 0
    }
}

/// Which tree a chunk was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Log,
    Historical,
    Overflow,
}

/// What happens to one record of a chunk.
enum Action {
    Apply(Box<Record>),
    ToHistorical,
    ToOverflow,
    Quarantine,
}

struct Item {
    key: IVec,
    value: IVec,
    action: Action,
}

pub struct Compactor {
    trees: Trees,
    limiter: Limiter,
    projects: Arc<ArcSwap<Projects>>,
    stats: Arc<Stats>,
    settings: Settings,
    geoip: Arc<crate::geoip::Database>,
    /// Test hook: fail the transaction after this many records of the next chunk.
    #[cfg(test)]
    pub fail_after: Option<usize>,
}

impl Compactor {
    pub fn new(
        trees: Trees,
        projects: Arc<ArcSwap<Projects>>,
        settings: Settings,
        geoip: Arc<crate::geoip::Database>,
    ) -> Compactor {
        Compactor {
            geoip,
            limiter: Limiter::new(settings.overflow_rate, settings.overflow_burst),
            trees,
            projects,
            stats: Arc::new(Stats {
                healthy: AtomicBool::new(true),
                ..Stats::default()
            }),
            settings,
            #[cfg(test)]
            fail_after: None,
        }
    }

    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// One pass: a chunk of the log, then a smaller chunk of each slower lane.
    pub fn step(&mut self) -> Result<StepReport, sled::Error> {
        let mut report = StepReport::default();
        let log = read_chunk(&self.trees.wal, REALTIME_CHUNK)?;
        if !log.is_empty() {
            let items: Vec<Item> = log.into_iter().map(|(k, v)| self.route(k, v)).collect();
            report.realtime = self.commit(Source::Log, &items)?;
        }
        for (source, tree) in [
            (Source::Historical, self.trees.historical.clone()),
            (Source::Overflow, self.trees.overflow.clone()),
        ] {
            let chunk = read_chunk(&tree, LANE_CHUNK)?;
            if chunk.is_empty() {
                continue;
            }
            let items: Vec<Item> = chunk
                .into_iter()
                .map(|(key, value)| Item {
                    action: decode(&value),
                    key,
                    value,
                })
                .collect();
            let n = self.commit(source, &items)?;
            match source {
                Source::Historical => report.historical = n,
                _ => report.overflow = n,
            }
        }
        self.stats.steps.fetch_add(1, Ordering::Relaxed);
        self.stats.lag_ms.store(self.lag()?, Ordering::Relaxed);
        Ok(report)
    }

    /// Where a fresh log record goes: its own lane if historical, overflow if its
    /// distinct id is spiking, else applied now.
    fn route(&mut self, key: IVec, value: IVec) -> Item {
        let action = match decode(&value) {
            Action::Apply(r) if r.historical => Action::ToHistorical,
            Action::Apply(r) if !self.limiter.allow(r.project, &r.distinct_id, r.received_at) => {
                Action::ToOverflow
            }
            other => other,
        };
        Item { key, value, action }
    }

    /// Apply a chunk in one transaction; returns how many records it consumed.
    fn commit(&mut self, source: Source, items: &[Item]) -> Result<usize, sled::Error> {
        let settings = self.project_settings(items);
        let geoip = &*self.geoip;
        #[cfg(test)]
        let fail_after = self.fail_after.take();
        #[cfg(not(test))]
        let fail_after: Option<usize> = None;
        let t = &self.trees;
        let trees = (
            &t.wal,
            &t.historical,
            &t.overflow,
            &t.events,
            &t.event_ids,
            &t.persons,
            &t.distinct_ids,
            &t.groups,
            &t.group_types,
            &t.meta,
            &t.quarantine,
        );
        let outcome = trees.transaction(
            |(
                wal,
                historical,
                overflow,
                events,
                event_ids,
                persons,
                distinct_ids,
                groups,
                group_types,
                meta,
                quarantine,
            )| {
                let tx = Tx {
                    events,
                    event_ids,
                    persons,
                    distinct_ids,
                    groups,
                    group_types,
                };
                let from = match source {
                    Source::Log => wal,
                    Source::Historical => historical,
                    Source::Overflow => overflow,
                };
                let mut counts = Counts::default();
                for (i, item) in items.iter().enumerate() {
                    if fail_after == Some(i) {
                        return Err(ConflictableTransactionError::Abort(()));
                    }
                    from.remove(&item.key)?;
                    match &item.action {
                        Action::Apply(record) => {
                            let s = settings.get(&record.project).copied().unwrap_or_default();
                            if apply::record(&tx, record, s, geoip)? {
                                counts.applied += 1;
                            } else {
                                counts.duplicates += 1;
                            }
                        }
                        Action::ToHistorical => {
                            historical.insert(&item.key, item.value.clone())?;
                            counts.historical += 1;
                        }
                        Action::ToOverflow => {
                            overflow.insert(&item.key, item.value.clone())?;
                            counts.overflow += 1;
                        }
                        Action::Quarantine => {
                            quarantine.insert(&item.key, item.value.clone())?;
                            counts.corrupt += 1;
                        }
                    }
                }
                if let (Source::Log, Some(last)) = (source, items.last()) {
                    meta.insert(CHECKPOINT_KEY, &last.key)?;
                }
                Ok(counts)
            },
        );
        let counts = match outcome {
            Ok(c) => c,
            Err(TransactionError::Abort(())) => {
                return Err(sled::Error::ReportableBug(
                    "injected compactor failure".into(),
                ))
            }
            Err(TransactionError::Storage(e)) => return Err(e),
        };
        let s = &self.stats;
        s.applied.fetch_add(counts.applied, Ordering::Relaxed);
        s.duplicates.fetch_add(counts.duplicates, Ordering::Relaxed);
        s.to_historical
            .fetch_add(counts.historical, Ordering::Relaxed);
        s.to_overflow.fetch_add(counts.overflow, Ordering::Relaxed);
        s.corrupt.fetch_add(counts.corrupt, Ordering::Relaxed);
        if counts.corrupt > 0 {
            tracing::error!(
                records = counts.corrupt,
                "undecodable log records moved to the quarantine tree"
            );
        }
        Ok(items.len())
    }

    fn project_settings(&self, items: &[Item]) -> HashMap<u64, ProjectSettings> {
        let projects = self.projects.load();
        let mut out = HashMap::new();
        for item in items {
            if let Action::Apply(r) = &item.action {
                out.entry(r.project).or_insert_with(|| {
                    projects
                        .by_id(r.project)
                        .map_or_else(ProjectSettings::default, |p| ProjectSettings {
                            anonymize_ips: p.anonymize_ips,
                        })
                });
            }
        }
        out
    }

    /// Age of the oldest record still waiting in the log.
    fn lag(&self) -> Result<i64, sled::Error> {
        Ok(match self.trees.wal.first()? {
            Some((_, v)) => match Record::decode(&v) {
                Ok(r) => (crate::http::capture::now_ms() - r.received_at).max(0),
                Err(_) => 0,
            },
            None => 0,
        })
    }

    /// Delete events older than the retention period; returns how many.
    pub fn enforce_retention(&self, now: i64) -> Result<u64, sled::Error> {
        if self.settings.retention_days == 0 {
            return Ok(0);
        }
        let cutoff = now - i64::from(self.settings.retention_days) * DAY_MS;
        let mut deleted = 0u64;
        let mut next_project = Some(0u64);
        while let Some(start) = next_project {
            // The first event key past `start`'s prefix names the next project.
            let Some((key, _)) = self.trees.events.get_gt(keys::project(start))? else {
                break;
            };
            let Some(project) = key
                .get(..8)
                .and_then(|p| p.try_into().ok())
                .map(u64::from_be_bytes)
            else {
                break;
            };
            let lo = keys::event_bound(project, i64::MIN);
            let hi = keys::event_bound(project, cutoff);
            loop {
                let batch: Vec<IVec> = self
                    .trees
                    .events
                    .range(lo..hi)
                    .keys()
                    .take(RETENTION_BATCH)
                    .collect::<Result<_, _>>()?;
                if batch.is_empty() {
                    break;
                }
                let mut events = sled::Batch::default();
                let mut ids = sled::Batch::default();
                for k in &batch {
                    events.remove(k);
                    if let Some((_, uuid)) = keys::split_event(k) {
                        ids.remove(&keys::with_uuid(project, uuid)[..]);
                    }
                }
                self.trees.events.apply_batch(events)?;
                self.trees.event_ids.apply_batch(ids)?;
                deleted += batch.len() as u64;
            }
            next_project = project.checked_add(1);
        }
        self.stats
            .retention_deleted
            .fetch_add(deleted, Ordering::Relaxed);
        if deleted > 0 {
            tracing::info!(
                deleted,
                days = self.settings.retention_days,
                "retention: deleted old events"
            );
        }
        Ok(deleted)
    }
}

#[derive(Default)]
struct Counts {
    applied: u64,
    duplicates: u64,
    historical: u64,
    overflow: u64,
    corrupt: u64,
}

fn decode(value: &[u8]) -> Action {
    match Record::decode(value) {
        Ok(r) => Action::Apply(Box::new(r)),
        Err(_) => Action::Quarantine,
    }
}

fn read_chunk(tree: &sled::Tree, n: usize) -> Result<Vec<(IVec, IVec)>, sled::Error> {
    tree.iter().take(n).collect()
}

/// The compactor's thread; stop it at shutdown.
pub struct Handle {
    thread: JoinHandle<()>,
    stop: Arc<AtomicBool>,
}

impl Handle {
    /// Finish the current step and stop. What is left in the log is applied at the
    /// next start.
    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.thread().unpark();
        if self.thread.join().is_err() {
            tracing::error!("compactor thread panicked");
        }
    }
}

/// Run the compactor on its own thread until stopped. A failing step marks the
/// compactor unhealthy (the server then refuses new writes) and is retried; a panic
/// stops it for good rather than risk applying a chunk twice or half.
pub fn spawn(mut compactor: Compactor) -> std::io::Result<Handle> {
    let stop = Arc::new(AtomicBool::new(false));
    let stop_flag = stop.clone();
    let thread = std::thread::Builder::new().name("compactor".into()).spawn(move || {
        let stats = compactor.stats();
        let mut last_retention: Option<Instant> = None;
        while !stop_flag.load(Ordering::SeqCst) {
            if last_retention.is_none_or(|t| t.elapsed() >= RETENTION_INTERVAL) {
                last_retention = Some(Instant::now());
                if let Err(e) = compactor.enforce_retention(crate::http::capture::now_ms()) {
                    tracing::error!(error = %e, "retention pass failed");
                }
            }
            match std::panic::catch_unwind(AssertUnwindSafe(|| compactor.step())) {
                Ok(Ok(report)) => {
                    if !stats.healthy.swap(true, Ordering::SeqCst) {
                        tracing::info!("compactor recovered");
                    }
                    if report.is_idle() {
                        std::thread::park_timeout(IDLE_WAIT);
                    }
                }
                Ok(Err(e)) => {
                    if stats.healthy.swap(false, Ordering::SeqCst) {
                        tracing::error!(error = %e, "compactor step failed; refusing new events until it succeeds");
                    }
                    std::thread::park_timeout(ERROR_BACKOFF);
                }
                Err(_) => {
                    stats.healthy.store(false, Ordering::SeqCst);
                    tracing::error!("compactor panicked; refusing new events until restart");
                    return;
                }
            }
        }
    })?;
    Ok(Handle { thread, stop })
}

#[cfg(test)]
#[path = "compactor_tests.rs"]
mod tests;
