//! Embedded storage: the write-ahead log's segment files ([`log`], written through
//! [`wal`]) and one sled database holding everything the compactor derives from them
//! (events, persons, groups) and its checkpoint, plus the queries the read API and flag
//! evaluation make.

mod apply;
pub mod block;
mod cache;
pub mod compactor;
pub mod dedup;
pub mod event;
pub mod keys;
pub mod log;
mod memo;
mod migrate;
pub mod overflow;
pub mod person_cache;
pub mod query;
mod raw;
pub mod record;
pub mod space;
mod splice;
pub mod wal;

use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;

pub use apply::{Group, MAX_GROUP_TYPES};
pub use event::StoredEvent;
pub use record::Record;
pub use wal::Wal;

use crate::projects::Projects;

/// The log's tree name, part of the on-disk format like every tree name below.
pub const WAL_TREE: &str = "wal";
/// Event blocks. The earlier format kept one key per event in `events` (with a uuid
/// index in `event_ids`); a new name keeps the two apart during a migration.
pub const EVENTS_TREE: &str = "event_blocks";

#[derive(Debug)]
pub struct Error(sled::Error);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "storage: {}", self.0)
    }
}

impl std::error::Error for Error {}

impl From<sled::Error> for Error {
    fn from(e: sled::Error) -> Self {
        Error(e)
    }
}

/// Every tree of the database.
#[derive(Clone)]
pub struct Trees {
    /// Sequence number -> log entry: the log of earlier versions, applied before the
    /// log's files ([`log`]) and no longer written.
    pub wal: sled::Tree,
    /// The slower lanes, same keys and values as the log.
    pub historical: sled::Tree,
    pub overflow: sled::Tree,
    /// Project, newest time, block id -> a [`block`] of events (LZ4).
    pub events: sled::Tree,
    /// Arrival time, id -> the uuids a chunk stored: the [`dedup`] window, persisted.
    pub recent_ids: sled::Tree,
    /// Project, person uuid -> [`crate::persons::Person`] (JSON).
    pub persons: sled::Tree,
    /// Project, distinct id -> person uuid.
    pub distinct_ids: sled::Tree,
    /// Project, group type index, group key -> [`Group`] (JSON).
    pub groups: sled::Tree,
    /// Project, group type name <-> index.
    pub group_types: sled::Tree,
    /// The compactor's checkpoint, the next block id and the format version.
    pub meta: sled::Tree,
    /// Log records that did not decode, kept for an operator to inspect.
    pub quarantine: sled::Tree,
    /// What the compactor committed and the ClickHouse sink has not yet sent
    /// ([`crate::sink::outbox`]); written only while the sink is on.
    pub outbox: sled::Tree,
}

impl Trees {
    /// Open every tree; a database of the earlier format (one key per event) is
    /// migrated first, one that is newer than this build is refused.
    pub fn open(db: &sled::Db) -> Result<Trees, Error> {
        let trees = Trees::open_current(db)?;
        migrate::run(db, &trees)?;
        Ok(trees)
    }

    fn open_current(db: &sled::Db) -> Result<Trees, Error> {
        Ok(Trees {
            wal: db.open_tree(WAL_TREE)?,
            historical: db.open_tree("lane_historical")?,
            overflow: db.open_tree("lane_overflow")?,
            events: db.open_tree(EVENTS_TREE)?,
            recent_ids: db.open_tree("recent_ids")?,
            persons: db.open_tree("persons")?,
            distinct_ids: db.open_tree("distinct_ids")?,
            groups: db.open_tree("groups")?,
            group_types: db.open_tree("group_types")?,
            meta: db.open_tree("meta")?,
            quarantine: db.open_tree("quarantine")?,
            outbox: db.open_tree(crate::sink::outbox::TREE)?,
        })
    }
}

/// The open database, its log writer and its compactor.
pub struct Store {
    pub db: sled::Db,
    pub trees: Trees,
    pub wal: Wal,
    /// The log's positions, for its depth.
    pub log: Arc<log::Shared>,
    /// Persons for `/decide`, forgotten by the compactor as it changes them.
    pub persons: Arc<person_cache::PersonCache>,
    pub compactor: Arc<compactor::Stats>,
    writer: wal::Writer,
    compactor_thread: compactor::Handle,
}

impl Store {
    /// Open the database and start the log writer and the compactor. Blocking.
    /// `cache_bytes` is sled's page cache (see [`crate::config::DEFAULT_CACHE_BYTES`]),
    /// `log_segment_bytes` the size of the log's files (see [`log::SEGMENT_BYTES`]).
    pub fn open(
        dir: &Path,
        cache_bytes: u64,
        log_segment_bytes: u64,
        projects: Arc<ArcSwap<Projects>>,
        settings: compactor::Settings,
        geoip: Arc<crate::geoip::Database>,
        on_flush: wal::FlushObserver,
    ) -> Result<Store, Error> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .open()?;
        let trees = Trees::open(&db)?;
        let io = |e| Error(sled::Error::Io(e));
        let checkpoint = trees
            .meta
            .get(compactor::CHECKPOINT_KEY)?
            .and_then(|v| keys::seq(&v));
        let floor = wal::first_seq(&db, &trees.wal, checkpoint)?;
        let (appender, reader, preparer) = log::open(
            &dir.join(log::DIR_NAME),
            floor,
            checkpoint,
            log_segment_bytes,
        )
        .map_err(io)?;
        let shared = appender.shared().clone();
        let (wal, writer) = Wal::start(appender, preparer, on_flush).map_err(io)?;
        let persons = Arc::new(person_cache::PersonCache::new(person_cache::DEFAULT_BYTES));
        let compactor = compactor::Compactor::new(trees.clone(), reader, projects, settings, geoip)
            .with_person_cache(persons.clone());
        let stats = compactor.stats();
        let compactor_thread = compactor::spawn(compactor).map_err(io)?;
        Ok(Store {
            db,
            trees,
            wal,
            log: shared,
            persons,
            compactor: stats,
            writer,
            compactor_thread,
        })
    }

    /// Write what the log has queued, stop the writer and the compactor, and flush.
    /// Appends after this fail as closed. Blocking: call off the reactor.
    pub fn close(self) -> Result<(), Error> {
        let Store {
            db,
            writer,
            compactor_thread,
            ..
        } = self;
        writer.stop();
        compactor_thread.stop();
        db.flush()?;
        Ok(())
    }
}
