//! The on-disk format's version, and the migration from the first format, which kept
//! one `events` key per event plus one `event_ids` key per uuid, to event blocks.
//! Later formats read everything the one before wrote, so only the first is migrated.
//!
//! The migration reads the old `events` tree in key order (project, time, uuid), packs
//! each batch into blocks, and in one transaction writes the blocks and deletes the
//! batch's old keys, so it resumes where it stopped after a crash. Events that arrived
//! within the deduplication window seed it, so retries of them are still recognised.
//! The old trees are dropped at the end. A database of a newer format is refused.

use std::collections::HashMap;
use std::convert::Infallible;

use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};
use sled::IVec;

use super::event::StoredEvent;
use super::keys::NEXT_BLOCK_KEY;
use super::{block, dedup, keys, Trees};

/// The format this build writes: 7 keeps the layered tables' recent changes in
/// memory and a journal beside the runs ([`super::layered::journal`]) instead of sled
/// trees: an older build would not read the journal. A format-6 or older database's
/// deltas are moved from their sled trees into the journal at open ([`move_deltas`]).
/// 6 splits each layered table's run by key range into
/// runs a manifest names ([`super::layered::runs`]): an older build would read only a
/// `.run` file and miss the rest. A format-5 table (one `.run`, no manifest) reads as
/// one part and is split by its next fold, so it needs no change. 5 keeps persons and
/// distinct ids in sorted runs beside their trees ([`super::layered`]), which an
/// older build would not read;
/// 4 keeps new event blocks in the block files with a
/// pointer in the tree ([`block::files`]); 3 had blocks in the tree, possibly of block
/// version 2 (columns, [`block`]); 2 had only block version 1. Blocks in the tree are
/// still read, and trees without runs are a table's delta, so a format-2, -3 or -4
/// database needs no change; 1 (one key per event) had
/// no key. An older build would skip what it cannot read as damaged: it refuses a
/// newer format instead.
pub const FORMAT: u64 = 7;
/// The first format whose tables are split by a manifest.
const SPLIT_RUNS: u64 = 6;
pub const FORMAT_KEY: &[u8] = b"format";
/// The first format's trees.
const OLD_EVENTS: &[u8] = b"events";
const OLD_EVENT_IDS: &[u8] = b"event_ids";
/// Old events per migration transaction.
const BATCH: usize = 4096;
/// Log progress every this many events.
const PROGRESS_EVERY: u64 = 100_000;

/// Why the database could not be brought to this build's format.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("storage: {0}")]
    Store(#[from] sled::Error),
    /// Written by a newer build: this one would misread it.
    #[error(
        "the database has format {found}, newer than this build's {FORMAT}: \
         run a newer flagpost on it"
    )]
    Newer { found: u64 },
}

/// Whether the database is opened to be written (the server) or only read (`check`,
/// `export`, `eval`): a read leaves the recorded format as it found it, so trying a
/// newer build's offline tools on a database does not stop the older server from
/// opening it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Write,
    Read,
}

pub fn run(db: &sled::Db, trees: &Trees, purpose: Purpose) -> Result<(), Error> {
    let recorded = trees.meta.get(FORMAT_KEY)?.map(|v| {
        v.as_ref()
            .try_into()
            .map(u64::from_be_bytes)
            .unwrap_or(u64::MAX)
    });
    if let Some(found) = recorded.filter(|&f| f > FORMAT) {
        return Err(Error::Newer { found });
    }
    if purpose == Purpose::Write && recorded.is_some_and(|f| f < SPLIT_RUNS) {
        let tables = trees.tables();
        let bytes: u64 = tables
            .iter()
            .filter_map(|t| t.run())
            .map(|r| r.file_bytes())
            .sum();
        tracing::info!(
            from = recorded,
            to = FORMAT,
            run_bytes = bytes,
            "database format: each table's run is read whole until its next fold splits it by key range (logged as it is folded)"
        );
    }
    if purpose == Purpose::Write {
        move_deltas(db, trees)?;
    }
    let names = db.tree_names();
    // Migrating the first format writes blocks in this build's layout: the database is
    // then of this build's format, whatever the purpose.
    let mut rewritten = false;
    if names.iter().any(|n| n == OLD_EVENTS) {
        let old = db.open_tree(OLD_EVENTS)?;
        migrate_events(&old, trees, crate::support::clock::now_ms())?;
        drop(old);
        db.drop_tree(OLD_EVENTS)?;
        rewritten = true;
    }
    if names.iter().any(|n| n == OLD_EVENT_IDS) {
        db.drop_tree(OLD_EVENT_IDS)?;
    }
    if purpose == Purpose::Write || rewritten {
        trees.meta.insert(FORMAT_KEY, &FORMAT.to_be_bytes()[..])?;
    }
    Ok(())
}

