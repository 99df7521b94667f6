//! The index worker's passes, one at a time ([`Index::step`]): the build (indexing
//! the stored blocks the runs do not cover, a batch a pass, each batch a run), the
//! fold (the frozen recent part written as a run, during the build too) and the merge (the smallest runs
//! as one, dropping the blocks retention deleted). Each writes its run under a
//! temporary name, syncs it, renames it and then stores the manifest naming it; a
//! replaced run is deleted only after that.

use std::collections::{HashSet, VecDeque};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::manifest::{run_path, Manifest};
use super::recent::{NewBlock, Recent};
use super::run::{self, BlockRef, Run};
use super::{io_err, Index, MAX_RUNS, MERGE_WIDTH};
use crate::store::{keys, Trees};

/// Blocks the build indexes a pass (about 200,000 events): one run each.
const BUILD_BLOCKS: usize = if cfg!(test) { 16 } else { 4096 };

/// A run is written again without the blocks retention deleted once they are at
/// least one in this many of its blocks.
const PURGE_SHARE: usize = 4;

/// What a pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do until more blocks are stored.
    Idle,
    /// The build indexed `done` of `total` blocks; done once they are equal.
    Built { done: u64, total: u64 },
    /// A fold or a merge was written.
    Wrote,
}

/// The build's blocks to index, ascending by id.
pub(super) struct Build {
    todo: VecDeque<BlockRef>,
    total: u64,
}

impl Index {
    /// One pass of the worker.
    pub fn step(&self, trees: &Trees) -> io::Result<Step> {
        if !self.shared.writable {
            return Ok(Step::Idle);
        }
        let (complete, frozen, runs) = {
            let s = self.state();
            (s.complete, s.frozen.clone(), s.runs.len())
        };
        // First what the compactor froze, so the recent part stays bounded.
        if let Some(frozen) = frozen {
            self.fold(&frozen)?;
            return Ok(Step::Wrote);
        }
        if !complete {
            return self.build_step(trees);
        }
        if runs > MAX_RUNS {
            let mut picked: Vec<(u64, Arc<Run>)> = self.state().runs.clone();
            picked.sort_by_key(|(n, r)| (r.bytes, *n));
            picked.truncate(MERGE_WIDTH);
            self.merge(trees, &picked)?;
            return Ok(Step::Wrote);
        }
        if self.shared.purge.swap(false, Ordering::SeqCst) {
            return self.purge(trees);
        }
        Ok(Step::Idle)
    }

    /// Write what the recent part holds as a run now (at a clean stop, so the next
    /// start has nothing to build).
    pub fn fold_all(&self) -> io::Result<()> {
        let frozen = {
            let mut s = self.state_mut();
            if !self.shared.writable || !s.complete {
                return Ok(());
            }
            match s.frozen.clone() {
                Some(f) => Some(f),
                None if s.active.blocks() > 0 => {
                    let all = Arc::new(std::mem::take(&mut s.active));
                    s.frozen = Some(all.clone());
                    Some(all)
                }
                None => None,
            }
        };
        if let Some(f) = frozen {
            self.fold(&f)?;
        }
        if self.state().frozen.is_some() {
            // The compactor froze more since: only at a stop, when it has stopped.
            return self.fold_all();
        }
        Ok(())
    }

    /// Write `part` as a run and the manifest naming it; the blocks it holds are then
    /// covered, or once the build is done if it is not yet (the blocks below them are
    /// not all in runs before).
    fn fold(&self, part: &Arc<Recent>) -> io::Result<()> {
        let Some(last) = part.last_id() else {
            self.state_mut().frozen = None;
            return Ok(());
        };
        let (number, path) = self.new_run_path();
        part.write(&path.with_extension("run.new"))?;
        std::fs::rename(path.with_extension("run.new"), &path)?;
        let run = Arc::new(Run::open(&path)?);
        let covered = match self.state().complete {
            true => last + 1,
            false => 0,
        };
        self.install(Vec::new(), Some((number, run)), covered, |s| {
            s.frozen = None;
            s.folded_to = s.folded_to.max(last + 1);
        })
    }

