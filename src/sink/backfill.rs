//! Backfill: what the store held before the sink was first switched on, sent once,
//! beside the outbox's new changes. Persons go first, then distinct ids, then groups
//! (so events never refer to a person ClickHouse lacks for long), then events, each
//! tree in key order, so events go oldest first within each project. Progress (the
//! phase and the last key sent) is kept in the outbox tree and moved only after
//! ClickHouse took a batch, so a restart resumes where it was.
//!
//! A backfill also runs when the sink was switched off for a while and on again: the
//! outbox notes the block ids written meanwhile (a gap in the ids it records), and
//! persons, distinct ids and groups are sent whole again with the events of those
//! blocks.
//!
//! Rows it sends carry version 0 and offset 0, below every outbox entry's, so a
//! change made meanwhile is never overwritten by the backfill's older view. Event
//! blocks the outbox already names (the sink was on when they were written) are
//! skipped; anything sent by both collapses anyway.

use std::ops::Bound;

use serde::{Deserialize, Serialize};
use sha1::{Digest, Sha1};
use uuid::Uuid;

use super::batch::{block_rows, Sources, MIN_ROWS};
use super::rowbinary::RowBinary;
use super::rows::{DistinctIdRow, GroupRow, Origin, PersonRow};
use super::schema::Table;
use super::version::Shape;
use crate::persons::Person;
use crate::store::outbox::Outbox;
use crate::store::{keys, Group};

/// What the backfill is sending now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    Persons,
    DistinctIds,
    Groups,
    Events,
    Done,
}

impl Phase {
    fn next(self) -> Phase {
        match self {
            Phase::Persons => Phase::DistinctIds,
            Phase::DistinctIds => Phase::Groups,
            Phase::Groups => Phase::Events,
            Phase::Events | Phase::Done => Phase::Done,
        }
    }

    fn table(self) -> Table {
        match self {
            Phase::Persons => Table::Person,
            Phase::DistinctIds => Table::DistinctId,
            Phase::Groups => Table::Group,
            Phase::Events | Phase::Done => Table::Event,
        }
    }
}

/// The backfill's progress, as stored in the outbox tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    pub phase: Phase,
    /// The last key of the phase's tree ClickHouse took; None at the phase's start.
    pub after: Option<Vec<u8>>,
    /// Event blocks with this id or above reach ClickHouse through the outbox.
    pub below_block: u64,
    /// Event blocks below this id were sent before (a backfill after the sink was
    /// off sends only the blocks written meanwhile).
    #[serde(default)]
    pub from_block: u64,
    /// Rows sent so far, for the log.
    pub rows: u64,
}

impl Progress {
    /// The stored progress, or a new backfill if the sink never ran on this store.
    /// A new one sends the blocks below both the first the outbox names and the
    /// compactor's next (read in that order, so a block written in between is sent
    /// twice rather than not at all).
    pub fn load(outbox: &Outbox, sources: &Sources) -> sled::Result<Progress> {
        if let Some(stored) = outbox.backfill()? {
            if let Ok(p) = serde_json::from_slice(&stored) {
                return Ok(p);
            }
            tracing::error!("sink: backfill progress does not decode; starting it over");
        }
        let in_outbox = outbox.first_block_id()?.unwrap_or(u64::MAX);
        let unwritten = sources.next_block_id()?.unwrap_or(0);
        Ok(Progress {
            phase: Phase::Persons,
            after: None,
            below_block: in_outbox.min(unwritten),
            from_block: 0,
            rows: 0,
        })
    }

    /// The backfill to run now: the stored or a new one ([`Progress::load`]), saved;
    /// or, once that is done, one for blocks written while the sink was off.
    pub fn resume(outbox: &Outbox, sources: &Sources) -> sled::Result<Progress> {
        let progress = Progress::load(outbox, sources)?;
        if !progress.is_done() {
            progress.save(outbox)?;
            return Ok(progress);
        }
        let Some((first, end)) = outbox.gap()? else {
            return Ok(progress);
        };
        tracing::warn!(
            blocks = end - first,
            "sink: it was off for a while; sending again what changed meanwhile"
        );
        let gap = Progress {
            phase: Phase::Persons,
            after: None,
            below_block: end,
            from_block: first,
            rows: 0,
        };
        outbox.take_gap(&serde_json::to_vec(&gap).unwrap_or_default())?;
        Ok(gap)
    }

    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    pub fn save(&self, outbox: &Outbox) -> sled::Result<()> {
        // Plain data: serialising cannot fail.
        outbox.set_backfill(&serde_json::to_vec(self).unwrap_or_default())
    }
}

