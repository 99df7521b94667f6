//! The compactor: a background thread that turns the write-ahead log into stored
//! events, persons and groups, in order and exactly once.
//!
//! Each [`Compactor::step`] takes a chunk of the log and, in ONE sled transaction,
//! applies the records, moves the ones that belong to a slower lane (historical
//! imports, spiking distinct ids) into that lane's tree and advances the checkpoint.
//! sled recovers a transaction entirely or not at all, and the log's files are
//! recycled only once a checkpoint past them is durable, so a kill at any instant
//! leaves every record either still ahead of the checkpoint or applied once.
//! A chunk's events are stored as a few [`block`]s (one sled key each, not one per
//! event), and records are deduplicated by uuid against a [`dedup::Window`] of recent
//! uuids, persisted in the same transaction, so a client's retry is not stored twice.

use std::collections::HashMap;
use std::net::IpAddr;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};
use sled::IVec;

use super::apply::{self, ProjectSettings, Tx};
use super::cache::Cache;
use super::dedup::{self, IdSet};
use super::log;
use super::memo::{self, Memo};
use super::overflow::Limiter;
use super::person_cache::{self, PersonCache};
use super::record::decode_frame;
use super::{block, keys, Record, Trees};
use crate::projects::Projects;
use crate::sink;

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
/// Blocks deleted per retention batch, so the pass never holds much in memory.
const RETENTION_BATCH: usize = 256;
const DAY_MS: i64 = 24 * 60 * 60 * 1000;

pub const CHECKPOINT_KEY: &[u8] = b"compactor.applied_seq";
/// The next block id (u64 big-endian), advanced in each chunk's transaction.
pub const NEXT_BLOCK_KEY: &[u8] = b"events.next_block";

#[derive(Debug, Clone)]
pub struct Settings {
    /// Spike detection: tokens per second and burst per (project, distinct id).
    pub overflow_rate: f64,
    pub overflow_burst: f64,
    /// Events older than this many days are deleted; 0 keeps them forever.
    pub retention_days: u32,
    /// The deduplication window: a uuid stored this recently (milliseconds) and
    /// among the last `dedup_max_ids` stored is not stored again.
    pub dedup_max_age_ms: i64,
    pub dedup_max_ids: usize,
    /// The compactor thread's nice value (0 to 19): above 0, request handling comes
    /// first when the cores are busy, and the compactor catches up when they are not.
    pub nice: i32,
    /// Record each chunk's changes in the ClickHouse sink's outbox (`--clickhouse-url`).
    pub sink: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            overflow_rate: super::overflow::DEFAULT_RATE_PER_SECOND,
            overflow_burst: super::overflow::DEFAULT_BURST,
            retention_days: DEFAULT_RETENTION_DAYS,
            dedup_max_age_ms: dedup::DEFAULT_MAX_AGE_MS,
            dedup_max_ids: dedup::DEFAULT_MAX_IDS,
            nice: DEFAULT_NICE,
            sink: false,
        }
    }
}

/// Under contention the compactor yields the cores to requests: with it at 0, capture
/// measured 12 to 18% fewer requests/s in four runs, and the compactor still keeps
/// up with 100,000 events/s at 10 (BENCHMARKS.md).
pub const DEFAULT_NICE: i32 = 10;

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

/// What happens to one record of a chunk. The slower lanes and the quarantine keep
/// the record's bytes.
enum Action {
    Apply(Box<Record>),
    ToHistorical(Vec<u8>),
    ToOverflow(Vec<u8>),
    Quarantine(Vec<u8>),
}

struct Item {
    /// The record's key in a lane tree: its log entry's sequence number, then its
    /// index in the entry, so lanes keep log order.
    lane_key: [u8; 12],
    action: Action,
}

/// Records read from the log or a lane tree, and what to remove or advance once they
/// are applied.
#[derive(Default)]
struct Chunk {
    /// Keys to remove from the tree read (a lane, or the log tree of earlier versions).
    consumed: Vec<IVec>,
    /// The first and last log entries in the chunk: where to read again if it
    /// fails, and the checkpoint if it is applied.
    first_seq: Option<u64>,
    last_seq: Option<u64>,
    items: Vec<Item>,
}

impl Chunk {
    fn is_empty(&self) -> bool {
        self.consumed.is_empty() && self.last_seq.is_none()
    }
}

