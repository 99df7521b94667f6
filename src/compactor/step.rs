//! One pass of the compactor ([`Compactor::step`]): a chunk of the log, then a
//! smaller chunk of each slower lane, each applied in ONE sled transaction that also
//! stores the chunk's event blocks, their rollups, its uuids for deduplication and the
//! checkpoint. Where a step's time goes is logged at debug (`phases.rs`).

use std::cell::RefCell;
use std::sync::atomic::Ordering;

use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};

use super::cache::{Cache, Tables};
use super::chunk::{io, read_lane, Action, Chunk, Source};
use super::phases::Phase;
use super::{apply, blocks, memo, splice, Compactor, Error, StepReport};
use crate::log::{record::decode_frame, Record};
use crate::store::dedup::{self, IdSet};
use crate::store::keys::{CHECKPOINT_KEY, NEXT_BLOCK_KEY};
use crate::store::{keys, outbox, person_cache, rollup};

/// What the compactor keeps between steps, read from the database at the first.
pub(super) struct State {
    pub(super) window: dedup::Window,
    pub(super) next_block: u64,
}

impl Compactor {
    /// The deduplication window and block counter as committed; read once, and again
    /// after the window failed.
    fn load_state(&mut self) -> Result<(), Error> {
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
        let (events, files) = (&self.trees.events, &self.trees.blocks);
        // The window's scratch files, in the database's directory beside the blocks'.
        let dir = files.dir().parent().unwrap_or(files.dir());
        let window = dedup::Window::load(
            &self.trees.recent_ids,
            &dir.join(dedup::DIR_NAME),
            s.dedup_max_age_ms,
            s.dedup_max_ids,
            crate::support::clock::now_ms(),
            |ranges| dedup::uuids_of_blocks(events, files, ranges),
        )?;
        tracing::debug!(uuids = window.len(), "deduplication window loaded");
        self.state = Some(State { window, next_block });
        Ok(())
    }

