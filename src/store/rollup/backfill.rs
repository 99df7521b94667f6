//! Building rollups from stored events: for a database written before rollups
//! existed, or with rollups of another version. [`prepare`] runs when the trees open,
//! before the compactor starts: it empties the tree and records in `meta` the first
//! block id the compactor will write. Blocks from there on get their rollups from the
//! compactor's own transaction; [`Backfill::step`] adds the blocks below it, a batch
//! at a time, each batch in one transaction with the position reached, so a restart
//! resumes where it stopped and never counts a block twice. `pipeline` runs the steps
//! on a thread of their own; the console scans events until the state is gone.

use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};
use sled::IVec;

use super::super::block::Files;
use super::super::keys::{self, NEXT_BLOCK_KEY};
use super::super::Trees;
use super::{Pending, VERSION, VERSION_KEY};

/// In `meta` while a backfill is due: [`State`].
pub const STATE_KEY: &[u8] = b"rollups.backfill";
/// Event blocks per backfill transaction (up to 256 events each).
const BATCH: usize = 64;

/// Where a backfill stands: blocks with an id below `boundary` are its to count, and
/// those with keys up to `cursor` are counted. Value: boundary (u64 BE), percent,
/// cursor.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    pub boundary: u64,
    pub percent: u8,
    pub cursor: Vec<u8>,
}

impl State {
    pub fn load(meta: &sled::Tree) -> Result<Option<State>, sled::Error> {
        Ok(meta.get(STATE_KEY)?.and_then(|v| State::decode(&v)))
    }

    fn decode(v: &[u8]) -> Option<State> {
        Some(State {
            boundary: u64::from_be_bytes(v.get(..8)?.try_into().ok()?),
            percent: *v.get(8)?,
            cursor: v.get(9..)?.to_vec(),
        })
    }

    fn encode(&self) -> Vec<u8> {
        [
            &self.boundary.to_be_bytes()[..],
            &[self.percent],
            &self.cursor,
        ]
        .concat()
    }
}

/// Make the rollups tree current: nothing to do if it is, else emptied, and a
/// backfill recorded if there are stored events to count. Runs before the compactor.
pub fn prepare(trees: &Trees) -> Result<(), sled::Error> {
    let version = trees.meta.get(VERSION_KEY)?;
    if version.as_deref() == Some(&[VERSION][..]) {
        return Ok(());
    }
    trees.rollups.clear()?;
    let mut batch = sled::Batch::default();
    // Every block is the backfill's to count now, those held in memory too.
    batch.remove(super::FROM_KEY);
    if trees.events.is_empty() {
        batch.remove(STATE_KEY);
    } else {
        let boundary = trees
            .meta
            .get(NEXT_BLOCK_KEY)?
            .and_then(|v| v.as_ref().try_into().ok())
            .map_or(0, u64::from_be_bytes);
        let state = State {
            boundary,
            percent: 0,
            cursor: Vec::new(),
        };
        tracing::info!(
            found = ?version.as_deref(),
            version = VERSION,
            "the console's rollups are built from the stored events in the background"
        );
        batch.insert(STATE_KEY, state.encode());
    }
    batch.insert(VERSION_KEY, &[VERSION][..]);
    trees.meta.apply_batch(batch)?;
    trees.meta.flush()?;
    Ok(())
}

/// Each project's span of block times below the boundary, for the progress.
pub struct Backfill {
    spans: Vec<(u64, i64, i64)>,
}

/// What a step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A batch counted; the percent done.
    Progress(u8),
    Done,
}

impl Backfill {
    pub fn new(trees: &Trees) -> Result<Backfill, sled::Error> {
        let mut spans = Vec::new();
        let mut next = Some(0u64);
        while let Some(start) = next {
            let Some((key, _)) = trees.events.get_gt(keys::project(start))? else {
                break;
            };
            let Some((project, oldest)) = keys::split_block(&key) else {
                break;
            };
            let hi = keys::event_bound(project, i64::MAX);
            let newest = match trees.events.get_lt(hi)? {
                Some((k, _)) => keys::split_block(&k).map_or(oldest, |(_, t)| t),
                None => oldest,
            };
            spans.push((project, oldest, newest));
            next = project.checked_add(1);
        }
        Ok(Backfill { spans })
    }

    /// How far a cursor (an `events` key) is through the spans, 0-99.
    fn percent(&self, cursor: &[u8]) -> u8 {
        let Some((project, t)) = keys::split_block(cursor) else {
            return 0;
        };
        let width = |(_, a, b): &(u64, i64, i64)| (b.saturating_sub(*a) as f64).max(1.0);
        let total: f64 = self.spans.iter().map(width).sum();
        let done: f64 = self
            .spans
            .iter()
            .map(|s| match s.0.cmp(&project) {
                std::cmp::Ordering::Less => width(s),
                std::cmp::Ordering::Equal => (t.saturating_sub(s.1) as f64).clamp(0.0, width(s)),
                std::cmp::Ordering::Greater => 0.0,
            })
            .sum();
        ((done / total * 100.0) as u8).min(99)
    }

    /// Count the next batch of blocks; `Done` once every block below the boundary is
    /// counted (the state is then removed from `meta`).
    pub fn step(&self, trees: &Trees) -> Result<Step, sled::Error> {
        let Some(mut state) = State::load(&trees.meta)? else {
            return Ok(Step::Done);
        };
        let mut pending = Pending::default();
        let mut last: Option<IVec> = None;
        let start = [state.cursor.as_slice(), &[0]].concat();
        let range = match state.cursor.is_empty() {
            true => trees.events.range::<&[u8], _>(..),
            false => trees.events.range(start..),
        };
        for entry in range.take(BATCH) {
            let (key, value) = entry?;
            let id = keys::block_id(&key);
            let project = keys::split_block(&key).map(|(p, _)| p);
            if let (Some(id), Some(project)) = (id, project) {
                if id < state.boundary {
                    add_block(&mut pending, &trees.blocks, project, &key, &value);
                }
            }
            last = Some(key);
        }
        let done = last.is_none();
        if let Some(key) = last {
            state.percent = self.percent(&key);
            state.cursor = key.to_vec();
        }
        let outcome = (&trees.rollups.tree, &trees.meta).transaction(|(rollups, meta)| {
            // Checked again inside: the state written is the one read.
            if meta.get(STATE_KEY)?.is_none() {
                return Err(ConflictableTransactionError::Abort(()));
            }
            pending.write(rollups)?;
            match done {
                true => meta.remove(STATE_KEY)?,
                false => meta.insert(STATE_KEY, state.encode())?,
            };
            Ok(())
        });
        match outcome {
            Ok(()) | Err(TransactionError::Abort(())) => {}
            Err(TransactionError::Storage(e)) => return Err(e),
        }
        Ok(match done {
            true => Step::Done,
            false => Step::Progress(state.percent),
        })
    }
}

/// Every event of a stored block into `pending`; a block that does not decode is
/// skipped, as reads skip it.
pub(super) fn add_block(
    pending: &mut Pending,
    files: &Files,
    project: u64,
    key: &[u8],
    value: &[u8],
) {
    let Some(block) = files.decode(key, value) else {
        return;
    };
    for h in block.heads() {
        pending.add(
            project,
            h.timestamp,
            block.event(h),
            h.person_id,
            block.distinct_id(h),
            block.properties(h),
        );
    }
}