    fn new_run_path(&self) -> (u64, std::path::PathBuf) {
        let mut s = self.state_mut();
        let n = s.manifest.next;
        s.manifest.next += 1;
        (n, run_path(&self.shared.dir, n))
    }

    /// Store a manifest without `gone`, with `new` and covering below `covered`, then
    /// swap it in (with `also`) and delete the runs it no longer names.
    fn install(
        &self,
        gone: Vec<u64>,
        new: Option<(u64, Arc<Run>)>,
        covered: u64,
        also: impl FnOnce(&mut super::State),
    ) -> io::Result<()> {
        // Only the worker changes the manifest: stored outside the lock, so reads
        // never wait for its sync.
        let mut m: Manifest = self.state().manifest.clone();
        m.runs.retain(|n| !gone.contains(n));
        m.runs.extend(new.as_ref().map(|(n, _)| *n));
        m.covered = m.covered.max(covered);
        m.store(&self.shared.dir)?;
        let mut s = self.state_mut();
        s.manifest = m;
        s.runs.retain(|(n, _)| !gone.contains(n));
        s.runs.extend(new);
        also(&mut s);
        drop(s);
        for n in gone {
            run::remove(&run_path(&self.shared.dir, n))?;
        }
        Ok(())
    }

    /// One batch of the build: on the first pass, find the blocks to index.
    fn build_step(&self, trees: &Trees) -> io::Result<Step> {
        let mut build = self.shared.build.lock().unwrap_or_else(|p| p.into_inner());
        if build.is_none() {
            let (covered, start_next) = {
                let s = self.state();
                (s.manifest.covered, s.start_next)
            };
            *build = Some(find_uncovered(trees, covered, start_next)?);
        }
        let Some(b) = build.as_mut() else {
            return Ok(Step::Idle);
        };
        let n = b.todo.len().min(BUILD_BLOCKS);
        let batch: Vec<BlockRef> = b.todo.drain(..n).collect();
        let mut part = Recent::default();
        for block in &batch {
            if let Some(new) = keys_of(trees, block)? {
                part.add(&new);
            }
        }
        let done = b.todo.is_empty();
        let covered = match (done, batch.last()) {
            // With what was folded meanwhile, every block stored is in the runs.
            (true, _) => {
                let s = self.state();
                s.start_next.max(s.folded_to)
            }
            (false, Some(last)) => last.id + 1,
            (false, None) => 0,
        };
        let new = match part.last_id() {
            Some(_) => {
                let (number, path) = self.new_run_path();
                part.write(&path.with_extension("run.new"))?;
                std::fs::rename(path.with_extension("run.new"), &path)?;
                Some((number, Arc::new(Run::open(&path)?)))
            }
            None => None,
        };
        self.install(Vec::new(), new, covered, |s| s.complete = done)?;
        let (total, left) = (b.total, b.todo.len() as u64);
        if done {
            *build = None;
        }
        Ok(Step::Built {
            done: total - left,
            total,
        })
    }

    /// After retention deleted blocks: each run naming enough of them is written again without
    /// them (or dropped, when it names no stored block), so runs of old blocks do not
    /// stay for good.
    fn purge(&self, trees: &Trees) -> io::Result<Step> {
        let runs: Vec<(u64, Arc<Run>)> = self.state().runs.clone();
        let mut wrote = Step::Idle;
        for (n, run) in runs {
            let mut dead = 0;
            for b in &run.blocks {
                let key = keys::block(b.project, b.newest, b.id);
                dead += usize::from(!trees.events.contains_key(key).map_err(io_err)?);
            }
            // A few dead blocks cost a read nothing (passed over); a run is rewritten
            // once they are a good part of it.
            let gone = dead > 0 && dead * PURGE_SHARE >= run.blocks.len();
            if gone {
                self.merge(trees, &[(n, run)])?;
                wrote = Step::Wrote;
            }
        }
        Ok(wrote)
    }

