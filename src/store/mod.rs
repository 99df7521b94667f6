//! The stored data: one sled database holding everything the compactor derives from
//! the write-ahead log (events in LZ4 blocks, whose bytes are in the block files
//! beside it, [`block::files`]; persons, distinct ids, groups, the deduplication
//! window) and its checkpoint; the key layouts and tree names that are
//! the on-disk format; the reads the read API and flag evaluation make (with the
//! person cache `/decide` uses); the migration of older formats, run when the
//! trees open; and the open database as the server shares it ([`live`]), which the
//! compactor reopens after sled kept a write failure; the console's [`rollup`]s; and
//! the [`outbox`], the feed of what each compactor chunk changed, committed in the
//! chunk's transaction, that the ClickHouse sink reads. Nothing here starts a thread:
//! `pipeline` does.

pub mod block;
pub mod by_property;
pub mod check;
pub mod dedup;
pub mod event;
pub mod event_index;
pub mod first_seen;
pub mod keys;
pub mod layered;
pub mod live;
pub mod memory;
mod migrate;
pub mod outbox;
pub mod person_bytes;
pub mod person_cache;
pub mod person_probe;
pub mod query;
pub mod rollup;

use std::path::Path;

use serde_json::{Map, Value};

pub use event::StoredEvent;

/// The log's tree name, part of the on-disk format like every tree name below.
pub const WAL_TREE: &str = "wal";
/// Event blocks. The earlier format kept one key per event in `events` (with a uuid
/// index in `event_ids`); a new name keeps the two apart during a migration.
pub const EVENTS_TREE: &str = "event_blocks";

/// The persons' and distinct ids' delta trees, and their runs' names.
pub const PERSONS_TREE: &str = "persons";
pub const DISTINCT_IDS_TREE: &str = "distinct_ids";
/// Every [`layered`] table: the two above and the persons' [`first_seen`] and
/// [`by_property`] indexes.
pub const LAYERED_TABLES: [&str; 4] = [
    PERSONS_TREE,
    DISTINCT_IDS_TREE,
    first_seen::TREE,
    by_property::TREE,
];

/// PostHog's limit: five group types per project, indexes 0-4.
pub const MAX_GROUP_TYPES: u8 = 5;

/// A group's stored record.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Group {
    pub group_type_index: u8,
    pub group_key: String,
    pub properties: Map<String, Value>,
    pub created_at: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("storage: {0}")]
    Sled(sled::Error),
    /// sled panicked reading the database: the message names it and what to do.
    #[error("{0}")]
    Damaged(String),
    /// The block files' directory could not be read.
    #[error("event block files: {0}")]
    Blocks(std::io::Error),
    /// A layered table's run could not be read or written.
    #[error("persons and distinct ids: {0}")]
    Tables(std::io::Error),
    /// The event index's directory could not be read or written.
    #[error("event index: {0}")]
    EventIndex(std::io::Error),
    /// The database could not be brought to this build's format.
    #[error(transparent)]
    Migrate(#[from] migrate::Error),
}

impl Error {
    /// Whether sled could not lock the database because another process holds it.
    pub fn is_locked(&self) -> bool {
        // sled 0.34 reports a held lock as an `Other` I/O error with this text.
        matches!(self, Error::Sled(sled::Error::Io(e)) if e.to_string().starts_with("could not acquire lock"))
    }
}

