//! [`Layered::fold`]: the delta merged into new runs for the parts [`plan`] chose.

use std::fs;
use std::io;
use std::ops::Bound;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::delta::{Key, Map};
use super::files::part_file;
use super::journal::Split;
use super::run::{Noter, Run};
use super::runs::{self, Part, Runs};
use super::{
    plan, Folded, Layered, Take, DELTA_SYNC, DIR_SYNC, MANIFEST_SYNC, NEW_DIR_SYNC, RUN_SYNC,
};
use crate::store::Error;
use crate::support::sync::lock;
use crate::support::sync_dir;

#[path = "fold_pages.rs"]
mod pages;
use pages::RunPages;

/// A fold takes at most about this many bytes of the delta (keys and values, held
/// until it removes them): a delta larger than that (a database of an earlier format,
/// a restore) is folded in several steps.
pub(super) const TAKE_BYTES: u64 = 64 * 1024 * 1024;

/// Keys from one (included) to another (excluded) or the end ([`Written::taken`]).
type TakenRange = (Box<[u8]>, Option<Key>);

/// The new runs of one fold, as written.
#[derive(Default)]
struct Written {
    /// Per group of neighbouring parts chosen, the runs replacing it: (lower bound,
    /// file name).
    replacing: Vec<Vec<(Box<[u8]>, String)>>,
    /// Every file made, removed if the fold fails.
    files: Vec<String>,
    /// What the runs took of the frozen map: each entry in these key ranges, in
    /// order and apart, from a key (included) to one (excluded) or the end. Not the
    /// entries themselves: a list of them was the fold's largest allocation (22 MiB
    /// for the persons' 300,000 keys).
    taken: Vec<TakenRange>,
    /// How many entries those ranges hold.
    taken_entries: u64,
    bytes: u64,
}

impl Layered {
    /// Merge the delta into new runs (see the module docs). One fold at a time among
    /// the tables of a journal; writes go on meanwhile: the journal is held only to
    /// freeze the delta and to switch to what the fold made. A failure (a full disk)
    /// or a panic leaves the table reading as it did, its changes still due.
    pub fn fold(&self) -> Result<Folded, Error> {
        self.fold_taking(Take::Due)
    }

    /// [`Layered::fold`] of the parts `take` says ([`plan`]).
    pub fn fold_taking(&self, take: Take) -> Result<Folded, Error> {
        let started = Instant::now();
        let inner = &self.inner;
        let _one = lock(&inner.shared.folding);
        // A journal that failed a write takes nothing until the database is reopened.
        self.journal().kept_error().map_err(Error::Tables)?;
        // Dropped after the frozen map, whichever way the fold ends.
        let mut thaw = Thaw(Some(self));
        let (split, frozen, mut held) = {
            let mut guard = self.journal().lock();
            let held = Instant::now();
            self.make_dir()?;
            let split = guard.split().map_err(Error::Tables)?;
            (split, self.delta_mut().freeze(), held.elapsed())
        };
        #[cfg(test)]
        if let Some(hook) = &*lock(&inner.during_fold) {
            hook(self);
        }
        // What a run takes must be durable first: a chunk committed but not yet
        // written out by sled is lost in a crash and applied again from the log, which
        // must not find its own changes in the run already. Every chunk in the frozen
        // map committed before the freeze, so this flush covers them.
        let meta = self.journal().meta();
        let outcome = inner
            .syncs
            .run(DELTA_SYNC, || meta.flush())
            .map_err(Error::from)
            .and_then(|_| self.fold_frozen(&frozen, &split, take, started, &mut held));
        drop(frozen);
        if outcome.is_ok() {
            thaw.0 = None;
        }
        outcome
    }

    /// Have the next folds note each block they write with `noter` (none: no notes),
    /// for the table's visitors ([`super::Visitor::pass_over_noted`]).
    pub fn note_blocks(&self, noter: Option<Noter>) {
        *lock(&self.inner.noter) = noter;
    }

