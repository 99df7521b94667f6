//! How many persons hold each property key, and how many persons a project has, kept
//! in the index's own table beside its entries, so a search that persons without the
//! key pass (`is_not`, `not_icontains`, `not_regex`, `is_not_set`) knows whether anyone
//! lacks the key without reading every holder's place, and whether the key's entries
//! name more persons than hold it (a stale entry, which would hide its person from such
//! a search).
//!
//! A count is an entry of the table under a key no entry can have: an entry's key goes
//! on after the property key with its value's length (at most [`VALUE_BYTES`]); a
//! count's with a byte above it: [`HOLDERS`] after the property key, [`PERSONS`] after
//! the empty key's, [`STATE`] after project 0's empty key. The compactor moves them in
//! its chunk transaction with the entries (`compactor::cache`), so they are exact after
//! a crash. A database whose persons were stored before the counts gets them counted
//! in the background, a batch of persons at a time while the journal is held ([`step`]),
//! the last person counted kept with the counts ([`Kept::Upto`]): the compactor moves
//! the counts only for the persons already counted, so every person is counted once,
//! by the build as it finds it or by the compactor as it changes it. Until the build is
//! done the search does without them.

use std::collections::HashMap;
use std::ops::Bound;

use sled::IVec;

use super::{key_prefix, Indexed, Stored, VALUE_BYTES};
use crate::store::layered::{Layered, TOMBSTONE};
use crate::store::rollup::backfill::Step;
use crate::store::{keys, Trees};

/// After a property key: the count of persons holding it.
const HOLDERS: u8 = 0xFF;
/// After a project's empty property key: the count of its persons.
const PERSONS: u8 = 0xFE;
/// After project 0's empty property key: how far the counts are kept ([`Kept`]).
const STATE: u8 = 0xFD;
const STATE_KEY: [u8; 10] = [0, 0, 0, 0, 0, 0, 0, 0, 0, STATE];
/// In `meta` while the counts are due to be built (for `pipeline`, which reads `meta`
/// to know what to build); removed once [`STATE_KEY`] says they are all kept.
const DUE: &[u8] = b"persons_by_property.counts";
/// Persons a build step counts while it holds the journal: a few milliseconds of the
/// compactor's time.
const BATCH: usize = 2048;

const _: () = assert!(VALUE_BYTES < STATE as usize);

/// The key of the count of `project`'s persons holding `key`; None for a key too long
/// to be indexed.
fn holders_key(project: u64, key: &str) -> Option<Vec<u8>> {
    let mut k = key_prefix(project, key)?;
    k.push(HOLDERS);
    Some(k)
}

/// The key of the count of `project`'s persons.
fn persons_key(project: u64) -> [u8; 10] {
    let mut k = [0u8; 10];
    k[..8].copy_from_slice(&keys::project(project));
    k[9] = PERSONS;
    k
}

/// Whether a key of the table is a count's rather than an entry's.
pub fn is_count(key: &[u8]) -> bool {
    let Some(&len) = key.get(8) else {
        return false;
    };
    key.get(9 + len as usize)
        .is_some_and(|&b| b as usize > VALUE_BYTES)
}

fn number(value: Option<IVec>) -> u64 {
    value
        .and_then(|v| v.as_ref().try_into().ok())
        .map_or(0, u64::from_be_bytes)
}

/// How far the counts are kept: for no person (before a build's first step, or before
/// [`prepare`]), for the persons up to a key of the persons table (a build under way),
/// or for every person.
#[derive(Debug, Clone, PartialEq)]
pub enum Kept {
    No,
    Upto { counted: u64, last: Vec<u8> },
    All,
}

impl Kept {
    /// The state as the table holds it, read through `get`.
    pub fn read(get: impl FnOnce(&[u8]) -> Option<IVec>) -> Kept {
        let Some(v) = get(&STATE_KEY) else {
            return Kept::No;
        };
        match v.split_first() {
            Some((1, _)) => Kept::All,
            Some((_, rest)) if rest.len() > 8 => Kept::Upto {
                counted: u64::from_be_bytes(rest[..8].try_into().unwrap_or_default()),
                last: rest[8..].to_vec(),
            },
            _ => Kept::No,
        }
    }

    fn value(&self) -> Vec<u8> {
        match self {
            Kept::All => vec![1],
            Kept::No => [&[0][..], &0u64.to_be_bytes()].concat(),
            Kept::Upto { counted, last } => [&[0][..], &counted.to_be_bytes(), last].concat(),
        }
    }