/// Open the sled database at `path` in a test, after the test dropped its previous
/// handle: sled's flusher thread lets go of the directory's lock a moment after the
/// last handle goes, so an immediate open can still find it held.
#[cfg(test)]
pub(crate) fn reopen_for_tests(path: &std::path::Path) -> sled::Db {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match sled::open(path) {
            Ok(db) => return db,
            Err(e) => {
                let e = Error::Sled(e);
                if !e.is_locked() || std::time::Instant::now() >= deadline {
                    panic!("cannot open {}: {e}", path.display());
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }
}

impl From<sled::Error> for Error {
    fn from(e: sled::Error) -> Self {
        Error::Sled(e)
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
    /// Project, newest time, block id -> where a [`block`] of events (LZ4) is in the
    /// block files, or (written before them) the block itself.
    pub events: sled::Tree,
    /// The event blocks' bytes ([`block::files`]).
    pub blocks: block::Files,
    /// Arrival time, id -> the uuids a chunk stored: the [`dedup`] window, persisted.
    pub recent_ids: sled::Tree,
    /// Project, person uuid -> [`crate::persons::Person`] (JSON), [`layered`].
    pub persons: layered::Layered,
    /// Project, distinct id -> person uuid, [`layered`].
    pub distinct_ids: layered::Layered,
    /// Project, first event's time (newest first), person uuid -> a marker:
    /// [`first_seen`], the console's persons list, [`layered`].
    pub first_seen: layered::Layered,
    /// Project, property key, value, first event's time (newest first), person uuid ->
    /// whether the value was cut: [`by_property`], the console's search of persons,
    /// [`layered`].
    pub by_property: layered::Layered,
    /// (Project, distinct id) -> the blocks holding its events: [`event_index`], in
    /// files of its own beside sled's.
    pub event_index: event_index::Index,
    /// Project, group type index, group key -> [`Group`] (JSON).
    pub groups: sled::Tree,
    /// Project, group type name <-> index.
    pub group_types: sled::Tree,
    /// The compactor's checkpoint, the next block id and the format version.
    pub meta: sled::Tree,
    /// Log records that did not decode, kept for an operator to inspect.
    pub quarantine: sled::Tree,
    /// What the compactor committed and the outbox's reader (the ClickHouse sink)
    /// has not yet sent ([`outbox`]); written only while the sink is on.
    pub outbox: sled::Tree,
    /// Project, kind, hour or event name -> the console's counts ([`rollup`]).
    pub rollups: std::sync::Arc<rollup::Rollups>,
}

impl Trees {
    /// Open every tree; a database of the earlier format (one key per event) is
    /// migrated first, one that is newer than this build is refused; rollups missing or
    /// of another version are emptied and left to a backfill.
    /// `dir` is the database's directory, where the block files are.
    pub fn open(db: &sled::Db, dir: &Path) -> Result<Trees, Error> {
        Trees::open_for(db, dir, migrate::Purpose::Write)
    }

    /// [`Trees::open`] for the offline commands that only read (`check`, `export`,
    /// `eval`): the recorded format is left as found unless a migration had to rewrite
    /// events (see [`migrate::Purpose`]).
    pub fn open_to_read(db: &sled::Db, dir: &Path) -> Result<Trees, Error> {
        Trees::open_for(db, dir, migrate::Purpose::Read)
    }

    fn open_for(db: &sled::Db, dir: &Path, purpose: migrate::Purpose) -> Result<Trees, Error> {
        let mut trees = Trees::open_current(db, dir, purpose == migrate::Purpose::Write)?;
        trees.by_property.note_blocks(Some(by_property::NOTER));
        migrate::run(db, &trees, purpose)?;
        // After the migration, which may store blocks the index must then build.
        let next_block = trees
            .meta
            .get(keys::NEXT_BLOCK_KEY)?
            .and_then(|v| v.as_ref().try_into().ok())
            .map_or(0, u64::from_be_bytes);
        let writable = purpose == migrate::Purpose::Write;
        trees.event_index =
            event_index::Index::open(dir, next_block, writable).map_err(Error::EventIndex)?;
        if purpose == migrate::Purpose::Write {
            trees.blocks.trim(&trees.events)?;
            for table in trees.tables() {
                table.remove_strays().map_err(Error::Tables)?;
            }
        }
        rollup::backfill::prepare(&trees)?;
        if purpose == migrate::Purpose::Write {
            first_seen::prepare(&trees)?;
            by_property::prepare(&trees)?;
            rollup::hot::recount(&trees)?;
        }
        Ok(trees)
    }

    /// Every [`layered`] table, in [`LAYERED_TABLES`]' order.
    pub fn tables(&self) -> [&layered::Layered; 4] {
        [
            &self.persons,
            &self.distinct_ids,
            &self.first_seen,
            &self.by_property,
        ]
    }

    fn open_current(db: &sled::Db, dir: &Path, writable: bool) -> Result<Trees, Error> {
        let mut tables = layered::open_all(db, dir, &LAYERED_TABLES, writable)?.into_iter();
        let mut table = || {
            tables
                .next()
                .ok_or(Error::Tables(std::io::ErrorKind::NotFound.into()))
        };
        Ok(Trees {
            blocks: block::Files::open(dir).map_err(Error::Blocks)?,
            wal: db.open_tree(WAL_TREE)?,
            historical: db.open_tree("lane_historical")?,
            overflow: db.open_tree("lane_overflow")?,
            events: db.open_tree(EVENTS_TREE)?,
            recent_ids: db.open_tree("recent_ids")?,
            persons: table()?,
            distinct_ids: table()?,
            first_seen: table()?,
            by_property: table()?,
            event_index: event_index::Index::unopened(dir),
            groups: db.open_tree("groups")?,
            group_types: db.open_tree("group_types")?,
            meta: db.open_tree("meta")?,
            quarantine: db.open_tree("quarantine")?,
            outbox: db.open_tree(outbox::TREE)?,
            rollups: std::sync::Arc::new(rollup::Rollups::new(db.open_tree(rollup::TREE)?)),
        })
    }
}
