//! One batch: a run of outbox entries turned into each table's rows, RowBinary
//! encoded. Which entries form a batch is decided once and fixed in the outbox before
//! sending ([`choose`]), so a batch re-sent after a crash covers the same entries and
//! carries the same deduplication tokens. Rows are built from the stored data as it is
//! now; a person, link or group named by several entries of the batch is sent once,
//! at the highest of their versions.

use std::collections::BTreeMap;

use uuid::Uuid;

use super::attached::Attached;
use super::rowbinary::RowBinary;
use super::rows::{DistinctIdRow, EventRow, GroupRow, Origin, PersonRow};
use super::schema::Table;
use super::version::Shape;
use crate::persons::Person;
use crate::store::block::Block;
use crate::store::outbox::{Entry, Outbox};
use crate::store::{keys, Group};
use crate::support::syncs::Syncs;

/// A batch holds at least this many rows when the outbox has them: fewer, larger
/// inserts are faster (against 10k-row batches: 1.11 to 1.78 times the events/s for
/// the insert alone, median 1.07 on the worker's whole path, BENCHMARKS.md), and old
/// servers refuse inserts past 300 parts per partition. About 35 MB of RowBinary for
/// pageviews.
pub const MIN_ROWS: u64 = 50_000;
/// What [`Syncs`] calls the sync before a batch is sent.
pub(crate) const SEND_SYNC: &str = "before sending";
/// When the outbox holds fewer than [`MIN_ROWS`], its oldest entry waits this long
/// for company before being sent in a small batch.
pub const LINGER_MS: i64 = 1_000;

/// The stored data rows are built from: trees of the store.
#[derive(Clone)]
pub struct Sources {
    pub events: sled::Tree,
    /// Where the event blocks' bytes are.
    pub blocks: crate::store::block::Files,
    pub persons: crate::store::layered::Layered,
    pub distinct_ids: crate::store::layered::Layered,
    pub groups: sled::Tree,
    /// The compactor's next block id, where blocks not yet written begin.
    pub meta: sled::Tree,
    /// The sync before sending goes through it ([`Sources::durable`]).
    syncs: std::sync::Arc<Syncs>,
}

impl Sources {
    pub fn of(trees: &crate::store::Trees) -> Sources {
        Sources {
            events: trees.events.clone(),
            blocks: trees.blocks.clone(),
            persons: trees.persons.clone(),
            distinct_ids: trees.distinct_ids.clone(),
            groups: trees.groups.clone(),
            meta: trees.meta.clone(),
            syncs: Default::default(),
        }
    }

    /// Make everything read so far durable, the batch in flight included: a flush of
    /// any tree is one of the whole database. Blocking.
    pub fn durable(&self) -> sled::Result<()> {
        self.syncs.run(SEND_SYNC, || self.events.flush().map(drop))
    }

    #[cfg(test)]
    pub(crate) fn syncs(&self) -> &Syncs {
        &self.syncs
    }

    /// The id the compactor gives its next event block.
    pub fn next_block_id(&self) -> sled::Result<Option<u64>> {
        let stored = self.meta.get(crate::store::keys::NEXT_BLOCK_KEY)?;
        Ok(stored.and_then(|v| Some(u64::from_be_bytes(v.as_ref().try_into().ok()?))))
    }
}

/// The entries to send next, fixed in the outbox: the batch in flight if there is
/// one, else entries from the oldest until `min_rows` ([`MIN_ROWS`] in the worker),
/// or all once the oldest has waited [`LINGER_MS`]. None if there is nothing to send
/// yet.
pub fn choose(outbox: &Outbox, now_ms: i64, min_rows: u64) -> sled::Result<Option<Vec<Entry>>> {
    if let Some((first, last)) = outbox.in_flight()? {
        let entries: Vec<Entry> = outbox
            .entries(Some(first))?
            .take_while(|e| e.as_ref().map_or(true, |e| e.seq <= last))
            .collect::<sled::Result<_>>()?;
        if !entries.is_empty() {
            return Ok(Some(entries));
        }
        // A batch in flight whose entries are all gone has nothing left to send;
        // waiting on it would stop the sink for good.
        outbox.acknowledge(first, last)?;
    }
    let mut entries = Vec::new();
    let mut rows = 0;
    for entry in outbox.reader(crate::store::outbox::SINK).entries()? {
        let entry = entry?;
        rows += entry.committed.rows();
        entries.push(entry);
        // An entry is never split, so a batch holds at most one chunk's rows more.
        if rows >= min_rows {
            break;
        }
    }
    let Some(oldest) = entries.first().map(|e| e.committed.at) else {
        return Ok(None);
    };
    if rows < min_rows && now_ms - oldest < LINGER_MS {
        return Ok(None);
    }
    let last = entries.last().map_or(0, |e| e.seq);
    outbox.fix(entries[0].seq, last)?;
    Ok(Some(entries))
}