fn lane_key(entry: &[u8], index: usize) -> [u8; 12] {
    let mut k = [0u8; 12];
    let n = entry.len().min(8);
    k[..n].copy_from_slice(&entry[..n]);
    k[8..].copy_from_slice(&(index as u32).to_be_bytes());
    k
}

/// What the compactor keeps between steps, read from the database at the first.
struct State {
    window: dedup::Window,
    next_block: u64,
}

pub struct Compactor {
    trees: Trees,
    log: log::Reader,
    /// Arrival time of the last record applied from the log, for the lag.
    last_received: Option<i64>,
    /// Told what each chunk changed of persons, if `/decide` caches them.
    person_cache: Option<Arc<PersonCache>>,
    /// Links and persons' last operations, from the chunks committed before.
    memo: Memo,
    /// Test hook: apply every chunk without the memo, as the reference it must match.
    #[cfg(test)]
    memo_off: bool,
    state: Option<State>,
    limiter: Limiter,
    projects: Arc<ArcSwap<Projects>>,
    stats: Arc<Stats>,
    settings: Settings,
    geoip: Arc<crate::geoip::Database>,
    /// Test hook: fail the next transaction on this tree after this many records.
    #[cfg(test)]
    fail_at: Option<(Source, usize)>,
}

impl Compactor {
    pub fn new(
        trees: Trees,
        log: log::Reader,
        projects: Arc<ArcSwap<Projects>>,
        settings: Settings,
        geoip: Arc<crate::geoip::Database>,
    ) -> Compactor {
        Compactor {
            geoip,
            limiter: Limiter::new(settings.overflow_rate, settings.overflow_burst),
            trees,
            log,
            last_received: None,
            person_cache: None,
            memo: Memo::default(),
            #[cfg(test)]
            memo_off: false,
            state: None,
            projects,
            stats: Arc::new(Stats {
                healthy: AtomicBool::new(true),
                ..Stats::default()
            }),
            settings,
            #[cfg(test)]
            fail_at: None,
        }
    }

    /// Tell `cache` what each committed chunk changed of persons.
    pub fn with_person_cache(mut self, cache: Arc<PersonCache>) -> Compactor {
        self.person_cache = Some(cache);
        self
    }

    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// The deduplication window and block counter as committed; read once.
    fn load_state(&mut self) -> Result<(), sled::Error> {
        if self.state.is_some() {
            return Ok(());
        }
        let next_block = self
            .trees
            .meta
            .get(NEXT_BLOCK_KEY)?
            .and_then(|v| v.as_ref().try_into().ok())
            .map_or(0, u64::from_be_bytes);
        let s = &self.settings;
        let window = dedup::Window::load(
            &self.trees.recent_ids,
            s.dedup_max_age_ms,
            s.dedup_max_ids,
            crate::http::capture::now_ms(),
        )?;
        tracing::debug!(uuids = window.len(), "deduplication window loaded");
        self.state = Some(State { window, next_block });
        Ok(())
    }

    /// One pass: a chunk of the log, then a smaller chunk of each slower lane.
    pub fn step(&mut self) -> Result<StepReport, sled::Error> {
        self.load_state()?;
        let mut report = StepReport::default();
        let chunk = self.read_log()?;
        if !chunk.is_empty() {
            report.realtime = match self.commit(Source::Log, &chunk) {
                Ok(n) => n,
                Err(e) => {
                    // Read the chunk again at the next step.
                    if let Some(first) = chunk.first_seq {
                        self.log.seek(first).map_err(io)?;
                    }
                    return Err(e);
                }
            };
            if let Some(applied) = chunk.last_seq {
                self.release_log(applied)?;
            }
        }
        for (source, tree) in [
            (Source::Historical, self.trees.historical.clone()),
            (Source::Overflow, self.trees.overflow.clone()),
        ] {
            let chunk = read_lane(&tree)?;
            if chunk.is_empty() {
                continue;
            }
            let n = self.commit(source, &chunk)?;
            match source {
                Source::Historical => report.historical = n,
                _ => report.overflow = n,
            }
        }
        self.stats.steps.fetch_add(1, Ordering::Relaxed);
        self.stats.lag_ms.store(self.lag()?, Ordering::Relaxed);
        Ok(report)
    }