    /// The runs' directory, made (and synced into the database's) by the first fold.
    fn make_dir(&self) -> Result<(), Error> {
        let inner = &self.inner;
        if inner.dir.exists() {
            return Ok(());
        }
        fs::create_dir_all(&inner.dir).map_err(Error::Tables)?;
        if let Some(parent) = inner.dir.parent() {
            if let Err(e) = inner.syncs.run(NEW_DIR_SYNC, || sync_dir(parent)) {
                // Made but not durably: removed, so the next fold makes and syncs it
                // again rather than find it and name a run in it unsynced.
                let _ = fs::remove_dir(&inner.dir);
                return Err(Error::Tables(e));
            }
        }
        Ok(())
    }

    fn fold_frozen(
        &self,
        frozen: &Map,
        split: &Split,
        take: Take,
        started: Instant,
        held: &mut Duration,
    ) -> Result<Folded, Error> {
        let inner = &self.inner;
        let old = inner.runs.load_full();
        let mut delta_bytes = vec![0u64; old.parts().len().max(1)];
        for (k, v) in frozen.iter() {
            delta_bytes[old.part_of(k)] += (k.len() + v.len()) as u64;
        }
        let limit = inner.take_bytes.load(Ordering::Relaxed);
        let part_bytes = inner.part_bytes.load(Ordering::Relaxed);
        let choice = plan::choose(&old, &delta_bytes, take, limit, part_bytes);
        let replaced: Vec<&Part> = choice
            .parts
            .iter()
            .filter_map(|&i| old.parts().get(i))
            .collect();
        // A block that failed to read before and reads now was not damaged.
        for p in replaced.iter().filter(|p| p.run.damage_seen()) {
            if p.run.verify().is_ok() {
                p.run.forget_damage();
            }
        }
        let mut written = Written::default();
        let outcome = self
            .write_parts(&old, frozen, &choice.parts, limit, &mut written)
            .and_then(|()| self.passing_damage(&replaced))
            .and_then(|()| {
                let new = self.switched(&old, &choice.parts, &written)?;
                self.commit(&old, new)
            });
        let new = match outcome {
            Ok(new) => new,
            Err(e) => {
                for file in &written.files {
                    let _ = fs::remove_file(inner.dir.join(file));
                }
                return Err(e);
            }
        };
        let (entries, file_bytes) = (new.entries(), new.file_bytes());
        // Before the frozen map is dropped: a read that misses the delta finds the key
        // in the new runs.
        inner.runs.store(new);
        // Readers still holding the old runs read them through their open files.
        for p in replaced {
            let path = p.run.path();
            if p.run.damage_seen() {
                let aside = PathBuf::from(format!("{}.damaged", path.display()));
                tracing::error!(path = %path.display(), aside = %aside.display(), "the replaced run had damaged blocks, whose keys are not in the new one; it is kept aside");
                if let Err(e) = fs::rename(path, &aside) {
                    tracing::warn!(path = %path.display(), error = %e, "the damaged run could not be kept aside");
                }
            } else if let Err(e) = fs::remove_file(path) {
                tracing::warn!(path = %path.display(), error = %e, "a replaced run could not be removed; it is removed at the next start");
            }
        }
        // What the runs did not take stays in memory, and goes to the journal that
        // carries what the older ones held; both are made outside every lock.
        let left = untaken(frozen, &written.taken);
        let journal = self.journal();
        journal
            .carry(split, self.name(), &left)
            .map_err(Error::Tables)?;
        {
            let mut guard = journal.lock();
            let switching = Instant::now();
            guard.carried(split).map_err(Error::Tables)?;
            self.delta_mut().unfreeze(left);
            *held += switching.elapsed();
        }
        journal.forget(split).map_err(Error::Tables)?;
        Ok(Folded {
            entries,
            taken: written.taken_entries,
            file_bytes,
            rewritten: choice.parts.len(),
            parts_before: old.parts().len(),
            written_bytes: written.bytes,
            took: started.elapsed(),
            held: *held,
        })
    }