    /// Whether the counts include the person whose key in the persons table is `person`.
    pub fn covers(&self, person: &[u8]) -> bool {
        match self {
            Kept::All => true,
            Kept::No => false,
            Kept::Upto { last, .. } => person <= &last[..],
        }
    }
}

/// The counts' changes of a chunk (or a build step), gathered by key, then written
/// from the counts as committed.
#[derive(Default)]
pub struct Moves(HashMap<Vec<u8>, i64>);

impl Moves {
    /// What a person's change from `was` (None if it was not stored) to `now` (None if
    /// deleted) moves: the project's persons if it came or went, each key it gained or
    /// lost. A value changed or a first event moved moves nothing.
    pub fn person(&mut self, project: u64, was: Option<Indexed<'_>>, now: Option<Indexed<'_>>) {
        let mut add = |k: Vec<u8>, by: i64| *self.0.entry(k).or_default() += by;
        if was.is_some() != now.is_some() {
            add(
                persons_key(project).to_vec(),
                if now.is_some() { 1 } else { -1 },
            );
        }
        for (side, other, by) in [(was, now, -1), (now, was, 1)] {
            let Some((_, properties)) = side else {
                continue;
            };
            let others = other.map(|o| o.1);
            for key in properties.keys() {
                if others.is_some_and(|o| o.contains_key(key)) {
                    continue;
                }
                if let Some(k) = holders_key(project, key) {
                    add(k, by);
                }
            }
        }
    }

    /// The writes that move the counts, each read through `get` as committed; a count
    /// that reaches 0 is removed.
    pub fn writes(self, get: impl Fn(&[u8]) -> Option<IVec>) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out: Vec<_> = self.0.into_iter().filter(|m| m.1 != 0).collect();
        out.sort_unstable();
        out.into_iter()
            .map(|(k, by)| {
                let n = (number(get(&k)) as i64).saturating_add(by).max(0) as u64;
                let v = match n {
                    0 => TOMBSTONE.to_vec(),
                    n => n.to_be_bytes().to_vec(),
                };
                (k, v)
            })
            .collect()
    }
}

/// Counts by key, in key order, for the tests.
#[cfg(test)]
pub(crate) type Counts = Vec<(Vec<u8>, u64)>;

/// The counts of the table (not how far they are kept).
#[cfg(test)]
pub(crate) fn held(table: &crate::store::layered::Layered) -> Counts {
    let counts = table.iter().map(|kv| kv.unwrap());
    let counts = counts.filter(|(k, _)| is_count(k) && k[..] != STATE_KEY);
    counts.map(|(k, v)| (k.to_vec(), number(Some(v)))).collect()
}

#[cfg(test)]
impl Moves {
    /// The counts these moves make from none, in key order, as [`held`] gives them.
    pub(crate) fn totals(self) -> Counts {
        let mut out: Vec<_> = (self.0.into_iter())
            .filter(|m| m.1 != 0)
            .map(|(k, n)| (k, n as u64))
            .collect();
        out.sort();
        out
    }
}

/// A change of persons (project, uuid, as it was, as it is) as the compactor writes it
/// to the index, outside a chunk: the entries, and the counts' moves for the persons
/// they count. For the tests that store persons directly.
#[cfg(test)]
pub(crate) fn write_changes<'a>(
    trees: &Trees,
    persons: impl IntoIterator<Item = (u64, uuid::Uuid, Option<Indexed<'a>>, Option<Indexed<'a>>)>,
) {
    let table = &trees.by_property;
    let kept = kept(table);
    let (mut writes, mut moves) = (Vec::new(), Moves::default());
    for (project, id, was, now) in persons {
        super::changes(project, id, was, now, |k, v| writes.push((k, v.to_vec())));
        if kept.covers(&keys::with_uuid(project, id)) {
            moves.person(project, was, now);
        }
    }
    writes.extend(moves.writes(|k| table.get(k).unwrap()));
    write(trees, writes).unwrap();
}

/// The persons of `project` holding `key` and all its persons, if the counts are kept
/// for every person; None while they are built, or for a key too long to be indexed.
pub fn of(trees: &Trees, project: u64, key: &str) -> Result<Option<(u64, u64)>, sled::Error> {
    let table = &trees.by_property;
    if kept(table) != Kept::All {
        return Ok(None);
    }
    let Some(holders) = holders_key(project, key) else {
        return Ok(None);
    };
    let persons = table.get(persons_key(project))?;
    Ok(Some((number(table.get(holders)?), number(persons))))
}