/// The next batch, ready to send: chosen and fixed ([`choose`]), its rows read
/// ([`build`]), then everything read made durable ([`Sources::durable`]), so no row
/// sent can be rolled back by a crash (see [`super::worker`]). None if there is
/// nothing to send yet. Blocking.
pub fn ready(
    outbox: &Outbox,
    sources: &Sources,
    now_ms: i64,
    min_rows: u64,
    shape: Shape,
) -> sled::Result<Option<Batch>> {
    let Some(entries) = choose(outbox, now_ms, min_rows)? else {
        return Ok(None);
    };
    let batch = build(sources, &entries, shape)?;
    sources.durable()?;
    Ok(Some(batch))
}

/// A batch's rows, per table, in insert order.
#[derive(Debug, Default)]
pub struct Batch {
    pub first: u64,
    pub last: u64,
    /// Each table's rows (RowBinary) and how many there are.
    pub tables: Vec<(Table, Vec<u8>, u64)>,
    /// Event blocks named by the outbox but no longer stored (retention deleted
    /// them first).
    pub missing_blocks: u64,
}

impl Batch {
    pub fn rows(&self) -> u64 {
        self.tables.iter().map(|(_, _, n)| n).sum()
    }

    /// The deduplication token of one table's insert: the same for every re-send of
    /// this batch, different for every other batch and node.
    pub fn token(&self, node: Uuid, table: Table) -> String {
        format!("{node}-{}-{}-{}", self.first, self.last, table.name())
    }
}

/// Read what `entries` name from `sources` and encode every table's rows for `shape`.
pub fn build(sources: &Sources, entries: &[Entry], shape: Shape) -> sled::Result<Batch> {
    let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
        return Ok(Batch::default());
    };
    let mut batch = Batch {
        first: first.seq,
        last: last.seq,
        ..Batch::default()
    };
    // The latest entry naming each person, link and group, in key order.
    let mut persons = BTreeMap::new();
    let mut links = BTreeMap::new();
    let mut groups = BTreeMap::new();
    for e in entries {
        let origin = Origin {
            committed_ms: e.committed.at,
            offset: e.seq,
        };
        for p in &e.committed.persons {
            persons.insert(*p, (origin, e.version));
        }
        for l in &e.committed.linked {
            links.insert(l.clone(), (origin, e.version));
        }
        for g in &e.committed.groups {
            groups.insert(g.clone(), origin);
        }
    }
    batch.tables.push(person_rows(sources, &persons, shape)?);
    batch.tables.push(link_rows(sources, &links, shape)?);
    batch.tables.push(group_rows(sources, &groups, shape)?);
    let (events, n, missing) = event_rows(sources, entries, shape)?;
    batch.tables.push((Table::Event, events, n));
    batch.missing_blocks = missing;
    Ok(batch)
}

fn person_rows(
    sources: &Sources,
    persons: &BTreeMap<(u64, Uuid), (Origin, u64)>,
    shape: Shape,
) -> sled::Result<(Table, Vec<u8>, u64)> {
    let mut out = RowBinary::default();
    for (&(project, id), &(origin, version)) in persons {
        let stored = sources.persons.get(keys::with_uuid(project, id))?;
        let person: Option<Person> = stored.and_then(|v| serde_json::from_slice(&v).ok());
        // A person no longer stored was merged into another: sent deleted, at a
        // higher version than any earlier row of it.
        let properties = person
            .as_ref()
            .map(|p| serde_json::to_vec(&p.properties).unwrap_or_else(|_| b"{}".to_vec()))
            .unwrap_or_else(|| b"{}".to_vec());
        PersonRow {
            id,
            created_at: person.as_ref().map_or(0, |p| p.created_at),
            team_id: project as i64,
            properties: &properties,
            is_identified: person.as_ref().is_some_and(|p| p.is_identified),
            is_deleted: person.is_none(),
            version,
            origin,
        }
        .encode(shape, &mut out);
    }
    Ok((Table::Person, out.into_bytes(), persons.len() as u64))
}

fn link_rows(
    sources: &Sources,
    links: &BTreeMap<(u64, String), (Origin, u64)>,
    shape: Shape,
) -> sled::Result<(Table, Vec<u8>, u64)> {
    let mut out = RowBinary::default();
    for ((project, distinct_id), &(origin, version)) in links {
        let stored = sources
            .distinct_ids
            .get(keys::with_str(*project, distinct_id))?;
        let person = stored.and_then(|v| Uuid::from_slice(&v).ok());
        DistinctIdRow {
            team_id: *project as i64,
            distinct_id,
            person_id: person.unwrap_or_default(),
            is_deleted: person.is_none(),
            version,
            origin,
        }
        .encode(shape, &mut out);
    }
    Ok((Table::DistinctId, out.into_bytes(), links.len() as u64))
}