    /// Merge `picked` into one run, leaving out the blocks no longer stored
    /// (retention deleted them).
    fn merge(&self, trees: &Trees, picked: &[(u64, Arc<Run>)]) -> io::Result<()> {
        let replaced = picked.iter().map(|(n, _)| *n).collect();
        let mut blocks: Vec<BlockRef> = picked
            .iter()
            .flat_map(|(_, r)| r.blocks.iter().copied())
            .collect();
        blocks.sort_unstable();
        blocks.dedup_by_key(|b| b.id);
        let mut gone = HashSet::new();
        blocks.retain(|b| {
            let key = keys::block(b.project, b.newest, b.id);
            let kept = trees.events.contains_key(key).unwrap_or(true);
            if !kept {
                gone.insert(b.id);
            }
            kept
        });
        if blocks.is_empty() {
            return self.install(replaced, None, 0, |_| {});
        }
        let (number, path) = self.new_run_path();
        let making = path.with_extension("run.new");
        let mut w = run::Writer::create(&making)?;
        let mut inputs: Vec<_> = picked.iter().map(|(_, r)| r.entries().peekable()).collect();
        loop {
            let mut least: Option<Vec<u8>> = None;
            for it in inputs.iter_mut() {
                if let Some(Err(_)) = it.peek() {
                    if let Some(Err(e)) = it.next() {
                        return Err(e);
                    }
                }
                if let Some(Ok((k, _))) = it.peek() {
                    if least.as_ref().is_none_or(|l| k < l) {
                        least = Some(k.clone());
                    }
                }
            }
            let Some(key) = least else { break };
            let mut ids = Vec::new();
            for it in inputs.iter_mut() {
                if matches!(it.peek(), Some(Ok((k, _))) if *k == key) {
                    if let Some(Ok((_, more))) = it.next() {
                        ids.extend(more);
                    }
                }
            }
            ids.sort_unstable();
            ids.dedup();
            ids.retain(|id| !gone.contains(id));
            w.entry(&key, &ids)?;
        }
        w.finish(&blocks)?;
        // The merged table (32 bytes a block: 11 MiB at 20 million events) goes before
        // the new run decodes its own copy of it.
        drop((blocks, gone, inputs));
        std::fs::rename(&making, &path)?;
        let run = Arc::new(Run::open(&path)?);
        self.install(replaced, Some((number, run)), 0, |_| {})
    }
}

/// The stored blocks with ids in `covered..start_next`, ascending by id.
fn find_uncovered(trees: &Trees, covered: u64, start_next: u64) -> io::Result<Build> {
    let mut todo = Vec::new();
    for entry in trees.events.iter().keys() {
        let key = entry.map_err(io_err)?;
        let (Some((project, newest)), Some(id)) = (keys::split_block(&key), keys::block_id(&key))
        else {
            continue;
        };
        if (covered..start_next).contains(&id) {
            // The oldest time is read with the block.
            let oldest = newest;
            todo.push(BlockRef {
                id,
                project,
                newest,
                oldest,
            });
        }
    }
    todo.sort_unstable();
    let total = todo.len() as u64;
    Ok(Build {
        todo: todo.into(),
        total,
    })
}

/// A stored block as the index keeps it: its oldest time, its events' distinct ids,
/// names and property keys; None if it is gone (retention) or does not decode (skipped by reads
/// too). Read past the block cache, which a build would only churn.
fn keys_of(trees: &Trees, b: &BlockRef) -> io::Result<Option<NewBlock>> {
    let key = keys::block(b.project, b.newest, b.id);
    let Some(value) = trees.events.get(key).map_err(io_err)? else {
        return Ok(None);
    };
    let Some(rows) = trees.blocks.rows_uncached(&key, &value) else {
        return Ok(None);
    };
    let heads = rows.heads();
    let once = |mut texts: Vec<String>| {
        texts.sort_unstable();
        texts.dedup();
        texts
    };
    let distinct_ids = once(heads.iter().map(|h| rows.distinct_id(h).into()).collect());
    let events = once(heads.iter().map(|h| rows.event(h).into()).collect());
    let oldest = heads.first().map_or(b.newest, |h| h.timestamp);
    Ok(Some(NewBlock {
        block: BlockRef { oldest, ..*b },
        distinct_ids,
        events,
        properties: rows.property_keys(),
    }))
}