    /// One pass: a chunk of the log, then a smaller chunk of each slower lane.
    pub fn step(&mut self) -> Result<StepReport, Error> {
        self.load_state()?;
        let mut report = StepReport::default();
        self.phases.start();
        let chunk = match self.ahead.take() {
            Some(chunk) => chunk,
            None => self.intake.read(&self.trees.wal)?,
        };
        self.phases.end(Phase::Read);
        if !chunk.is_empty() {
            report.realtime = match self.commit(Source::Log, &chunk) {
                Ok(n) => n,
                Err(e) => {
                    // Read the chunk again at the next step, and what followed it.
                    self.ahead = None;
                    if let Some(first) = chunk.first_seq {
                        self.intake.log.seek(first).map_err(io)?;
                    }
                    return Err(e);
                }
            };
            if let Some(applied) = chunk.last_seq {
                self.release_log(applied)?;
            }
            self.phases.end(Phase::Release);
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
        self.publish_memory();
        self.phases.end(Phase::Lanes);
        Ok(report)
    }

    /// Recycle the log's segments the compactor has moved past, once its checkpoint
    /// past them (`applied`, just committed) is durable.
    fn release_log(&mut self, applied: u64) -> Result<(), sled::Error> {
        if !self.intake.log.releasable(applied) {
            return Ok(());
        }
        self.trees.meta.flush()?;
        self.intake.log.release(applied).map_err(io)?;
        Ok(())
    }

    /// Apply a chunk in one transaction; returns how many records it consumed.
    fn commit(&mut self, source: Source, chunk: &Chunk) -> Result<usize, Error> {
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
        #[cfg(test)]
        let conflict_after = std::cell::Cell::new(match source {
            Source::Log => self.conflict_at.take(),
            _ => None,
        });
        #[cfg(not(test))]
        let conflict_after = std::cell::Cell::new(None::<usize>);
        let Some(state) = self.state.as_mut() else {
            return Err(Error::StateNotLoaded);
        };
        let (window, first_block) = (&state.window, state.next_block);
        let (memo, builder) = (&self.memo, &self.builder);
        #[cfg(test)]
        let memo_off = self.memo_off;
        #[cfg(not(test))]
        let memo_off = false;
        // The window's age counts from when a uuid was stored.
        let now = crate::support::clock::now_ms();
        let t = &self.trees;
        let trees = (
            &t.wal,
            &t.historical,
            &t.overflow,
            &t.events,
            &t.recent_ids,
            &t.groups,
            &t.group_types,
            &t.meta,
            &t.quarantine,
            &t.outbox,
            &t.rollups.tree,
        );
        let to_outbox = self.settings.outbox;
        // The layered tables' writes, journaled once the records are applied, while
        // the blocks are made (see store::layered): the journal is held until the
        // transaction returns.
        let tables = Tables::new(t);
        let journal = tables.begin();
        let journal_error: RefCell<Option<std::io::Error>> = RefCell::new(None);
        // A block file's failure aborts the transaction; it is kept here to report.
        let blocks_error: RefCell<Option<std::io::Error>> = RefCell::new(None);
        // The rollups' hot counts, held through the commit (see rollup::hot).
        let mut hot = t.rollups.hot();
        let write_rollups = hot.due(rollup::hot::Moment::Busy, std::time::Instant::now());
        let counted: RefCell<Option<rollup::Pending>> = RefCell::new(None);
        let phases = RefCell::new(&mut self.phases);
        // A segment of the window that cannot be read aborts the transaction too.
        let dedup_error: RefCell<Option<std::io::Error>> = RefCell::new(None);
        // While the chunk's last blocks are made and synced, the log's next chunk is
        // read (once, whatever retries): decoded and routed meanwhile rather than
        // after the commit. Only from the log's files, and after a chunk read from
        // them: the log tree of earlier versions is part of this transaction.
        let read_ahead = source == Source::Log && chunk.consumed.is_empty();
        let intake = RefCell::new(&mut self.intake);
        let ahead: RefCell<Option<Chunk>> = RefCell::new(None);
        let blocks_failed = |e: std::io::Error| {
            *blocks_error.borrow_mut() = Some(e);
            ConflictableTransactionError::Abort(())
        };
        let outcome = trees.transaction(
            |(
                wal,
                historical,
                overflow,
                events,
                recent_ids,
                groups,
                group_types,
                meta,
                quarantine,
                outbox_tree,
                rollups,
            )| {
                journal.restart();
                let tx = tables.tx(groups, group_types);
                let from = match source {
                    Source::Log => wal,
                    Source::Historical => historical,
                    Source::Overflow => overflow,
                };
                let mut counts = Counts::default();
                let mut cache = match memo_off {
                    false => Cache::with_memo(memo, items.len()),
                    true => Cache::default(),
                };
                let mut seen = IdSet::default();
                let mut scratch = splice::Scratch::default();
                // The blocks are made on their own thread meanwhile, from the events
                // handed over part after part (see blocks.rs).
                let mut building = builder.start(blocks::Chunk {
                    first_block,
                    files: t.blocks.clone(),
                    index: t.event_index.clone(),
                });
                let mut part = blocks::Part::new();
                let mut in_part = 0;
                for key in &chunk.consumed {
                    from.remove(key)?;
                }
                for (i, item) in items.iter().enumerate() {
                    if fail_after == Some(i) {
                        return Err(ConflictableTransactionError::Abort(()));
                    }
                    if conflict_after.get() == Some(i) {
                        conflict_after.set(None);
                        return Err(ConflictableTransactionError::Conflict);
                    }
                    match &item.action {
                        Action::Apply(record) => {
                            let id = (record.project, record.uuid.as_u128());
                            let stored = window.contains(id).map_err(|e| {
                                *dedup_error.borrow_mut() = Some(e);
                                ConflictableTransactionError::Abort(())
                            })?;
                            if stored || !seen.insert(id) {
                                counts.duplicates += 1;
                                continue;
                            }
                            let s = settings.get(&record.project).copied().unwrap_or_default();
                            let g = record.ip.and_then(|ip| geo.get(&ip));
                            let entry = apply::record(&tx, &mut cache, record, s, g, &mut scratch)?;
                            part.entry(record.project).or_default().push(entry);
                            counts.applied += 1;
                            in_part += 1;
                            if in_part == PART_ENTRIES {
                                building.add(std::mem::take(&mut part));
                                in_part = 0;
                            }
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
                building.add(part);
                building.end();
                phases.borrow_mut().end(Phase::Apply);
                cache.write(&tx)?;
                (counts.persons, counts.learned) = cache.into_reports();
                // Synced before the commit that records it; put back if the chunk fails.
                match journal.stage() {
                    Ok(Some((key, value))) => meta.insert(key, &value[..]).map(drop)?,
                    Ok(None) => {}
                    Err(e) => {
                        *journal_error.borrow_mut() = Some(e);
                        return Err(ConflictableTransactionError::Abort(()));
                    }
                }
                phases.borrow_mut().end(Phase::Write);
                if read_ahead && ahead.borrow().is_none() {
                    // A read that fails is made again, and reported, by the next step.
                    let mut intake = intake.borrow_mut();
                    let next = intake.read_files().unwrap_or_default();
                    // Still waiting in the log (its depth, the backpressure) until applied.
                    if let Some(first) = next.first_seq {
                        intake.log.waiting_from(first);
                    }
                    *ahead.borrow_mut() = Some(next);
                    phases.borrow_mut().end(Phase::Read);
                }
                // Test hook: fail at the end, the next chunk read ahead.
                if fail_after == Some(items.len()) {
                    return Err(ConflictableTransactionError::Abort(()));
                }
                let stored = building.wait().map_err(blocks_failed)?;
                let mut phases = phases.borrow_mut();
                phases.end(Phase::WaitBlocks);
                phases.blocks(stored.times);
                // The console's rollups, with the events they count.
                hot.stage(&stored.counted, write_rollups, first_block, rollups, meta)?;
                *counted.borrow_mut() = Some(stored.counted);
                let mut written = Vec::with_capacity(stored.blocks.len());
                for (key, pointer) in &stored.blocks {
                    events.insert(&key[..], &pointer[..])?;
                    written.push(*key);
                }
                let next_block = stored.next_block;
                // The outbox: what this chunk changed, in this transaction.
                if to_outbox {
                    let done =
                        outbox::Committed::of(now, &written, counts.applied, &counts.persons);
                    outbox::record(outbox_tree, &done)?;
                }
                if next_block != first_block {
                    meta.insert(NEXT_BLOCK_KEY, &next_block.to_be_bytes()[..])?;
                }
                counts.ids = seen.into_iter().collect();
                if !counts.ids.is_empty() {
                    // Every uuid stored is in one of the chunk's blocks.
                    let key = keys::recent(now, first_block);
                    let value = match next_block > first_block {
                        true => dedup::encode_ranges(&[(first_block, next_block)]),
                        false => dedup::encode(&counts.ids),
                    };
                    recent_ids.insert(&key[..], value)?;
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
        journal.finish(outcome.is_ok());
        let phases = phases.into_inner();
        phases.end(Phase::Commit);
        let mut counts = match outcome {
            Ok(c) => c,
            Err(TransactionError::Abort(())) => {
                if let Some(e) = dedup_error.into_inner() {
                    // Read again from the database at the next step.
                    self.state = None;
                    return Err(dedup::Error::Segments(e).into());
                }
                return Err(
                    match (blocks_error.into_inner(), journal_error.into_inner()) {
                        (Some(e), _) => Error::Blocks(e),
                        (None, Some(e)) => Error::Journal(e),
                        (None, None) => Error::Injected,
                    },
                );
            }
            Err(TransactionError::Storage(e)) => return Err(e.into()),
        };
        // The next chunk follows a committed one: the next step applies it. A lane's
        // chunk reads nothing ahead and leaves what the log's chunk read.
        if let Some(next) = ahead.into_inner() {
            self.ahead = Some(next).filter(|c| !c.is_empty());
        }
        hot.committed(counted.take().unwrap_or_default(), write_rollups);
        drop(hot);
        state.next_block = counts.next_block;
        // Every block the index holds is committed now: it may be written out.
        self.trees.event_index.committed();
        self.memo.learn(std::mem::take(&mut counts.learned));
        if let Some(persons) = &self.person_cache {
            persons.forget(&counts.persons);
        }
        if !counts.ids.is_empty() {
            let key = sled::IVec::from(&keys::recent(now, first_block)[..]);
            let ranges = [(first_block, counts.next_block)];
            let ranges = (counts.next_block > first_block).then_some(&ranges[..]);
            match state.window.insert(key, now, &counts.ids, ranges, now) {
                Ok(rewrite) => rewrite.apply(&self.trees.recent_ids)?,
                // The chunk is committed, its entry with it: the window is read
                // again from the database at the next step, which fails while the
                // disk is full.
                Err(e) => {
                    tracing::warn!(error = %e, "the deduplication window failed; loading it again");
                    self.state = None;
                }
            }
        }
        let s = &self.stats;
        s.applied.fetch_add(counts.applied, Ordering::Relaxed);
        s.duplicates.fetch_add(counts.duplicates, Ordering::Relaxed);
        s.to_historical
            .fetch_add(counts.historical, Ordering::Relaxed);
        s.to_overflow.fetch_add(counts.overflow, Ordering::Relaxed);
        s.corrupt.fetch_add(counts.corrupt, Ordering::Relaxed);
        phases.end(Phase::After);
        if counts.corrupt > 0 {
            tracing::error!(
                records = counts.corrupt,
                "undecodable log records moved to the quarantine tree"
            );
        }
        Ok(items.len())
    }

    /// What the window and the memo take, for `/metrics`; the memo's walk over its
    /// ids only every [`MEMORY_EVERY`] steps.
    fn publish_memory(&self) {
        let steps = self.stats.steps.load(Ordering::Relaxed);
        if let Some(state) = &self.state {
            let window = state.window.footprint() as u64;
            self.stats.window_bytes.store(window, Ordering::Relaxed);
        }
        let limiter = self.intake.limiter.footprint() as u64;
        self.stats.limiter_bytes.store(limiter, Ordering::Relaxed);
        if steps % MEMORY_EVERY == 1 {
            let memo = self.memo.footprint() as u64;
            self.stats.memo_bytes.store(memo, Ordering::Relaxed);
        }
    }

    /// Age of the oldest record still waiting in the log. For the log's files, the
    /// age of the last record read stands in: the next one arrived no earlier.
    fn lag(&self) -> Result<i64, sled::Error> {
        let now = crate::support::clock::now_ms();
        if let Some((_, entry)) = self.trees.wal.first()? {
            let oldest = decode_frame(&entry)
                .ok()
                .and_then(|records| Record::decode(records.first()?).ok());
            return Ok(oldest.map_or(0, |r| (now - r.received_at).max(0)));
        }
        if self.intake.log.shared().depth() == 0 {
            return Ok(0);
        }
        Ok(self.intake.last_received.map_or(0, |t| (now - t).max(0)))
    }
}

/// Events handed to the block thread at a time: the last part's blocks are made while
/// the compactor waits, the others while it applies.
const PART_ENTRIES: usize = if cfg!(test) { 2 } else { 128 };

/// Steps between two counts of the memo's bytes: a walk over its ids.
const MEMORY_EVERY: u64 = 64;

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
