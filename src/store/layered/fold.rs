//! [`Layered::fold`]: the delta merged into a new run.

use std::fs;
use std::io;
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use sled::IVec;

use super::run::{self, Run};
use super::{run_path, Folded, Layered, DELTA_SYNC, DIR_SYNC, NEW_DIR_SYNC, PAGE, RUN_SYNC};
use crate::store::Error;
use crate::support::sync_dir;

/// A fold takes at most this many bytes of the delta (keys and values, held until it
/// removes them): a delta larger than that (a database of an earlier format, a
/// restore) is folded in several steps.
pub(super) const TAKE_BYTES: u64 = 64 * 1024 * 1024;

impl Layered {
    /// Merge the delta into a new run (see the module docs). Only one fold at a time:
    /// the compactor's thread folds, between its chunks, and nothing else writes the
    /// delta meanwhile. A failure (a full disk) leaves the table as it was.
    pub fn fold(&self) -> Result<Folded, Error> {
        let started = Instant::now();
        let inner = &self.inner;
        // What the run takes must be durable first: a chunk committed but not yet
        // written out by sled is lost in a crash and applied again from the log, which
        // must not find its own changes in the run already.
        let syncs = &inner.syncs;
        syncs.run(DELTA_SYNC, || inner.delta.flush())?;
        if !inner.dir.exists() {
            fs::create_dir_all(&inner.dir).map_err(Error::Tables)?;
            if let Some(parent) = inner.dir.parent() {
                if let Err(e) = syncs.run(NEW_DIR_SYNC, || sync_dir(parent)) {
                    // Made but not durably: removed, so the next fold makes and syncs
                    // it again rather than find it and name a run in it unsynced.
                    let _ = fs::remove_dir(&inner.dir);
                    return Err(Error::Tables(e));
                }
            }
        }
        let generation = inner.generation.load(Ordering::SeqCst) + 1;
        let making = run_path(&inner.dir, &inner.name, generation, true);
        let old = inner.run.load_full();
        // A block that failed to read before and reads now was not damaged.
        if let Some(old) = old.as_deref().filter(|o| o.damage_seen()) {
            if old.verify().is_ok() {
                old.forget_damage();
            }
        }
        let pending_before = inner.pending.load(Ordering::Relaxed);
        let mut taken = Vec::new();
        let written = self.write_run(old.as_deref(), &making, &mut taken);
        let complete = match written {
            Ok(complete) => complete,
            Err(e) => {
                let _ = fs::remove_file(&making);
                return Err(e);
            }
        };
        if let Some(old) = old.as_deref().filter(|o| o.damage_seen()) {
            if old.verify().is_ok() {
                // Only a passing failure: fold again later rather than leave keys out.
                old.forget_damage();
                let _ = fs::remove_file(&making);
                return Err(Error::Tables(io::Error::other(format!(
                    "a block of {} failed to read and then read; the fold is tried again",
                    old.path().display()
                ))));
            }
        }
        let path = run_path(&inner.dir, &inner.name, generation, false);
        let placed = fs::rename(&making, &path)
            .and_then(|()| syncs.run(DIR_SYNC, || sync_dir(&inner.dir)))
            .and_then(|()| Run::open(&path));
        let run = match placed {
            Ok(run) => Arc::new(run),
            Err(e) => {
                let _ = fs::remove_file(&making);
                let _ = fs::remove_file(&path);
                return Err(Error::Tables(e));
            }
        };
        let (entries, file_bytes) = (run.entries(), run.file_bytes());
        inner.run.store(Some(run));
        inner.generation.store(generation, Ordering::SeqCst);
        // Readers still holding the old run read it through its open file.
        if let Some(old) = old.as_ref().filter(|old| old.damage_seen()) {
            let aside = old.path().with_extension("run.damaged");
            tracing::error!(path = %old.path().display(), aside = %aside.display(), "the replaced run had damaged blocks, whose keys are not in the new one; it is kept aside");
            if let Err(e) = fs::rename(old.path(), &aside) {
                tracing::warn!(error = %e, "the damaged run could not be kept aside");
            }
        } else if let Some(old) = &old {
            if let Err(e) = fs::remove_file(old.path()) {
                tracing::warn!(path = %old.path().display(), error = %e, "a replaced run could not be removed; it is removed at the next start");
            }
        }
        let (mut kept, mut removed) = (0u64, 0u64);
        for (k, v) in &taken {
            let bytes = (k.len() + v.len()) as u64;
            // Unchanged since it was taken: the run now holds it.
            let swapped = inner
                .delta
                .compare_and_swap(k, Some(v), None as Option<&[u8]>)?;
            match swapped {
                Ok(()) => removed += bytes,
                Err(_) => kept += bytes,
            }
        }
        // Nothing else writes the delta during a fold (see `fold`'s docs). A fold that
        // took only part of the delta leaves the rest pending: the next one takes more.
        let pending = match complete {
            true => kept,
            false => pending_before.saturating_sub(removed).max(kept),
        };
        inner.pending.store(pending, Ordering::Relaxed);
        Ok(Folded {
            entries,
            taken: taken.len() as u64,
            file_bytes,
            took: started.elapsed(),
        })
    }

