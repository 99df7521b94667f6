//! The outbox: the change feed the compactor commits. Each compactor chunk's
//! transaction also records here what it changed, so a chunk and its entry exist
//! together or not at all; a reader (the ClickHouse sink, on with `--clickhouse-url`)
//! takes the entries in order and removes them only once it has passed them on. The
//! tree, its key layout and its entries' encoding are part of the on-disk format;
//! the compactor writes it through [`record`], the reader through [`Outbox`], and
//! retention keeps the event blocks it still names ([`retention`]).
//!
//! An entry names what changed, not the data: the event blocks written, the persons
//! written or merged away, the distinct ids linked and the groups written. The reader
//! reads their current state when it sends, which is at least as new as the entry.
//!
//! Each entry gets a version for the persons' and links' rows, from the commit's
//! clock ([`row_version`]): `at` (ms) × [`VERSION_STEP`] plus a number from the
//! node's id, and always above the previous entry's. So on one node the newest state
//! carries the highest version, and when several nodes write the same derived person
//! id into one ClickHouse, the change committed last (by the nodes' clocks) wins
//! everywhere, rather than whichever node happened to have written more chunks.
//!
//! Keys: `e` + seq (u64 BE) -> entry; `n` -> the next seq; `v` -> the last version; `c` -> the last seq sent
//! (the checkpoint); `f` -> the batch in flight (first and last seq), fixed before it
//! is sent so a re-send after a crash is the same batch with the same tokens; `i` ->
//! this database's id (16 bytes), which keeps tokens of different nodes apart; `b` ->
//! the reader's backfill progress (the sink's `backfill`); `h` -> the highest event
//! block id recorded; `g` -> block ids written while the feed was off (first, end),
//! found when an entry's blocks do not follow on from `h`, for the backfill to send.
//! `a` + name -> an active reader; `r` + name + `/` + what -> a named reader's
//! checkpoint and state ([`readers`]: the sink's are `c` and `f`, as above); `l` -> the
//! first block the sink had not sent when it was switched off while the forwarder
//! kept the feed on ([`readers`]).

pub mod readers;
pub mod retention;
pub mod row_version;

use std::convert::Infallible;

use serde::{Deserialize, Serialize};
use sled::transaction::{
    ConflictableTransactionError, TransactionError, TransactionalTree, UnabortableTransactionError,
};
use uuid::Uuid;

use super::person_cache::Changes;

pub use readers::{Reader, FORWARD, SINK};
pub use retention::{backfill_done, held, keep_from, MAX_HELD_EVENTS};
pub use row_version::{version, VERSION_STEP};

/// The tree's name, part of the on-disk format (named when the sink was its only reader).
pub const TREE: &str = "sink_outbox";
const ENTRY: u8 = b'e';
const NEXT: &[u8] = b"n";
const CHECKPOINT: &[u8] = b"c";
const IN_FLIGHT: &[u8] = b"f";
const NODE: &[u8] = b"i";
const BACKFILL: &[u8] = b"b";
const HIGHEST: &[u8] = b"h";
const GAP: &[u8] = b"g";
const VERSION: &[u8] = b"v";
/// The entries' encoding: JSON, its version being its seq.
const FORMAT_1: u8 = 1;
/// The entries' encoding: the version (u64 BE), then JSON.
const FORMAT: u8 = 2;

/// What one compactor chunk committed, as a reader of the feed needs it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Committed {
    /// Unix milliseconds of the commit.
    pub at: i64,
    /// Keys in the `events` tree of the blocks the chunk wrote.
    pub blocks: Vec<Vec<u8>>,
    /// How many events those blocks hold.
    pub events: u64,
    /// (project, person id) written or deleted (merged away).
    pub persons: Vec<(u64, Uuid)>,
    /// (project, distinct id) linked to a person, merges' moves included.
    pub linked: Vec<(u64, String)>,
    /// (project, group type index, group key) written.
    pub groups: Vec<(u64, u8, String)>,
}

