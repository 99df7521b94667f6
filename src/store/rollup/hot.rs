//! The rollups the compactor keeps in memory between writes. Written through sled on
//! every chunk, the current hour's few keys (each with a 1 KiB sketch) were rewritten
//! hundreds of times a second, and sled's file kept every old copy as dead space. So a
//! chunk's counts are added to [`Hot`] instead and written to the tree together, each
//! key once, when [`Hot::due`] says so (every few seconds while busy, soon after the
//! compactor goes idle, before retention and at a clean stop).
//!
//! Readers see the tree and the hot counts merged, under the same lock the compactor
//! holds while it commits a chunk, so an event is counted as soon as it is stored.
//! A crash loses the hot counts, never their events: the chunk that starts them
//! records in `meta` ([`FROM_KEY`]) the first block id they cover, in its own
//! transaction, and the write that empties them removes the key in its. At the next
//! open, [`recount`] counts the blocks from that id again from the stored events (a
//! few seconds of traffic) and logs it.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sled::transaction::{
    ConflictableTransactionError, TransactionError, Transactional, TransactionalTree,
    UnabortableTransactionError,
};

use super::super::keys;
use super::super::Trees;
pub use super::FROM_KEY;
use super::{backfill, Delta, Pending};

/// While the compactor is busy, hot counts are written this often: each key once per
/// interval instead of once per chunk, and at most this long to count again after a
/// crash.
const BUSY_WRITE_INTERVAL: Duration = Duration::from_secs(10);
/// Once idle, they are written after this long, so a quiet server keeps little in
/// memory that a crash would make it count again.
const IDLE_WRITE_AFTER: Duration = Duration::from_secs(1);
/// Past this many keys (each up to 1 KiB with its sketch) they are written whatever
/// the time: a burst of old events spread over many hours stays bounded in memory.
const MAX_KEYS: usize = 8192;

/// Whether the compactor is applying records or waiting for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    Busy,
    Idle,
}

/// Counts added since the tree was last written, and since when.
#[derive(Debug, Default)]
pub struct Hot {
    pending: Pending,
    since: Option<Instant>,
}

impl Hot {
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// The event names of the hot keys under `kind` (a project's event rollups).
    pub fn names(&self, kind: &[u8]) -> std::collections::BTreeSet<String> {
        self.pending
            .deltas
            .keys()
            .filter_map(|k| k.strip_prefix(kind))
            .filter_map(|rest| super::take_text(rest).map(|(name, _)| name.to_owned()))
            .collect()
    }

    /// Whether the counts should be written with the next transaction.
    pub fn due(&self, moment: Moment, now: Instant) -> bool {
        let Some(since) = self.since else {
            return false;
        };
        let age = now.saturating_duration_since(since);
        self.pending.deltas.len() >= MAX_KEYS
            || age >= BUSY_WRITE_INTERVAL
            || (moment == Moment::Idle && age >= IDLE_WRITE_AFTER)
    }

    /// Inside a chunk's transaction that stores blocks from `first_block` on and
    /// counts them in `chunk`: write everything when `write`, else record where the
    /// hot counts start if this chunk starts them.
    pub fn stage(
        &self,
        chunk: &Pending,
        write: bool,
        first_block: u64,
        rollups: &TransactionalTree,
        meta: &TransactionalTree,
    ) -> Result<(), UnabortableTransactionError> {
        if write {
            self.pending.write(rollups)?;
            chunk.write(rollups)?;
            meta.remove(FROM_KEY)?;
        } else if self.is_empty() && !chunk.is_empty() {
            meta.insert(FROM_KEY, &first_block.to_be_bytes()[..])?;
        }
        Ok(())
    }

    /// After that transaction committed: the chunk's counts join the hot ones, or
    /// everything was written.
    pub fn committed(&mut self, chunk: Pending, written: bool) {
        if written {
            *self = Hot::default();
            return;
        }
        if chunk.is_empty() {
            return;
        }
        self.since.get_or_insert_with(Instant::now);
        for (key, delta) in chunk.deltas {
            self.pending.add_to(key, delta);
        }
    }