/// Move the layered tables' deltas that a format-6 or older database kept in sled
/// trees into the journal, then drop the trees (sled's file keeps their space; the
/// journal never rewrites it). A crash midway moves the rest at the next open: what
/// was moved is in both, with the same values.
fn move_deltas(db: &sled::Db, trees: &Trees) -> Result<(), Error> {
    for table in trees.tables() {
        if !db.tree_names().iter().any(|n| n == table.name().as_bytes()) {
            continue;
        }
        let entries = db.open_tree(table.name())?.len();
        tracing::info!(table = table.name(), entries, "database format: moving the table's recent changes from sled into its journal; this runs once");
        let moved = table.migrate_tree(db).map_err(|e| match e {
            super::Error::Sled(e) => Error::Store(e),
            other => Error::Store(sled::Error::Io(std::io::Error::other(other.to_string()))),
        })?;
        tracing::info!(
            table = table.name(),
            entries = moved,
            "the table's recent changes are in its journal"
        );
    }
    Ok(())
}

/// Move every event of the old tree into blocks; returns how many were moved.
fn migrate_events(old: &sled::Tree, trees: &Trees, now: i64) -> Result<u64, Error> {
    let total = old.len() as u64;
    if total == 0 {
        return Ok(0);
    }
    tracing::info!(
        events = total,
        "migrating events to blocks (the earlier on-disk format); this runs once"
    );
    // A large database can take longer than the unit's start timeout.
    crate::support::notify::extend_timeout(std::time::Duration::from_secs(60));
    let recent_since = now - crate::config::DEFAULT_DEDUP_MAX_AGE_MS;
    let (mut moved, mut skipped, mut logged) = (0u64, 0u64, 0u64);
    loop {
        let batch: Vec<(IVec, IVec)> = old.iter().take(BATCH).collect::<Result<_, _>>()?;
        if batch.is_empty() {
            break;
        }
        let mut by_project: HashMap<u64, Vec<block::Entry>> = HashMap::new();
        let mut recent = Vec::new();
        let mut arrival = i64::MIN;
        for (key, value) in &batch {
            let project = key
                .get(..8)
                .and_then(|p| p.try_into().ok())
                .map(u64::from_be_bytes);
            let (Some(project), Some(event)) = (project, StoredEvent::decode(value)) else {
                // Reads skipped it before; there is nothing to move.
                skipped += 1;
                continue;
            };
            if event.created_at >= recent_since {
                recent.push((project, event.uuid.as_u128()));
                arrival = arrival.max(event.created_at);
            }
            by_project
                .entry(project)
                .or_default()
                .push(block::Entry::from_stored(&event));
        }
        let blocks: Vec<(u64, i64, Vec<u8>)> = by_project
            .into_iter()
            .flat_map(|(p, entries)| {
                block::build(entries)
                    .into_iter()
                    .map(move |(newest, v)| (p, newest, v))
            })
            .collect();
        let result = (old, &trees.events, &trees.recent_ids, &trees.meta).transaction(
            |(old, events, recent_ids, meta)| {
                let first = meta
                    .get(NEXT_BLOCK_KEY)?
                    .and_then(|v| v.as_ref().try_into().ok())
                    .map_or(0, u64::from_be_bytes);
                let mut next = first;
                for (project, newest, value) in &blocks {
                    events.insert(&keys::block(*project, *newest, next)[..], value.as_slice())?;
                    next += 1;
                }
                meta.insert(NEXT_BLOCK_KEY, &next.to_be_bytes()[..])?;
                if !recent.is_empty() {
                    recent_ids.insert(&keys::recent(arrival, first)[..], dedup::encode(&recent))?;
                }
                for (key, _) in &batch {
                    old.remove(key)?;
                }
                Ok::<_, ConflictableTransactionError<Infallible>>(())
            },
        );
        match result {
            Ok(()) => {}
            Err(TransactionError::Storage(e)) => return Err(Error::Store(e)),
            Err(TransactionError::Abort(never)) => match never {},
        }
        moved += batch.len() as u64;
        if moved - logged >= PROGRESS_EVERY {
            logged = moved;
            tracing::info!(done = moved, total, "migrating events to blocks");
            crate::support::notify::extend_timeout(std::time::Duration::from_secs(60));
        }
    }
    trees.events.flush()?;
    tracing::info!(
        events = moved - skipped,
        damaged_skipped = skipped,
        "events migrated to blocks"
    );
    Ok(moved - skipped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::query::{self, EventFilter};
    use serde_json::json;
    use uuid::Uuid;

    fn old_event(i: u64, ts: i64, created_at: i64) -> StoredEvent {
        StoredEvent {
            uuid: Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0000 + u128::from(i)),
            event: format!("e{}", i % 3),
            distinct_id: format!("d{}", i % 5),
            properties: json!({"i": i}).as_object().unwrap().clone(),
            timestamp: ts,
            created_at,
            person_id: None,
        }
    }

    /// A database in the first format, built as its compactor wrote it.
    fn write_old(db: &sled::Db, events: &[(u64, StoredEvent)]) {
        let old = db.open_tree(OLD_EVENTS).unwrap();
        let ids = db.open_tree(OLD_EVENT_IDS).unwrap();
        for (project, e) in events {
            old.insert(keys::event(*project, e.timestamp, e.uuid), e.encode())
                .unwrap();
            ids.insert(
                keys::with_uuid(*project, e.uuid),
                &keys::time(e.timestamp)[..],
            )
            .unwrap();
        }
    }

    #[test]
    fn migrates_the_first_format_to_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let now = crate::support::clock::now_ms();
        let mut events = Vec::new();
        // Enough for several batches, across two projects and days, some recent.
        for i in 0..10_000u64 {
            let ts = now - 3 * 24 * 3_600_000 + (i as i64) * 30_000;
            let created = if i % 2 == 0 {
                now - 1000
            } else {
                now - 3 * 24 * 3_600_000
            };
            events.push((1 + i % 2, old_event(i, ts, created)));
        }
        {
            let db = sled::open(dir.path()).unwrap();
            write_old(&db, &events);
            db.open_tree(OLD_EVENTS)
                .unwrap()
                .insert(keys::event(1, 0, Uuid::nil()), &b"damaged"[..])
                .unwrap();
        }
        let db = crate::store::reopen_for_tests(dir.path());
        let trees = Trees::open(&db, dir.path()).unwrap();
        let names = db.tree_names();
        assert!(!names.iter().any(|n| n == OLD_EVENTS || n == OLD_EVENT_IDS));
        assert_eq!(
            trees.meta.get(FORMAT_KEY).unwrap().unwrap().as_ref(),
            &FORMAT.to_be_bytes()
        );
        for project in [1, 2] {
            let got = query::events_page(&trees, project, EventFilter::default(), None, 100_000)
                .unwrap()
                .0;
            let mut want: Vec<StoredEvent> = events
                .iter()
                .filter(|(p, _)| *p == project)
                .map(|(_, e)| e.clone())
                .collect();
            want.sort_by_key(|e| std::cmp::Reverse((e.timestamp, e.uuid)));
            assert_eq!(got, want, "project {project}");
        }
        // The recently arrived uuids seed the deduplication window.
        let window = dedup::Window::load(
            &trees.recent_ids,
            &dir.path().join(dedup::DIR_NAME),
            crate::config::DEFAULT_DEDUP_MAX_AGE_MS,
            crate::config::DEFAULT_DEDUP_MAX_IDS,
            now,
            |_| panic!("the migration's entries hold uuids"),
        )
        .unwrap();
        assert_eq!(window.len(), 5000);
        let (p, e) = &events[0];
        assert!(window.contains((*p, e.uuid.as_u128())).unwrap());
        let (p, e) = &events[1];
        assert!(!window.contains((*p, e.uuid.as_u128())).unwrap());
        // Opening again finds nothing to do.
        drop(trees);
        let again = Trees::open(&db, dir.path()).unwrap();
        assert_eq!(
            query::events_page(&again, 1, EventFilter::default(), None, 100_000)
                .unwrap()
                .0
                .len(),
            5000
        );
    }

    /// A format-2 database (blocks of the first layout, in the tree) is read as it is
    /// and marked this build's format once opened; new blocks go beside the old ones.
    #[test]
    fn a_format_two_database_is_read_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let old: Vec<StoredEvent> = (0..20u64)
            .map(|i| old_event(i, 1_000 + i as i64, 5))
            .collect();
        {
            let db = sled::open(dir.path()).unwrap();
            let entries: Vec<block::Entry> = old.iter().map(block::Entry::from_stored).collect();
            let value = block::tests::encode_rows(&entries);
            db.open_tree(super::super::EVENTS_TREE)
                .unwrap()
                .insert(&keys::block(1, 1_019, 0)[..], value)
                .unwrap();
            db.open_tree("meta")
                .unwrap()
                .insert(FORMAT_KEY, &2u64.to_be_bytes()[..])
                .unwrap();
        }
        let db = crate::store::reopen_for_tests(dir.path());
        let format = |trees: &Trees| trees.meta.get(FORMAT_KEY).unwrap().unwrap().to_vec();
        // The offline tools only read: the old build can still open it afterwards.
        let read = Trees::open_to_read(&db, dir.path()).unwrap();
        assert_eq!(format(&read), 2u64.to_be_bytes());
        assert_eq!(
            query::events(&read, 1, EventFilter::default(), None).count(),
            old.len()
        );
        let trees = Trees::open(&db, dir.path()).unwrap();
        assert_eq!(format(&trees), FORMAT.to_be_bytes());
        let new = old_event(20, 2_000, 6);
        let (newest, value) = block::build(vec![block::Entry::from_stored(&new)]).remove(0);
        assert_eq!(value[0], 4, "the block layout written now");
        let pointer = trees.blocks.append(&value).unwrap();
        trees.blocks.sync().unwrap();
        trees
            .events
            .insert(&keys::block(1, newest, 1)[..], &pointer[..])
            .unwrap();
        let got = query::events_page(&trees, 1, EventFilter::default(), None, 100)
            .unwrap()
            .0;
        let mut want = old.clone();
        want.push(new);
        want.reverse();
        assert_eq!(got, want);
    }

    #[test]
    fn a_newer_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path()).unwrap();
        db.open_tree("meta")
            .unwrap()
            .insert(FORMAT_KEY, &(FORMAT + 1).to_be_bytes()[..])
            .unwrap();
        let err = Trees::open(&db, dir.path()).err().unwrap().to_string();
        assert!(err.contains("newer than this build"), "{err}");
    }
}

#[cfg(test)]
#[path = "tests/format5.rs"]
mod format5;

#[cfg(test)]
#[path = "tests/format6.rs"]
mod format6;