impl Committed {
    /// What a chunk committed at `at`: the keys of the blocks it wrote holding
    /// `events` events, and the persons, links and groups it changed.
    pub fn of(at: i64, blocks: &[[u8; 24]], events: u64, changes: &Changes) -> Committed {
        Committed {
            at,
            blocks: blocks.iter().map(|k| k.to_vec()).collect(),
            events,
            persons: changes.persons.clone(),
            linked: changes.linked.clone(),
            groups: changes.groups.clone(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
            && self.persons.is_empty()
            && self.linked.is_empty()
            && self.groups.is_empty()
    }

    /// Rows this entry sends at most (fewer once a batch drops repeats).
    pub fn rows(&self) -> u64 {
        self.events + (self.persons.len() + self.linked.len() + self.groups.len()) as u64
    }

    fn encode(&self, version: u64) -> Vec<u8> {
        let mut out = vec![FORMAT];
        out.extend_from_slice(&version.to_be_bytes());
        // Plain data of known types: serialising cannot fail.
        out.extend(serde_json::to_vec(self).unwrap_or_default());
        out
    }

    /// The entry and its version; entries written before versions came from the
    /// clock have their seq, below every clock-made version.
    fn decode(bytes: &[u8], seq: u64) -> Option<(Committed, u64)> {
        match bytes.split_first()? {
            (&FORMAT_1, json) => Some((serde_json::from_slice(json).ok()?, seq)),
            (&FORMAT, rest) => {
                let version = be64(rest.get(..8)?)?;
                Some((serde_json::from_slice(&rest[8..]).ok()?, version))
            }
            _ => None,
        }
    }
}

/// Record `committed` in the outbox inside the compactor's transaction; returns its
/// seq, or None if the chunk changed nothing a reader sends.
pub fn record(
    outbox: &TransactionalTree,
    committed: &Committed,
) -> Result<Option<u64>, UnabortableTransactionError> {
    if committed.is_empty() {
        return Ok(None);
    }
    let seq = outbox.get(NEXT)?.and_then(|v| be64(&v)).unwrap_or(1);
    let node = outbox.get(NODE)?.and_then(|v| Uuid::from_slice(&v).ok());
    let last = outbox.get(VERSION)?.and_then(|v| be64(&v));
    let version = version(committed.at, node, last);
    note_blocks(outbox, committed)?;
    outbox.insert(&entry_key(seq)[..], committed.encode(version))?;
    outbox.insert(NEXT, &(seq + 1).to_be_bytes()[..])?;
    outbox.insert(VERSION, &version.to_be_bytes()[..])?;
    Ok(Some(seq))
}

/// Block ids come from one counter, so with the feed on every entry's blocks follow
/// on from the last; a jump means blocks were written while it was off.
fn note_blocks(
    outbox: &TransactionalTree,
    committed: &Committed,
) -> Result<(), UnabortableTransactionError> {
    let ids = committed
        .blocks
        .iter()
        .filter_map(|k| k.get(16..24).and_then(be64));
    let (Some(low), Some(high)) = (ids.clone().min(), ids.max()) else {
        return Ok(());
    };
    let highest = outbox.get(HIGHEST)?.and_then(|v| be64(&v));
    if let Some(h) = highest.filter(|h| low > h + 1) {
        let (mut first, mut end) = (h + 1, low);
        if let Some((f, e)) = outbox.get(GAP)?.and_then(|v| pair(&v)) {
            (first, end) = (first.min(f), end.max(e));
        }
        outbox.insert(GAP, pair_bytes(first, end))?;
    }
    let high = highest.map_or(high, |h| h.max(high));
    outbox.insert(HIGHEST, &high.to_be_bytes()[..])?;
    Ok(())
}

fn pair(v: &[u8]) -> Option<(u64, u64)> {
    Some((be64(v.get(..8)?)?, be64(v.get(8..16)?)?))
}

fn pair_bytes(a: u64, b: u64) -> Vec<u8> {
    let mut v = a.to_be_bytes().to_vec();
    v.extend_from_slice(&b.to_be_bytes());
    v
}

/// One outbox entry, read back.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub seq: u64,
    /// The version its persons' and links' rows carry.
    pub version: u64,
    pub committed: Committed,
}

/// The reader's side of the outbox tree.
#[derive(Clone)]
pub struct Outbox {
    tree: sled::Tree,
}

impl Outbox {
    pub fn open(db: &sled::Db) -> sled::Result<Outbox> {
        Ok(Outbox {
            tree: db.open_tree(TREE)?,
        })
    }

    /// The outbox in an already open tree (the store's `outbox`).
    pub fn from_tree(tree: sled::Tree) -> Outbox {
        Outbox { tree }
    }

    pub fn tree(&self) -> &sled::Tree {
        &self.tree
    }

    /// This database's id, made once: part of every deduplication token and of
    /// every version.
    pub fn node(&self) -> sled::Result<Uuid> {
        if let Some(v) = self.tree.get(NODE)? {
            if let Ok(id) = Uuid::from_slice(&v) {
                return Ok(id);
            }
        }
        let id = Uuid::new_v4();
        // Two callers racing keep whichever id landed first.
        let _ =
            self.tree
                .compare_and_swap(NODE, None as Option<&[u8]>, Some(&id.as_bytes()[..]))?;
        let v = self
            .tree
            .get(NODE)?
            .unwrap_or_else(|| id.as_bytes()[..].into());
        Ok(Uuid::from_slice(&v).unwrap_or(id))
    }