/// Make the counts current when the trees open: nothing to do if the table says they
/// are kept for every person; a build under way is due again (`meta` may have lost the
/// mark in a crash the table's journal survived); else every person is counted now if
/// there are none, or a build is recorded.
pub fn prepare(trees: &Trees) -> Result<(), sled::Error> {
    if let Some(state) = trees.by_property.get(STATE_KEY)? {
        if Kept::read(|_| Some(state)) != Kept::All {
            trees.meta.insert(DUE, &[1][..])?;
        }
        return Ok(());
    }
    if trees.persons.is_empty()? {
        return write(trees, vec![(STATE_KEY.to_vec(), Kept::All.value())]);
    }
    tracing::info!("persons' property keys are counted in the background, for the console");
    start_build(trees)
}

/// Record a build of the counts from every stored person: the counts the table holds
/// are removed (a bench or test that stored persons directly), so the table is read
/// through once.
pub fn start_build(trees: &Trees) -> Result<(), sled::Error> {
    trees.meta.insert(DUE, &[1][..])?;
    trees.meta.flush()?;
    let mut writes: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    for entry in trees.by_property.iter() {
        let (k, _) = entry?;
        if is_count(&k) {
            writes.push((k.to_vec(), TOMBSTONE.to_vec()));
        }
    }
    writes.push((STATE_KEY.to_vec(), Kept::No.value()));
    write(trees, writes)
}

fn write(trees: &Trees, writes: Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), sled::Error> {
    trees
        .by_property
        .write(ivecs(writes))
        .map_err(sled::Error::Io)
}

fn ivecs(writes: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<(IVec, IVec)> {
    writes
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect()
}

/// How far the counts are kept, as `table` holds it now.
fn kept(table: &Layered) -> Kept {
    Kept::read(|k| table.get(k).ok().flatten())
}

/// Whether a build of the counts is due.
pub fn building(meta: &sled::Tree) -> Result<bool, sled::Error> {
    Ok(meta.get(DUE)?.is_some())
}

/// Count the next batch of persons, with the journal held so no chunk commits between
/// the read of the persons and the write of the counts; `Done` once all are. `total`
/// is the persons expected, for the percent.
pub fn step(trees: &Trees, total: u64) -> Result<Step, sled::Error> {
    let table = &trees.by_property;
    // Only the build moves the state, and one build runs at a time.
    if kept(table) == Kept::All {
        trees.meta.remove(DUE)?;
        return Ok(Step::Done);
    }
    let mut outcome = Ok(Step::Done);
    let made = || {
        let (counted, from) = match kept(table) {
            Kept::Upto { counted, last } => (counted, Bound::Excluded(last)),
            _ => (0, Bound::Unbounded),
        };
        let mut moves = Moves::default();
        let mut last = None;
        let mut n = 0u64;
        for entry in trees.persons.range((from, Bound::Unbounded)).take(BATCH) {
            let (key, bytes) = match entry {
                Ok(kv) => kv,
                Err(e) => {
                    outcome = Err(e);
                    return Vec::new();
                }
            };
            let project = key.get(..8).and_then(|b| b.try_into().ok());
            let stored = serde_json::from_slice::<Stored>(&bytes).ok();
            if let (Some(project), Some(p)) = (project, &stored) {
                moves.person(u64::from_be_bytes(project), None, Some(p.indexed()));
            }
            last = Some(key);
            n += 1;
        }
        let kept = match last {
            None => Kept::All,
            Some(last) => {
                let counted = counted + n;
                outcome = Ok(Step::Progress((counted * 100 / total.max(1)).min(99) as u8));
                Kept::Upto {
                    counted,
                    last: last.to_vec(),
                }
            }
        };
        let mut writes = moves.writes(|k| table.get(k).ok().flatten());
        writes.push((STATE_KEY.to_vec(), kept.value()));
        ivecs(writes)
    };
    table.write_made(made).map_err(sled::Error::Io)?;
    if matches!(outcome, Ok(Step::Done)) {
        trees.meta.remove(DUE)?;
    }
    outcome
}

#[cfg(test)]
#[path = "../tests/by_property_count.rs"]
mod tests;