/// The next run of one tree: its rows for one table, and the progress once taken.
#[derive(Debug)]
pub struct Step {
    pub table: Table,
    pub rows: Vec<u8>,
    pub count: u64,
    pub then: Progress,
}

impl Step {
    /// The same for every re-send of this run: it names where the run starts.
    pub fn token(&self, node: Uuid, from: &Progress) -> String {
        let start = Sha1::digest(from.after.as_deref().unwrap_or_default());
        let start: String = start.iter().take(10).map(|b| format!("{b:02x}")).collect();
        format!("{node}-backfill-{:?}-{start}", from.phase)
    }
}

/// Read the next run after `from`: at least [`MIN_ROWS`] rows, or the rest of the
/// phase's tree, in which case the progress moves to the next phase.
pub fn next(sources: &Sources, from: &Progress, shape: Shape) -> sled::Result<Step> {
    let start = match &from.after {
        Some(k) => Bound::Excluded(k.clone()),
        None => Bound::Unbounded,
    };
    let range = (start, Bound::Unbounded);
    let entries: Box<dyn Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>> = match from.phase
    {
        Phase::Persons => Box::new(sources.persons.range(range)),
        Phase::DistinctIds => Box::new(sources.distinct_ids.range(range)),
        Phase::Groups => Box::new(sources.groups.range(range)),
        Phase::Events | Phase::Done => Box::new(sources.events.range(range)),
    };
    let mut out = RowBinary::default();
    let (mut count, mut last) = (0u64, None);
    let mut exhausted = true;
    if from.phase != Phase::Done {
        for kv in entries {
            let (k, v) = kv?;
            count += encode(sources, from, &k, &v, shape, &mut out);
            last = Some(k.to_vec());
            if count >= MIN_ROWS {
                exhausted = false;
                break;
            }
        }
    }
    let then = Progress {
        phase: if exhausted {
            from.phase.next()
        } else {
            from.phase
        },
        after: if exhausted { None } else { last },
        below_block: from.below_block,
        from_block: from.from_block,
        rows: from.rows + count,
    };
    Ok(Step {
        table: from.phase.table(),
        rows: out.into_bytes(),
        count,
        then,
    })
}

/// [`next`], with everything it read made durable before it is handed over to be
/// sent, as [`super::batch::ready`] does for the outbox's batches. Blocking.
pub fn ready(sources: &Sources, from: &Progress, shape: Shape) -> sled::Result<Step> {
    let step = next(sources, from, shape)?;
    sources.durable()?;
    Ok(step)
}

