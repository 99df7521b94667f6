//! The compactor: a background thread that turns the write-ahead log into stored
//! events, persons and groups, in order and exactly once. It reads [`crate::log`] and
//! writes [`crate::store`]; nothing below it knows it exists.
//!
//! The files, in the order a record meets them: `worker.rs` (the thread's loop),
//! `step.rs` (one pass and its transaction), `chunk.rs` (reading a chunk of the log or
//! a lane, routing records), [`overflow`] (spike detection for the overflow lane),
//! `apply.rs` (one record: persons and groups, the event shaped for its block) through
//! `splice.rs` (event JSON edited as text, `raw.rs`) or a `serde_json::Value`, with
//! `enrich.rs` (GeoIP, IP settings) and `groups.rs`; `cache.rs` (what one chunk read
//! and changed) and `memo.rs` (what the compactor remembers between chunks);
//! `blocks.rs` (a chunk's event blocks, made on a thread of their own while the
//! transaction goes on); `retention.rs` (deleting old blocks).
//!
//! Each [`Compactor::step`] takes a chunk of the log and, in ONE sled transaction,
//! applies the records, moves the ones that belong to a slower lane (historical
//! imports, spiking distinct ids) into that lane's tree and advances the checkpoint.
//! sled recovers a transaction entirely or not at all, and the log's files are recycled
//! only once a checkpoint past them is durable, so a kill at any instant leaves every
//! record either still ahead of the checkpoint or applied once. A chunk's events are
//! stored as a few [`block`](crate::store::block)s (one sled key each, not one per
//! event), and records are deduplicated by uuid against a
//! [`Window`](crate::store::dedup::Window) of recent uuids (the store keeps it: the
//! migration seeds it too), persisted in the same transaction, so a client's retry is
//! not stored twice.

mod apply;
mod blocks;
mod cache;
mod chunk;
mod enrich;
mod error;
mod fold;
mod groups;
mod memo;
pub mod overflow;
mod phases;
mod raw;
mod retention;
mod splice;
mod step;
mod worker;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64};
use std::sync::Arc;

use arc_swap::ArcSwap;

use memo::Memo;
use overflow::Limiter;
use step::State;

use crate::config::Compaction;
use crate::log;
use crate::projects::Projects;
use crate::store::person_cache::PersonCache;
use crate::store::{keys, Trees};

pub use cache::{by_property_writes, BY_PROPERTY_WRITES};
pub use error::Error;
pub use worker::{spawn, Handle};

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
    /// About the bytes the deduplication window and the memo take, as of the last step.
    pub window_bytes: AtomicU64,
    pub memo_bytes: AtomicU64,
    /// The overflow limiter's map ([`Limiter::footprint`]), as of the last step or rest.
    pub limiter_bytes: AtomicU64,
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

pub struct Compactor {
    trees: Trees,
    intake: chunk::Intake,
    /// The log's next chunk, read while the last one's blocks were being synced
    /// (`step.rs`): applied by the next step unless that chunk failed.
    ahead: Option<chunk::Chunk>,
    /// Told what each chunk changed of persons, if `/decide` caches them.
    person_cache: Option<Arc<PersonCache>>,
    /// Links and persons' last operations, from the chunks committed before.
    memo: Memo,
    /// Test hook: apply every chunk without the memo, as the reference it must match.
    #[cfg(test)]
    memo_off: bool,
    state: Option<State>,
    projects: Arc<ArcSwap<Projects>>,
    stats: Arc<Stats>,
    settings: Compaction,
    geoip: Arc<crate::geoip::Database>,
    /// When the layered tables are next folded, and the thread that folds them ([`fold`]).
    folds: fold::Schedule,
    /// The thread each chunk's event blocks are made on ([`blocks`]).
    builder: blocks::Builder,
    /// Where the thread's time goes, for the debug log.
    phases: phases::Phases,
    /// Test hook: fail the next transaction on this tree after this many records.
    #[cfg(test)]
    fail_at: Option<(chunk::Source, usize)>,
    /// Test hook: the next log transaction meets a conflict after this many records,
    /// once, so sled runs it again.
    #[cfg(test)]
    conflict_at: Option<usize>,
}