    /// A fold that met damage which then read after all: fold again later rather
    /// than leave keys out.
    fn passing_damage(&self, replaced: &[&Part]) -> Result<(), Error> {
        for p in replaced.iter().filter(|p| p.run.damage_seen()) {
            if p.run.verify().is_ok() {
                p.run.forget_damage();
                return Err(Error::Tables(io::Error::other(format!(
                    "a block of {} failed to read and then read; the fold is tried again",
                    p.run.path().display()
                ))));
            }
        }
        Ok(())
    }

    /// The parts of `old` with those chosen replaced by the new runs; the first part
    /// starts at the empty key whatever was dropped.
    fn switched(&self, old: &Runs, chosen: &[usize], written: &Written) -> Result<Runs, Error> {
        let mut parts = Vec::new();
        let mut replacing = written.replacing.iter();
        for i in 0..old.parts().len().max(1) {
            if !chosen.contains(&i) {
                parts.extend(old.parts().get(i).cloned());
                continue;
            }
            if i > 0 && chosen.contains(&(i - 1)) {
                // Written with the group it follows.
                continue;
            }
            for (lower, file) in replacing.next().into_iter().flatten() {
                let path = self.inner.dir.join(file);
                let run = Arc::new(Run::open(&path).map_err(Error::Tables)?);
                let (lower, file) = (lower.clone(), file.clone());
                parts.push(Part { lower, file, run });
            }
        }
        if let Some(first) = parts.first_mut() {
            first.lower = Box::from(&b""[..]);
        }
        Ok(Runs::new(parts))
    }

    /// Name `new` by the manifest: written, synced, renamed into place, the directory
    /// synced. A failure puts the manifest `old` was named by back.
    fn commit(&self, old: &Runs, new: Runs) -> Result<Arc<Runs>, Error> {
        let (dir, name, syncs) = (&self.inner.dir, &self.inner.name, &self.inner.syncs);
        let text = |r: &Runs| runs::encode(r.parts().iter().map(|p| (&*p.lower, &*p.file)));
        let making = runs::manifest_path(dir, name, true);
        let path = runs::manifest_path(dir, name, false);
        let had_manifest = path.exists();
        let written = runs::write_making(dir, name, &text(&new), |f| {
            syncs.run(MANIFEST_SYNC, || f.sync_all())
        });
        if let Err(e) = written {
            let _ = fs::remove_file(&making);
            return Err(Error::Tables(e));
        }
        fs::rename(&making, &path).map_err(Error::Tables)?;
        if let Err(e) = syncs.run(DIR_SYNC, || sync_dir(dir)) {
            // Not known durable: the old manifest back, as the next start would read it.
            let back = match had_manifest {
                true => runs::write_making(dir, name, &text(old), |_| Ok(()))
                    .and_then(|()| fs::rename(&making, &path)),
                false => fs::remove_file(&path),
            };
            if let Err(b) = back {
                tracing::error!(error = %b, "the manifest of the runs could not be put back after a failed sync");
            }
            return Err(Error::Tables(e));
        }
        Ok(Arc::new(new))
    }