/// One stored value as rows of the phase's table; returns how many (none for
/// values that do not decode, or blocks the outbox sends).
fn encode(
    sources: &Sources,
    from: &Progress,
    key: &[u8],
    value: &[u8],
    shape: Shape,
    out: &mut RowBinary,
) -> u64 {
    let Some(project) = key
        .get(..8)
        .and_then(|p| p.try_into().ok())
        .map(u64::from_be_bytes)
    else {
        return 0;
    };
    let origin = Origin {
        committed_ms: 0,
        offset: 0,
    };
    match from.phase {
        Phase::Persons => {
            let Ok(p) = serde_json::from_slice::<Person>(value) else {
                return 0;
            };
            let properties = serde_json::to_vec(&p.properties).unwrap_or_else(|_| b"{}".to_vec());
            PersonRow {
                id: p.id,
                created_at: p.created_at,
                team_id: project as i64,
                properties: &properties,
                is_identified: p.is_identified,
                is_deleted: false,
                version: 0,
                origin: Origin {
                    committed_ms: p.created_at,
                    ..origin
                },
            }
            .encode(shape, out);
        }
        Phase::DistinctIds => {
            let (Ok(person), Ok(distinct_id)) =
                (Uuid::from_slice(value), std::str::from_utf8(&key[8..]))
            else {
                return 0;
            };
            DistinctIdRow {
                team_id: project as i64,
                distinct_id,
                person_id: person,
                is_deleted: false,
                version: 0,
                origin,
            }
            .encode(shape, out);
        }
        Phase::Groups => {
            let Ok(g) = serde_json::from_slice::<Group>(value) else {
                return 0;
            };
            let properties = serde_json::to_vec(&g.properties).unwrap_or_else(|_| b"{}".to_vec());
            GroupRow {
                group_type_index: g.group_type_index,
                group_key: &g.group_key,
                created_at: g.created_at,
                team_id: project as i64,
                group_properties: &properties,
                origin: Origin {
                    committed_ms: g.created_at,
                    ..origin
                },
            }
            .encode(shape, out);
        }
        Phase::Events => {
            let id = crate::store::keys::block_id(key);
            if id.is_none_or(|id| id < from.from_block || id >= from.below_block) {
                return 0;
            }
            let Some(block) = sources.blocks.decode(key, value) else {
                return 0;
            };
            let newest = keys::split_block(key).map_or(0, |(_, t)| t);
            let origin = Origin {
                committed_ms: newest,
                ..origin
            };
            return block_rows(&block, project, origin, shape, out);
        }
        Phase::Done => return 0,
    }
    1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::outbox::{
        backfill_done, held, keep_from, record, Committed, MAX_HELD_EVENTS,
    };
    use sled::transaction::ConflictableTransactionError;

    #[test]
    fn holds_what_the_outbox_and_the_backfill_still_send() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path()).unwrap();
        let outbox = Outbox::open(&db).unwrap();
        let tree = outbox.tree().clone();
        // No worker yet: everything waits for the backfill.
        assert_eq!(keep_from(&tree).unwrap(), Some(0));
        let done = Progress {
            phase: Phase::Done,
            after: None,
            below_block: 0,
            from_block: 0,
            rows: 0,
        };
        done.save(&outbox).unwrap();
        assert_eq!(keep_from(&tree).unwrap(), None, "all sent");
        let chunk = |id: u64, events: u64| Committed {
            at: 1,
            blocks: vec![keys::block(1, 5, id).to_vec()],
            events,
            ..Committed::default()
        };
        for c in [chunk(7, 10), chunk(9, 10)] {
            tree.transaction(|tx| Ok::<_, ConflictableTransactionError<()>>(record(tx, &c)?))
                .unwrap();
        }
        assert_eq!(keep_from(&tree).unwrap(), Some(7));
        assert!(held(&keys::block(1, 0, 7), Some(7)));
        assert!(!held(&keys::block(1, 0, 6), Some(7)));
        assert!(!held(&keys::block(1, 0, 6), None));
        let huge = chunk(11, MAX_HELD_EVENTS);
        tree.transaction(|tx| Ok::<_, ConflictableTransactionError<()>>(record(tx, &huge)?))
            .unwrap();
        assert_eq!(keep_from(&tree).unwrap(), None, "past the cap");
    }

    /// Retention reads the stored progress with its own view of it (the store sits
    /// below the sink): done exactly when this type says so.
    #[test]
    fn retention_reads_the_progress_as_stored() {
        let phases = [
            Phase::Persons,
            Phase::DistinctIds,
            Phase::Groups,
            Phase::Events,
            Phase::Done,
        ];
        for phase in phases {
            for after in [None, Some(vec![1, 2, 3])] {
                let progress = Progress {
                    phase,
                    after,
                    below_block: 9,
                    from_block: 3,
                    rows: 7,
                };
                let stored = serde_json::to_vec(&progress).unwrap();
                assert_eq!(backfill_done(&stored), progress.is_done(), "{progress:?}");
                assert_eq!(progress.is_done(), phase == Phase::Done);
            }
        }
        // Progress this type cannot read is a backfill still to run, for both.
        for bad in [
            &b"{"[..],
            br#"{"phase":"Done"}"#,
            br#"{"phase":"Done","below_block":"x","rows":0}"#,
        ] {
            assert!(serde_json::from_slice::<Progress>(bad).is_err());
            assert!(!backfill_done(bad));
        }
        // Other forms serde takes, or refuses, read the same by both.
        for other in [
            &br#"{"phase":{"Done":null},"after":null,"below_block":9,"rows":7}"#[..],
            br#"{"phase":{"Events":null},"after":null,"below_block":9,"rows":7}"#,
            br#"{"phase":"Finished","after":null,"below_block":9,"rows":7}"#,
        ] {
            let sink = serde_json::from_slice::<Progress>(other).is_ok_and(|p| p.is_done());
            assert_eq!(
                backfill_done(other),
                sink,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
        let map_done = br#"{"phase":{"Done":null},"after":null,"below_block":9,"rows":7}"#;
        assert!(backfill_done(map_done));
    }
}