impl Compactor {
    pub fn new(
        trees: Trees,
        log: log::Reader,
        projects: Arc<ArcSwap<Projects>>,
        settings: Compaction,
        geoip: Arc<crate::geoip::Database>,
    ) -> Compactor {
        Compactor {
            geoip,
            builder: blocks::Builder::new(settings.nice),
            intake: chunk::Intake {
                log,
                last_received: None,
                limiter: Limiter::new(settings.overflow_rate, settings.overflow_burst),
                keys: Vec::new(),
            },
            ahead: None,
            trees,
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
            folds: fold::Schedule::new(settings.nice, settings.delta_budget_bytes),
            settings,
            phases: phases::Phases::default(),
            #[cfg(test)]
            fail_at: None,
            #[cfg(test)]
            conflict_at: None,
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

    /// Nothing to apply: the overflow limiter gives back what a spike of distinct ids
    /// made its map take ([`Limiter::rest`]).
    fn rest(&mut self) {
        self.intake.limiter.rest(crate::support::clock::now_ms());
        let bytes = self.intake.limiter.footprint() as u64;
        self.stats
            .limiter_bytes
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// At a stop: cut the unused end off the block file, make the checkpoint durable,
    /// then let the log delete its spares and, if the writer has stopped and everything
    /// is applied, its segments ([`log::Reader::release_at_stop`]). A failure leaves
    /// files a start reads, cuts or deletes anyway.
    fn release_log_at_stop(&mut self) {
        if let Err(e) = self.trees.blocks.finish() {
            tracing::warn!(error = %e, "cannot cut the unused end off the block file at the stop");
        }
        let applied = self
            .trees
            .meta
            .flush()
            .and_then(|_| self.trees.meta.get(keys::CHECKPOINT_KEY));
        let applied = match applied {
            Ok(v) => v.and_then(|v| keys::seq(&v)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot make the checkpoint durable at the stop; the log's segments stay");
                return;
            }
        };
        match self.intake.log.release_at_stop(applied) {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                segments = n,
                "log segments applied in full deleted at the stop"
            ),
            Err(e) => tracing::warn!(error = %e, "cannot delete the log's segments at the stop"),
        }
    }

    /// Give up the database's trees and everything read from them (the deduplication
    /// window, the memo), keeping the log reader and the settings: what survives a
    /// reopen of the database.
    fn detach(self) -> Detached {
        Detached {
            log: self.intake.log,
            person_cache: self.person_cache,
            projects: self.projects,
            stats: self.stats,
            settings: self.settings,
            geoip: self.geoip,
        }
    }
}

/// A compactor without its database, while the database is reopened.
struct Detached {
    log: log::Reader,
    person_cache: Option<Arc<PersonCache>>,
    projects: Arc<ArcSwap<Projects>>,
    stats: Arc<Stats>,
    settings: Compaction,
    geoip: Arc<crate::geoip::Database>,
}

impl Detached {
    /// The compactor again, on reopened `trees` whose checkpoint is `checkpoint`: it
    /// reads the log from the entry after it, so what the database lost by the reopen
    /// (applied, never made durable) is applied again. A failed seek is retried by the
    /// next read.
    fn attach(self, trees: Trees, checkpoint: Option<u64>) -> Compactor {
        let mut log = self.log;
        if let Err(e) = log.seek(checkpoint.map_or(0, |c| c.saturating_add(1))) {
            tracing::warn!(error = %e, "cannot position the log reader yet; retrying");
        }
        let mut compactor = Compactor::new(trees, log, self.projects, self.settings, self.geoip);
        compactor.stats = self.stats;
        compactor.person_cache = self.person_cache;
        compactor
    }
}

/// Entries waiting in the log plus records waiting in the slower lanes, from the span
/// of their numbers: O(log n), exact unless sequence numbers were skipped at a restart
/// or by a failed write.
pub fn log_depth(trees: &Trees, log: &log::Shared) -> u64 {
    log.depth()
        + [&trees.wal, &trees.historical, &trees.overflow]
            .into_iter()
            .map(|tree| {
                let first = tree.first().ok().flatten().and_then(|(k, _)| keys::seq(&k));
                let last = tree.last().ok().flatten().and_then(|(k, _)| keys::seq(&k));
                match (first, last) {
                    (Some(a), Some(b)) => b.saturating_sub(a) + 1,
                    _ => 0,
                }
            })
            .sum::<u64>()
}

#[cfg(test)]
mod tests;