    /// Whole log entries, up to about [`REALTIME_CHUNK`] records, each routed: its own
    /// lane if historical, overflow if its distinct id is spiking, else applied now.
    /// Entries left in the log tree of an earlier version come first.
    fn read_log(&mut self) -> Result<Chunk, sled::Error> {
        let mut chunk = Chunk::default();
        for entry in self.trees.wal.iter() {
            let (key, value) = entry?;
            self.route_entry(&mut chunk, &key, &value);
            chunk.consumed.push(key);
            if chunk.items.len() >= REALTIME_CHUNK {
                return Ok(chunk);
            }
        }
        if !chunk.is_empty() {
            return Ok(chunk);
        }
        let mut records = 0usize;
        let entries = self
            .log
            .next_entries(|entry| {
                records += super::record::frame_len(&entry.bytes).unwrap_or(1);
                records >= REALTIME_CHUNK
            })
            .map_err(io)?;
        for entry in entries {
            let key = entry.seq.to_be_bytes();
            if entry.intact {
                self.route_entry(&mut chunk, &key, &entry.bytes);
            } else {
                chunk.items.push(Item {
                    lane_key: lane_key(&key, 0),
                    action: Action::Quarantine(entry.bytes),
                });
            }
            chunk.first_seq.get_or_insert(entry.seq);
            chunk.last_seq = Some(entry.seq);
        }
        Ok(chunk)
    }

    /// Decode one log entry into the chunk's items.
    fn route_entry(&mut self, chunk: &mut Chunk, key: &[u8], value: &[u8]) {
        let Ok(records) = decode_frame(value) else {
            chunk.items.push(Item {
                lane_key: lane_key(key, 0),
                action: Action::Quarantine(value.to_vec()),
            });
            return;
        };
        for (index, bytes) in records.into_iter().enumerate() {
            let decoded = decode(bytes);
            if let Action::Apply(r) = &decoded {
                self.last_received = Some(r.received_at);
            }
            let action = match decoded {
                Action::Apply(r) if r.historical => Action::ToHistorical(bytes.to_vec()),
                Action::Apply(r)
                    if !self.limiter.allow(r.project, &r.distinct_id, r.received_at) =>
                {
                    Action::ToOverflow(bytes.to_vec())
                }
                other => other,
            };
            chunk.items.push(Item {
                lane_key: lane_key(key, index),
                action,
            });
        }
    }

    /// Recycle the log's segments the compactor has moved past, once its checkpoint
    /// past them (`applied`, just committed) is durable.
    fn release_log(&mut self, applied: u64) -> Result<(), sled::Error> {
        if !self.log.releasable() {
            return Ok(());
        }
        self.trees.meta.flush()?;
        self.log.release(applied).map_err(io)?;
        Ok(())
    }