    /// Write the chosen parts of `old` merged with the delta in their ranges, each
    /// group of neighbours as one range (so small parts merge), taking delta entries
    /// up to `limit` bytes (the rest, in key order, stay in the delta and still shadow
    /// the runs).
    fn write_parts(
        &self,
        old: &Runs,
        frozen: &Map,
        chosen: &[usize],
        limit: u64,
        out: &mut Written,
    ) -> Result<(), Error> {
        let tables = Error::Tables;
        let mut taken_bytes = 0u64;
        let groups = chosen.chunk_by(|a, b| a + 1 == *b);
        for group in groups {
            let (first, last) = (group[0], group[group.len() - 1]);
            let lower: Box<[u8]> = old
                .parts()
                .get(first)
                .map_or(Box::from(&b""[..]), |p| p.lower.clone());
            let upper = old.parts().get(last + 1).map(|p| p.lower.to_vec());
            // Where this group's entries stop being taken: its end unless the limit
            // is met first.
            let mut stop = upper.as_deref().map(Key::from);
            let to = upper.map_or(Bound::Unbounded, Bound::Excluded);
            let mut delta = frozen
                .range::<[u8], _>((Bound::Included(&lower[..]), to.as_ref().map(|t| &t[..])))
                .map(|(k, v)| (k.clone(), v.clone()));
            let runs: Vec<&Run> = group
                .iter()
                .filter_map(|&i| old.parts().get(i))
                .map(|p| &*p.run)
                .collect();
            let about = estimate(old, frozen, group);
            let mut base = RunPages::new(runs);
            let mut next_delta = delta.next();
            let mut writer = PartWriter::new(self, lower.clone(), about);
            loop {
                if taken_bytes >= limit {
                    if let Some((k, _)) = next_delta.take() {
                        stop = Some(k);
                    }
                }
                let order = match (base.front(), &next_delta) {
                    (None, None) => break,
                    (Some(_), None) => std::cmp::Ordering::Less,
                    (None, Some(_)) => std::cmp::Ordering::Greater,
                    (Some(b), Some((d, _))) => b.cmp(&d[..]),
                };
                if order.is_lt() {
                    let (k, v) = base.take();
                    writer.push(&k, &v, out).map_err(tables)?;
                    continue;
                }
                if order.is_eq() {
                    // The delta's entry replaces the run's.
                    base.take();
                }
                if let Some((k, v)) = next_delta.take() {
                    if !v.is_empty() {
                        writer.push(&k, &v, out).map_err(tables)?;
                    }
                    taken_bytes += (k.len() + v.len()) as u64;
                    out.taken_entries += 1;
                }
                next_delta = delta.next();
            }
            out.taken.push((lower, stop));
            let files = writer.finish(out).map_err(tables)?;
            out.replacing.push(files);
        }
        Ok(())
    }
}

/// Puts a fold's frozen map back under the active map when dropped with its table: a
/// fold that failed or panicked leaves the table's changes in the delta, counted as
/// pending, so the fold is due again (a frozen map stays out of [`Layered::pending`]).
struct Thaw<'a>(Option<&'a Layered>);

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        if let Some(table) = self.0 {
            let _guard = table.journal().lock();
            table.delta_mut().thaw();
        }
    }
}