fn group_rows(
    sources: &Sources,
    groups: &BTreeMap<(u64, u8, String), Origin>,
    shape: Shape,
) -> sled::Result<(Table, Vec<u8>, u64)> {
    let mut out = RowBinary::default();
    let mut n = 0;
    for ((project, index, key), &origin) in groups {
        let stored = sources.groups.get(keys::group(*project, *index, key))?;
        let Some(group) = stored.and_then(|v| serde_json::from_slice::<Group>(&v).ok()) else {
            continue;
        };
        let properties = serde_json::to_vec(&group.properties).unwrap_or_else(|_| b"{}".to_vec());
        GroupRow {
            group_type_index: *index,
            group_key: key,
            created_at: group.created_at,
            team_id: *project as i64,
            group_properties: &properties,
            origin,
        }
        .encode(shape, &mut out);
        n += 1;
    }
    Ok((Table::Group, out.into_bytes(), n))
}

/// Every event of every block the entries name, in entry and block order.
fn event_rows(
    sources: &Sources,
    entries: &[Entry],
    shape: Shape,
) -> sled::Result<(Vec<u8>, u64, u64)> {
    let events: u64 = entries.iter().map(|e| e.committed.events).sum();
    let mut out = RowBinary::with_capacity(events as usize * 512);
    let (mut n, mut missing) = (0, 0);
    for e in entries {
        let origin = Origin {
            committed_ms: e.committed.at,
            offset: e.seq,
        };
        for key in &e.committed.blocks {
            let Some((project, _)) = keys::split_block(key) else {
                missing += 1;
                continue;
            };
            let value = sources.events.get(key)?;
            let Some(block) = value.and_then(|v| sources.blocks.decode(key, &v)) else {
                missing += 1;
                continue;
            };
            n += block_rows(&block, project, origin, shape, &mut out);
        }
    }
    Ok((out.into_bytes(), n, missing))
}

/// Encode every event of `block` (of `project`) as an events row; returns how many.
pub fn block_rows(
    block: &Block,
    project: u64,
    origin: Origin,
    shape: Shape,
    out: &mut RowBinary,
) -> u64 {
    for h in block.heads() {
        let stored = block.properties(h);
        let attached = Attached::of(stored);
        EventRow {
            uuid: h.uuid,
            event: block.event(h),
            properties: attached.properties.as_deref().unwrap_or(stored),
            timestamp: h.timestamp,
            team_id: project as i64,
            distinct_id: block.distinct_id(h),
            elements_chain: &attached.elements_chain,
            created_at: h.created_at,
            person_id: h.person_id.unwrap_or_default(),
            groups: attached.groups.each_ref().map(String::as_str),
            origin,
        }
        .encode(shape, out);
    }
    block.heads().len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::outbox::{record, Committed};
    use sled::transaction::ConflictableTransactionError;

    fn write(outbox: &Outbox, at: i64, events: u64) {
        let c = Committed {
            at,
            blocks: vec![vec![0; 24]],
            events,
            ..Committed::default()
        };
        outbox
            .tree()
            .transaction(|tx| Ok::<_, ConflictableTransactionError<()>>(record(tx, &c)?))
            .unwrap();
    }

    /// The batch size these entries are sized for.
    const ROWS: u64 = 10_000;

    fn seqs(entries: Option<Vec<Entry>>) -> Option<Vec<u64>> {
        entries.map(|e| e.iter().map(|e| e.seq).collect())
    }

    #[test]
    fn batches_are_chosen_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path()).unwrap();
        let outbox = Outbox::open(&db).unwrap();
        assert_eq!(seqs(choose(&outbox, 0, ROWS).unwrap()), None, "empty");
        write(&outbox, 1_000, 10);
        // Young and small: it waits for company, then goes alone.
        assert_eq!(seqs(choose(&outbox, 1_500, ROWS).unwrap()), None);
        assert_eq!(seqs(choose(&outbox, 2_000, ROWS).unwrap()), Some(vec![1]));
        // Fixed: more entries do not change the batch in flight.
        write(&outbox, 2_000, 6_000);
        write(&outbox, 2_000, 6_000);
        write(&outbox, 2_000, 6_000);
        assert_eq!(seqs(choose(&outbox, 9_000, ROWS).unwrap()), Some(vec![1]));
        outbox.acknowledge(1, 1).unwrap();
        // At least ROWS, whole entries, however young.
        assert_eq!(
            seqs(choose(&outbox, 2_000, ROWS).unwrap()),
            Some(vec![2, 3])
        );
        // A batch in flight with no entries left is cleared rather than waited on.
        outbox.acknowledge(2, 3).unwrap();
        outbox.fix(2, 3).unwrap();
        assert_eq!(seqs(choose(&outbox, 2_000, ROWS).unwrap()), None);
        assert_eq!(outbox.in_flight().unwrap(), None);
        assert_eq!(seqs(choose(&outbox, 3_000, ROWS).unwrap()), Some(vec![4]));
    }
}

#[cfg(test)]
#[path = "tests/ready.rs"]
mod ready_tests;