    /// Apply a chunk in one transaction; returns how many records it consumed.
    fn commit(&mut self, source: Source, chunk: &Chunk) -> Result<usize, sled::Error> {
        let items = &chunk.items;
        let settings = self.project_settings(items);
        let geo = self.geo(items);
        #[cfg(test)]
        let fail_after = match self.fail_at {
            Some((tree, at)) if tree == source => {
                self.fail_at = None;
                Some(at)
            }
            _ => None,
        };
        #[cfg(not(test))]
        let fail_after: Option<usize> = None;
        let Some(state) = self.state.as_mut() else {
            return Err(sled::Error::ReportableBug(
                "compactor state not loaded".into(),
            ));
        };
        let (window, first_block) = (&state.window, state.next_block);
        let memo = &self.memo;
        #[cfg(test)]
        let memo_off = self.memo_off;
        #[cfg(not(test))]
        let memo_off = false;
        // The window's age counts from when a uuid was stored.
        let now = crate::http::capture::now_ms();
        let t = &self.trees;
        let trees = (
            &t.wal,
            &t.historical,
            &t.overflow,
            &t.events,
            &t.recent_ids,
            &t.persons,
            &t.distinct_ids,
            &t.groups,
            &t.group_types,
            &t.meta,
            &t.quarantine,
            &t.outbox,
        );
        let to_outbox = self.settings.sink;
        let outcome = trees.transaction(
            |(
                wal,
                historical,
                overflow,
                events,
                recent_ids,
                persons,
                distinct_ids,
                groups,
                group_types,
                meta,
                quarantine,
                outbox,
            )| {
                let tx = Tx {
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
                let mut cache = match memo_off {
                    false => Cache::with_memo(memo),
                    true => Cache::default(),
                };
                let mut seen = IdSet::default();
                let mut entries: HashMap<u64, Vec<block::Entry>> = HashMap::new();
                for key in &chunk.consumed {
                    from.remove(key)?;
                }
                for (i, item) in items.iter().enumerate() {
                    if fail_after == Some(i) {
                        return Err(ConflictableTransactionError::Abort(()));
                    }
                    match &item.action {
                        Action::Apply(record) => {
                            let id = (record.project, record.uuid.as_u128());
                            if window.contains(id) || !seen.insert(id) {
                                counts.duplicates += 1;
                                continue;
                            }
                            let s = settings.get(&record.project).copied().unwrap_or_default();
                            let g = record.ip.and_then(|ip| geo.get(&ip));
                            let entry = apply::record(&tx, &mut cache, record, s, g)?;
                            entries.entry(record.project).or_default().push(entry);
                            counts.applied += 1;
                        }
                        Action::ToHistorical(bytes) => {
                            historical.insert(&item.lane_key[..], bytes.as_slice())?;
                            counts.historical += 1;
                        }
                        Action::ToOverflow(bytes) => {
                            overflow.insert(&item.lane_key[..], bytes.as_slice())?;
                            counts.overflow += 1;
                        }
                        Action::Quarantine(bytes) => {
                            quarantine.insert(&item.lane_key[..], bytes.as_slice())?;
                            counts.corrupt += 1;
                        }
                    }
                }
                cache.write(&tx)?;
                (counts.persons, counts.learned) = cache.into_reports();
                let mut next_block = first_block;
                let mut written = Vec::new();
                for (project, list) in entries {
                    for (newest, value) in block::build(list) {
                        let key = keys::block(project, newest, next_block);
                        events.insert(&key[..], value)?;
                        written.push(key);
                        next_block += 1;
                    }
                }
                // The ClickHouse sink: what this chunk changed, in this transaction.
                if to_outbox {
                    let done = sink::Committed::of(now, &written, counts.applied, &counts.persons);
                    sink::outbox::record(outbox, &done)?;
                }
                if next_block != first_block {
                    meta.insert(NEXT_BLOCK_KEY, &next_block.to_be_bytes()[..])?;
                }
                counts.ids = seen.into_iter().collect();
                if !counts.ids.is_empty() {
                    let key = keys::recent(now, first_block);
                    recent_ids.insert(&key[..], dedup::encode(&counts.ids))?;
                }
                counts.next_block = next_block;
                if source == Source::Log {
                    let last = chunk.last_seq.map(u64::to_be_bytes);
                    match (last, chunk.consumed.last()) {
                        (Some(seq), _) => meta.insert(CHECKPOINT_KEY, &seq[..])?,
                        (None, Some(key)) => meta.insert(CHECKPOINT_KEY, key)?,
                        (None, None) => None,
                    };
                }
                Ok(counts)
            },
        );
        let mut counts = match outcome {
            Ok(c) => c,
            Err(TransactionError::Abort(())) => {
                return Err(sled::Error::ReportableBug(
                    "injected compactor failure".into(),
                ))
            }
            Err(TransactionError::Storage(e)) => return Err(e),
        };
        state.next_block = counts.next_block;
        self.memo.learn(std::mem::take(&mut counts.learned));
        if let Some(persons) = &self.person_cache {
            persons.forget(&counts.persons);
        }
        if !counts.ids.is_empty() {
            let key = sled::IVec::from(&keys::recent(now, first_block)[..]);
            state
                .window
                .insert(key, now, &counts.ids, now)
                .apply(&self.trees.recent_ids)?;
        }
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

    /// The GeoIP properties of every address in the chunk, each looked up once: a
    /// chunk's events often come from a few clients.
    fn geo(&self, items: &[Item]) -> HashMap<IpAddr, apply::Geo> {
        let mut out = HashMap::new();
        for item in items {
            if let Action::Apply(r) = &item.action {
                if let Some(ip) = r.ip {
                    out.entry(ip)
                        .or_insert_with(|| apply::Geo::new(self.geoip.lookup(ip)).with_ip(ip));
                }
            }
        }
        out
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

    /// Age of the oldest record still waiting in the log. For the log's files, the
    /// age of the last record read stands in: the next one arrived no earlier.
    fn lag(&self) -> Result<i64, sled::Error> {
        let now = crate::http::capture::now_ms();
        if let Some((_, entry)) = self.trees.wal.first()? {
            let oldest = decode_frame(&entry)
                .ok()
                .and_then(|records| Record::decode(records.first()?).ok());
            return Ok(oldest.map_or(0, |r| (now - r.received_at).max(0)));
        }
        if self.log.shared().depth() == 0 {
            return Ok(0);
        }
        Ok(self.last_received.map_or(0, |t| (now - t).max(0)))
    }

    /// Delete the blocks whose newest event is older than the retention period (so
    /// an event may outlive it by up to a block's span); returns how many events.
    pub fn enforce_retention(&self, now: i64) -> Result<u64, sled::Error> {
        if self.settings.retention_days == 0 {
            return Ok(0);
        }
        let cutoff = now - i64::from(self.settings.retention_days) * DAY_MS;
        // The ClickHouse sink: blocks it has not sent yet are kept (src/sink/retention.rs).
        let keep_from = match self.settings.sink {
            true => sink::retention::keep_from(&self.trees.outbox)?,
            false => None,
        };
        let mut deleted = 0u64;
        let mut next_project = Some(0u64);
        while let Some(start) = next_project {
            // The first block key at or past `start`'s prefix names the next project.
            let Some((key, _)) = self.trees.events.get_gt(keys::project(start))? else {
                break;
            };
            let Some((project, _)) = keys::split_block(&key) else {
                break;
            };
            let mut lo = keys::event_bound(project, i64::MIN).to_vec();
            let hi = keys::event_bound(project, cutoff).to_vec();
            loop {
                let batch: Vec<(IVec, IVec)> = self
                    .trees
                    .events
                    .range(lo.clone()..hi.clone())
                    .take(RETENTION_BATCH)
                    .collect::<Result<_, _>>()?;
                let Some((last, _)) = batch.last() else {
                    break;
                };
                // Past the batch's last key: kept blocks are not met again.
                lo = [last.as_ref(), &[0]].concat();
                let mut blocks = sled::Batch::default();
                for (k, v) in &batch {
                    if sink::retention::held(k, keep_from) {
                        continue;
                    }
                    deleted += u64::from(block::count(v).unwrap_or(0));
                    blocks.remove(k);
                }
                self.trees.events.apply_batch(blocks)?;
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
    /// The uuids stored, and the block id after the chunk's.
    ids: Vec<dedup::Id>,
    /// Distinct ids linked and persons written, for the decide cache.
    persons: person_cache::Changes,
    /// What the chunk read and changed of persons, for the memo.
    learned: memo::Learned,
    next_block: u64,
    applied: u64,
    duplicates: u64,
    historical: u64,
    overflow: u64,
    corrupt: u64,
}

fn io(e: std::io::Error) -> sled::Error {
    sled::Error::Io(e)
}

fn decode(value: &[u8]) -> Action {
    match Record::decode(value) {
        Ok(r) => Action::Apply(Box::new(r)),
        Err(_) => Action::Quarantine(value.to_vec()),
    }
}

/// Up to [`LANE_CHUNK`] records of a slower lane, in order.
fn read_lane(tree: &sled::Tree) -> Result<Chunk, sled::Error> {
    let mut chunk = Chunk::default();
    for entry in tree.iter().take(LANE_CHUNK) {
        let (key, value) = entry?;
        // Lane keys are already (entry, index); keep them for the quarantine.
        let mut lane_key = [0u8; 12];
        let n = key.len().min(12);
        lane_key[..n].copy_from_slice(&key[..n]);
        chunk.items.push(Item {
            lane_key,
            action: decode(&value),
        });
        chunk.consumed.push(key);
    }
    Ok(chunk)
}

/// Lower the calling thread's scheduling priority to `nice` (Linux keeps one per
/// thread). Failure only costs throughput, so it is logged, not fatal.
fn lower_priority(nice: i32) {
    if nice <= 0 {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid takes no arguments; setpriority takes integers and changes
        // only this thread's nice value.
        let rc = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice.min(19))
        };
        if rc != 0 {
            tracing::warn!(
                error = %std::io::Error::last_os_error(),
                "cannot lower the compactor's priority"
            );
        }
    }
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
        lower_priority(compactor.settings.nice);
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
                        crate::idle::idle();
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