/// The entries of `frozen` outside the ranges `taken` (in key order, apart:
/// [`Written::taken`]).
fn untaken(frozen: &Map, taken: &[TakenRange]) -> Map {
    type Range<'a> = (Bound<&'a [u8]>, Bound<&'a [u8]>);
    let mut kept: Vec<Range<'_>> = Vec::new();
    let mut from = Some(Bound::Unbounded);
    for (lower, stop) in taken {
        match from {
            Some(Bound::Included(f)) if f >= &lower[..] => {}
            Some(f) => kept.push((f, Bound::Excluded(&lower[..]))),
            None => break,
        }
        from = stop.as_ref().map(|s| Bound::Included(&s[..]));
    }
    kept.extend(from.map(|f| (f, Bound::Unbounded)));
    let each = kept.into_iter().flat_map(|r| frozen.range::<[u8], _>(r));
    // In key order, which a `BTreeMap` builds in one pass.
    each.map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// About the bytes of keys and values the runs replacing `group` will hold: the
/// parts' plus the delta's keys the runs do not hold (by their Bloom filters, so no
/// block is read). A key the delta changes counts once, its old entry's size; a
/// removal takes away an entry of the run's mean size. So the cut into pieces of
/// [`super::PART_BYTES`] comes out at the size asked, where counting a changed key in
/// both the run and the delta made pieces of about half.
fn estimate(old: &Runs, frozen: &Map, group: &[usize]) -> u64 {
    let parts: Vec<&Part> = group.iter().filter_map(|&i| old.parts().get(i)).collect();
    let mut bytes: i64 = parts.iter().map(|p| p.run.raw_bytes() as i64).sum();
    let lower = parts.first().map_or(&b""[..], |p| &p.lower[..]);
    let upper = group.last().and_then(|&i| old.parts().get(i + 1));
    let to = upper.map_or(Bound::Unbounded, |p| Bound::Excluded(&p.lower[..]));
    for (k, v) in frozen.range::<[u8], _>((Bound::Included(lower), to)) {
        let run = old.parts().get(old.part_of(k)).map(|p| &p.run);
        let held = run.filter(|r| r.may_hold(k));
        let mean = held.map_or(0, |r| r.raw_bytes() / r.entries().max(1)) as i64;
        bytes += match (held.is_some(), v.is_empty()) {
            (false, false) => (k.len() + v.len()) as i64,
            (false, true) | (true, false) => 0,
            (true, true) => -mean,
        };
    }
    bytes.max(0) as u64
}

/// The runs replacing a range: cut into pieces of equal size, about
/// [`super::PART_BYTES`] each (so a part grown just past it becomes two halves, not a
/// whole part and a sliver), each synced when finished.
struct PartWriter<'a> {
    table: &'a Layered,
    lower: Box<[u8]>,
    cut_at: u64,
    /// Pieces planned: the last takes whatever the estimate missed, never a sliver.
    pieces: usize,
    current: Option<(super::Writer, String)>,
    done: Vec<(Box<[u8]>, String)>,
}

impl<'a> PartWriter<'a> {
    /// A writer of about `bytes` of keys and values.
    fn new(table: &'a Layered, lower: Box<[u8]>, bytes: u64) -> PartWriter<'a> {
        let most = table.inner.part_bytes.load(Ordering::Relaxed).max(1);
        let pieces = bytes.div_ceil(most).max(1);
        PartWriter {
            table,
            lower,
            cut_at: bytes.div_ceil(pieces).max(1),
            pieces: usize::try_from(pieces).unwrap_or(usize::MAX),
            current: None,
            done: Vec::new(),
        }
    }

    fn push(&mut self, key: &[u8], value: &[u8], out: &mut Written) -> io::Result<()> {
        if self
            .current
            .as_ref()
            .is_some_and(|(w, _)| w.raw_bytes() >= self.cut_at)
            && self.done.len() < self.pieces
        {
            self.cut(out)?;
            self.lower = key.into();
        }
        if self.current.is_none() {
            let inner = &self.table.inner;
            let generation = inner.generation.fetch_add(1, Ordering::SeqCst) + 1;
            let file = part_file(&inner.name, generation);
            // Named before a byte is written, so a failure removes it.
            out.files.push(file.clone());
            self.done.push((self.lower.clone(), file.clone()));
            let writer = super::Writer::create(&inner.dir.join(&file))?;
            let writer = writer.noting(*lock(&inner.noter));
            self.current = Some((writer, file));
        }
        match &mut self.current {
            Some((w, _)) => w.push(key, value),
            None => Ok(()),
        }
    }

    fn cut(&mut self, out: &mut Written) -> io::Result<()> {
        if let Some((writer, _)) = self.current.take() {
            let file = writer.finish()?;
            out.bytes += file.metadata()?.len();
            let syncs = &self.table.inner.syncs;
            syncs.run(RUN_SYNC, || file.sync_all())?;
        }
        Ok(())
    }

    /// The runs written (none when the range is left empty).
    fn finish(mut self, out: &mut Written) -> io::Result<Vec<(Box<[u8]>, String)>> {
        self.cut(out)?;
        Ok(self.done)
    }
}

#[cfg(test)]
#[path = "tests/untaken.rs"]
mod untaken_tests;