    /// The run `old` and the delta, merged into a new run at `path`; the delta's
    /// entries read go to `taken`, up to [`TAKE_BYTES`] of them (the rest, in key
    /// order, stay in the delta and still shadow the run). Whether it took them all.
    fn write_run(
        &self,
        old: Option<&Run>,
        path: &Path,
        taken: &mut Vec<(IVec, IVec)>,
    ) -> Result<bool, Error> {
        let tables = Error::Tables;
        let limit = self.inner.take_bytes.load(Ordering::Relaxed);
        let mut out = super::Writer::create(path).map_err(tables)?;
        let mut base = RunPages::new(old);
        let mut delta = self.inner.delta.iter();
        let mut next_delta = delta.next().transpose()?;
        let (mut taken_bytes, mut complete) = (0u64, true);
        loop {
            if next_delta.is_some() && taken_bytes >= limit {
                // The rest stays in the delta.
                (complete, next_delta) = (false, None);
            }
            let order = match (base.front(), &next_delta) {
                (None, None) => break,
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (Some(b), Some((d, _))) => b.cmp(&d[..]),
            };
            if order.is_lt() {
                let (k, v) = base.take();
                out.push(&k, &v).map_err(tables)?;
                continue;
            }
            if order.is_eq() {
                // The delta's entry replaces the run's.
                base.take();
            }
            if let Some((k, v)) = next_delta.take() {
                if !v.is_empty() {
                    out.push(&k, &v).map_err(tables)?;
                }
                taken_bytes += (k.len() + v.len()) as u64;
                taken.push((k, v));
            }
            next_delta = delta.next().transpose()?;
        }
        let file = out.finish().map_err(tables)?;
        let syncs = &self.inner.syncs;
        syncs.run(RUN_SYNC, || file.sync_all()).map_err(tables)?;
        Ok(complete)
    }
}

/// A run read in pages, front to back.
struct RunPages<'a> {
    run: Option<&'a Run>,
    page: std::collections::VecDeque<run::Entry>,
    after: Option<Vec<u8>>,
    done: bool,
}

impl<'a> RunPages<'a> {
    fn new(run: Option<&'a Run>) -> RunPages<'a> {
        RunPages {
            run,
            page: Default::default(),
            after: None,
            done: run.is_none(),
        }
    }

    /// The next key, reading a page when needed.
    fn front(&mut self) -> Option<&[u8]> {
        if self.page.is_empty() && !self.done {
            if let Some(run) = self.run {
                let from = match &self.after {
                    Some(k) => Bound::Excluded(k.as_slice()),
                    None => Bound::Unbounded,
                };
                let page = run.scan(from, Bound::Unbounded, PAGE * 8);
                self.done = page.len() < PAGE * 8;
                self.after = page.last().map(|(k, _)| k.clone());
                self.page.extend(page);
            }
        }
        self.page.front().map(|(k, _)| k.as_slice())
    }

    fn take(&mut self) -> run::Entry {
        self.page.pop_front().unwrap_or_default()
    }
}