    /// Write the hot counts in a transaction of their own (idle, before retention, at
    /// a stop).
    pub fn write_now(&mut self, trees: &Trees) -> Result<(), sled::Error> {
        if self.is_empty() {
            return Ok(());
        }
        write_counted(&self.pending, trees)?;
        *self = Hot::default();
        Ok(())
    }
}

/// A key and its value, owned.
pub type Entry = (Vec<u8>, Vec<u8>);

/// The rollups tree and its hot counts. Dereferences to the tree for what writes it
/// directly (the backfill, retention).
#[derive(Debug)]
pub struct Rollups {
    pub tree: sled::Tree,
    hot: Mutex<Hot>,
}

impl std::ops::Deref for Rollups {
    type Target = sled::Tree;
    fn deref(&self) -> &sled::Tree {
        &self.tree
    }
}

impl Rollups {
    pub fn new(tree: sled::Tree) -> Rollups {
        Rollups {
            tree,
            hot: Mutex::new(Hot::default()),
        }
    }

    /// The hot counts; a commit holds this for its whole transaction, so readers see
    /// a chunk's counts exactly when they see its events.
    pub fn hot(&self) -> MutexGuard<'_, Hot> {
        crate::support::sync::lock(&self.hot)
    }

    /// The stored values in `range` with the hot counts added, in key order.
    pub fn range(&self, range: Range<Vec<u8>>) -> Result<Vec<Entry>, sled::Error> {
        let hot = self.hot();
        let mut merged = BTreeMap::new();
        for entry in self.tree.range(range.clone()) {
            let (k, v) = entry?;
            merged.insert(k.to_vec(), v.to_vec());
        }
        for (key, delta) in &hot.pending.deltas {
            if !range.contains(key) {
                continue;
            }
            let value = match merged.get(key).and_then(|v| Delta::decode(v, delta)) {
                Some(mut stored) => {
                    stored.merge(delta.clone());
                    stored.encode()
                }
                None => delta.encode(),
            };
            merged.insert(key.clone(), value);
        }
        Ok(merged.into_iter().collect())
    }
}

/// At open, before the compactor starts: count again the blocks whose counts were
/// only in memory when the last run ended without writing them (a crash).
pub fn recount(trees: &Trees) -> Result<(), sled::Error> {
    let Some(from) = trees.meta.get(FROM_KEY)? else {
        return Ok(());
    };
    let from = from
        .as_ref()
        .try_into()
        .map(u64::from_be_bytes)
        .unwrap_or(0);
    let started = Instant::now();
    let mut pending = Pending::default();
    let mut blocks = 0u64;
    for entry in trees.events.iter() {
        let (key, value) = entry?;
        let (Some(id), Some((project, _))) = (keys::block_id(&key), keys::split_block(&key)) else {
            continue;
        };
        if id >= from {
            backfill::add_block(&mut pending, &trees.blocks, project, &key, &value);
            blocks += 1;
        }
    }
    write_counted(&pending, trees)?;
    tracing::info!(
        from_block = from,
        blocks,
        ms = started.elapsed().as_millis() as u64,
        "counted again the console's rollups the last run held in memory when it stopped"
    );
    Ok(())
}

/// `pending` written to the rollups and the in-memory mark cleared, in one transaction:
/// after it the tree counts every stored block again.
fn write_counted(pending: &Pending, trees: &Trees) -> Result<(), sled::Error> {
    (&trees.rollups.tree, &trees.meta)
        .transaction(|(rollups, meta)| {
            pending.write(rollups)?;
            meta.remove(FROM_KEY)?;
            Ok::<_, ConflictableTransactionError<()>>(())
        })
        .map_err(|e| match e {
            TransactionError::Storage(e) => e,
            TransactionError::Abort(()) => sled::Error::Unsupported("aborted".into()),
        })
}
