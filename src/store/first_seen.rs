//! Persons by first seen: a [`super::layered`] table of (project, first event's time
//! inverted, person uuid) keys with a one-byte value, so the console lists a project's
//! persons newest first by reading keys in order instead of scanning every person.
//!
//! The compactor keeps it in its chunk transaction (`compactor::cache` writes a key
//! when a person is created, moves it when a merge gives the survivor an older first
//! event, removes it with a merged-away person). A database written before the index
//! existed gets it built in the background: [`prepare`] (when the trees open, before
//! the compactor starts) records that a build is due, and [`Build::step`] adds the
//! persons a batch at a time, saving its position in `meta`, so a restart resumes it;
//! `pipeline` runs the steps on a thread of their own and logs the progress. Until the
//! build is done, [`ready`] says no and the console scans instead.
//!
//! An entry is a hint checked against the person it names ([`newest`]): a key whose
//! person is gone or has another first event (a build step racing a merge) is skipped,
//! so a stale key never shows a wrong person. Such keys are rare.
//! Persons churn little (created once, moved only by a merge), but sled's file holds
//! 32-byte keys at about 220 bytes each (measured with `cargo bench --bench
//! console_persons`), so the keys are folded into a sorted run with the persons and
//! distinct ids, where they take a few tens of bytes.

use std::ops::Bound;

use serde::Deserialize;
use sled::IVec;
use uuid::Uuid;

use super::layered::Layered;
use super::rollup::backfill::Step;
use super::{keys, person_bytes, Trees};
use crate::persons::Person;

/// The table's name, part of the on-disk format.
pub const TREE: &str = "persons_first_seen";
/// A key's value: anything but empty, which is a removal in a layered table.
pub const PRESENT: &[u8] = &[1];
/// In `meta` once the compactor keeps the index, and while a build is due.
const MARKS: Marks = Marks {
    version: b"persons_first_seen.version",
    build: b"persons_first_seen.build",
    version_now: 1,
};
/// Persons a build step indexes: one sled batch of about 100 KiB of keys, read in a
/// few tens of milliseconds, so the compactor and capture keep most of the machine.
const BUILD_BATCH: usize = 4096;

/// The first event's time of a stored person, read without the rest of it.
#[derive(Deserialize)]
struct Born {
    created_at: i64,
}

/// Where in `meta` an index of the persons records that the compactor keeps it
/// (`version`, set with the build it may need) and, while a build is due, the build's
/// position (`build`: persons indexed so far, u64 BE, then the last persons key
/// indexed, empty before the first). This index's and [`super::by_property`]'s.
pub struct Marks {
    pub version: &'static [u8],
    pub build: &'static [u8],
    pub version_now: u8,
}

impl Marks {
    /// Make the index current: nothing to do if the compactor keeps it already; else a
    /// build is recorded (`why` logged) if there are stored persons to index. Runs
    /// before the compactor.
    pub fn prepare(&self, trees: &Trees, why: &str) -> Result<(), sled::Error> {
        if trees.meta.get(self.version)?.as_deref() == Some(&[self.version_now][..]) {
            return Ok(());
        }
        if trees.persons.is_empty()? {
            trees.meta.insert(self.version, &[self.version_now][..])?;
        } else {
            tracing::info!("{why}");
            self.start_build(&trees.meta)?;
        }
        trees.meta.flush()?;
        Ok(())
    }

    /// Record a build of the index from every stored person (and that the compactor
    /// keeps it from now on).
    pub fn start_build(&self, meta: &sled::Tree) -> Result<(), sled::Error> {
        let mut batch = sled::Batch::default();
        batch.insert(self.build, &0u64.to_be_bytes()[..]);
        batch.insert(self.version, &[self.version_now][..]);
        meta.apply_batch(batch)
    }

    /// Whether every stored person is in the index (no build due).
    pub fn ready(&self, meta: &sled::Tree) -> Result<bool, sled::Error> {
        Ok(meta.get(self.build)?.is_none() && meta.get(self.version)?.is_some())
    }

    /// Whether a build is due.
    pub fn building(&self, meta: &sled::Tree) -> Result<bool, sled::Error> {
        Ok(meta.get(self.build)?.is_some())
    }
}

/// Make the index current (see [`Marks::prepare`]).
pub fn prepare(trees: &Trees) -> Result<(), sled::Error> {
    MARKS.prepare(
        trees,
        "persons are indexed by first seen in the background, for the console",
    )
}

/// Record a build of the index from every stored person (and that the compactor keeps
/// it from now on). The persons benchmark calls it after filling persons directly.
pub fn start_build(trees: &Trees) -> Result<(), sled::Error> {
    MARKS.start_build(&trees.meta)
}

/// Whether every stored person is in the index (no build due).
pub fn ready(meta: &sled::Tree) -> Result<bool, sled::Error> {
    MARKS.ready(meta)
}

/// Whether a build is due (for `pipeline`, deciding to run one).
pub fn building(meta: &sled::Tree) -> Result<bool, sled::Error> {
    MARKS.building(meta)
}

/// A build of the index, with the number of persons it expects, for the progress.
pub struct Build(Progress);

impl Build {
    pub fn new(trees: &Trees) -> Build {
        Build(Progress::new(trees))
    }