    /// The last seq ClickHouse acknowledged, 0 before the first.
    pub fn checkpoint(&self) -> sled::Result<u64> {
        Ok(self
            .tree
            .get(CHECKPOINT)?
            .and_then(|v| be64(&v))
            .unwrap_or(0))
    }

    /// The oldest entry the sink has not sent: its commit time, if any.
    pub fn oldest(&self) -> sled::Result<Option<i64>> {
        Ok(self
            .reader(SINK)
            .entries()?
            .next()
            .transpose()?
            .map(|e| e.committed.at))
    }

    /// Entries in order, from `from` (inclusive) or the first. Undecodable entries
    /// read as empty ones so they are passed over, not stuck on.
    pub fn entries(
        &self,
        from: Option<u64>,
    ) -> sled::Result<impl Iterator<Item = sled::Result<Entry>>> {
        let start = entry_key(from.unwrap_or(0)).to_vec();
        let end = vec![ENTRY + 1];
        Ok(self.tree.range(start..end).map(|kv| {
            let (k, v) = kv?;
            let seq = be64(&k[1..]).unwrap_or(0);
            let (committed, version) = Committed::decode(&v, seq).unwrap_or_else(|| {
                tracing::error!(seq, "sink: an outbox entry does not decode; skipped");
                (Committed::default(), seq)
            });
            Ok(Entry {
                seq,
                version,
                committed,
            })
        }))
    }

    /// The backfill's progress as last acknowledged, if it ever started.
    pub fn backfill(&self) -> sled::Result<Option<sled::IVec>> {
        self.tree.get(BACKFILL)
    }

    /// Record the backfill's progress once ClickHouse took a batch of it.
    pub fn set_backfill(&self, state: &[u8]) -> sled::Result<()> {
        self.tree.insert(BACKFILL, state)?;
        Ok(())
    }

    /// Block ids written while the feed was off (first, end exclusive), if any.
    pub fn gap(&self) -> sled::Result<Option<(u64, u64)>> {
        Ok(self.tree.get(GAP)?.and_then(|v| pair(&v)))
    }

    /// Hand the gap over to a backfill that will send it: store `progress` and
    /// forget the gap in one transaction.
    pub fn take_gap(&self, progress: &[u8]) -> sled::Result<()> {
        self.tree
            .transaction(|tx| {
                tx.insert(BACKFILL, progress)?;
                tx.remove(GAP)?;
                Ok::<_, ConflictableTransactionError<Infallible>>(())
            })
            .map_err(storage)
    }

    /// The lowest event block id any entry names: blocks from there on reach
    /// ClickHouse through the outbox. None if no entry names a block.
    pub fn first_block_id(&self) -> sled::Result<Option<u64>> {
        let mut lowest = None;
        for entry in self.entries(None)? {
            for key in &entry?.committed.blocks {
                if let Some(id) = key.get(16..24).and_then(be64) {
                    lowest = Some(lowest.map_or(id, |l: u64| l.min(id)));
                }
            }
        }
        Ok(lowest)
    }

    /// The batch fixed for sending, if one is in flight.
    pub fn in_flight(&self) -> sled::Result<Option<(u64, u64)>> {
        Ok(self.tree.get(IN_FLIGHT)?.and_then(|v| pair(&v)))
    }

    /// Fix `first..=last` as the batch to send, durably, before sending it.
    pub fn fix(&self, first: u64, last: u64) -> sled::Result<()> {
        self.tree.insert(IN_FLIGHT, pair_bytes(first, last))?;
        self.tree.flush()?;
        Ok(())
    }

    /// ClickHouse took `first..=last` in every table: clear the batch in flight and
    /// move the checkpoint in one transaction, then remove the entries every active
    /// reader has passed.
    pub fn acknowledge(&self, _first: u64, last: u64) -> sled::Result<()> {
        self.reader(SINK).advance(last, &[b"f"], false)
    }
}

fn entry_key(seq: u64) -> [u8; 9] {
    let mut k = [ENTRY; 9];
    k[1..].copy_from_slice(&seq.to_be_bytes());
    k
}

fn be64(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.try_into().ok()?))
}

/// The storage error of a transaction that never aborts.
fn storage(e: TransactionError<Infallible>) -> sled::Error {
    match e {
        TransactionError::Storage(e) => e,
        TransactionError::Abort(never) => match never {},
    }
}

#[cfg(test)]
mod tests;