    /// Index the next batch of persons; `Done` once all are (the state is then removed
    /// from `meta`). A batch applied again after a crash writes the same keys.
    pub fn step(&self, trees: &Trees) -> Result<Step, sled::Error> {
        let index = |project, id, bytes: &[u8], out: &mut Vec<(IVec, IVec)>| {
            if let Ok(born) = serde_json::from_slice::<Born>(bytes) {
                let key = keys::first_seen(project, born.created_at, id);
                out.push((IVec::from(&key[..]), IVec::from(PRESENT)));
            }
        };
        self.0
            .step(trees, &MARKS, &trees.first_seen, BUILD_BATCH, index)
    }
}

/// A build of an index of the persons through every stored person, a batch at a time,
/// with the number of persons it expects, for the progress.
pub struct Progress {
    total: u64,
}

impl Progress {
    pub fn new(trees: &Trees) -> Progress {
        // The run holds all but recent changes; the delta's entries are at most an
        // eighth more (see layered::FOLD_SHARE), so this is close enough for a percent.
        let run = trees.persons.run().map_or(0, |r| r.entries());
        let delta = trees.persons.delta_len() as u64;
        Progress {
            total: (run + delta).max(1),
        }
    }

    /// The persons expected.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Write to `table` what `index` makes of each of the next `batch` persons (given
    /// its project, uuid and bytes); `Done` once all are (the position is then removed
    /// from `meta`).
    pub fn step(
        &self,
        trees: &Trees,
        marks: &Marks,
        table: &Layered,
        batch: usize,
        mut index: impl FnMut(u64, Uuid, &[u8], &mut Vec<(IVec, IVec)>),
    ) -> Result<Step, sled::Error> {
        let Some(state) = trees.meta.get(marks.build)? else {
            return Ok(Step::Done);
        };
        let done = state
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_be_bytes);
        let from = match state.get(8..) {
            Some(cursor) if !cursor.is_empty() => Bound::Excluded(cursor.to_vec()),
            _ => Bound::Unbounded,
        };
        let mut writes = Vec::new();
        let mut last: Option<IVec> = None;
        let mut n = 0u64;
        for entry in trees.persons.range((from, Bound::Unbounded)).take(batch) {
            let (key, value) = entry?;
            if let (Some(project), Some(id)) = (
                key.get(..8).and_then(|b| b.try_into().ok()),
                key.get(8..24).and_then(|b| Uuid::from_slice(b).ok()),
            ) {
                index(u64::from_be_bytes(project), id, &value, &mut writes);
            }
            last = Some(key);
            n += 1;
        }
        // The compactor folds it into the table's run as it folds its own writes.
        table.write(writes).map_err(sled::Error::Io)?;
        let Some(last) = last else {
            trees.meta.remove(marks.build)?;
            return Ok(Step::Done);
        };
        let done = done + n;
        trees
            .meta
            .insert(marks.build, [&done.to_be_bytes()[..], &last].concat())?;
        Ok(Step::Progress((done * 100 / self.total).min(99) as u8))
    }
}

/// The project's persons newest first (by first event, then uuid), from after the
/// index key `after`: each with its index key, read through the index and checked
/// against the stored person (a stale key is skipped).
pub fn newest<'a>(
    trees: &'a Trees,
    project: u64,
    after: Option<&[u8]>,
) -> impl Iterator<Item = Result<(IVec, Person), sled::Error>> + 'a {
    newest_stored(trees, project, after).filter_map(|entry| {
        let (key, created_at, bytes) = match entry {
            Ok(found) => found,
            Err(e) => return Some(Err(e)),
        };
        let person: Person = serde_json::from_slice(&bytes).ok()?;
        (person.created_at == created_at).then_some(Ok((key, person)))
    })
}

/// [`newest`] before the check: each index key, the first event's time it names and
/// the stored bytes of the person it names (a key whose person is gone is skipped), for
/// a reader that checks the time without decoding the person
/// ([`super::person_probe`]). The persons' bytes are read through
/// [`super::person_bytes`], which keeps them for the next page.
pub fn newest_stored<'a>(
    trees: &'a Trees,
    project: u64,
    after: Option<&[u8]>,
) -> impl Iterator<Item = Result<(IVec, i64, IVec), sled::Error>> + 'a {
    let prefix = keys::project(project);
    let from = match after {
        Some(key) if key.starts_with(&prefix) => Bound::Excluded(key.to_vec()),
        _ => Bound::Included(prefix.to_vec()),
    };
    let to = match project.checked_add(1) {
        Some(next) => Bound::Excluded(keys::project(next).to_vec()),
        None => Bound::Unbounded,
    };
    trees.first_seen.range((from, to)).filter_map(move |entry| {
        let (key, _) = match entry {
            Ok(kv) => kv,
            Err(e) => return Some(Err(e)),
        };
        let (created_at, id) = keys::split_first_seen(&key)?;
        let person = keys::with_uuid(project, id);
        let found = person_bytes::global().get(&trees.persons, &person)?;
        Some(Ok((key, created_at, found)))
    })
}

#[cfg(test)]
#[path = "tests/first_seen.rs"]
mod tests;
