//! Persons by property: a [`super::layered`] table of (project, property key, value,
//! first event's time inverted, person uuid) keys, so the console's search of persons by
//! a property reads the key's entries (a few bytes each, values in order) instead of
//! every person. Within one value the persons are newest first, as in [`first_seen`].
//!
//! A value is its JSON text as the person's bytes hold it, cut to [`VALUE_BYTES`]; the
//! entry's value says whether it was cut ([`CUT`]), and a cut one is a candidate checked
//! against the person. Property keys longer than [`MAX_KEY_BYTES`] are not indexed (a
//! search of one walks the persons).
//!
//! The compactor keeps it in its chunk transaction (`compactor::cache` writes the
//! entries a changed person gains and tombstones the ones it loses, all of them when its
//! first event moves), so it is never out of step with the persons after a crash. A
//! database written before the index gets it built in the background as
//! [`first_seen`]'s is ([`Build`], run by `pipeline`); until it is done [`ready`] says
//! no and the console walks the persons instead. A build step racing the compactor
//! would leave an entry of a value the person no longer has (the step's write of what
//! it read lands after the compactor's change): the step then reads its persons again
//! while the journal is held and puts right those that changed ([`put_right`]). Every
//! entry is still only a candidate the reader checks against the stored person (a cut
//! value, a database whose index was built before the step did this), so a stale one
//! is never shown. A search that passes persons without the key (a negative test) takes
//! an entry as proof the person has the key, so a stale entry of a key its person no
//! longer has would hide it from such a search: the key's [`count`] of holders tells of
//! it (the key's entries are then more than its holders), and the search walks the
//! persons instead. Before the counts are built for an older database, it cannot tell.
//!
//! The counts (persons holding each key, persons of each project) are kept in the same
//! table and chunk: a negative search of a key every person holds reads only the values
//! that may pass, not every holder's place.

use serde::Deserialize;
use serde_json::{Map, Value};
use sled::IVec;
use uuid::Uuid;

use super::first_seen;
use super::rollup::backfill::Step;
use super::{keys, Trees};

pub mod count;
mod read;
pub use read::{candidates, Sieve, NOTER};

/// The table's name, part of the on-disk format.
pub const TREE: &str = "persons_by_property";
/// An entry's value: the value in the key is the whole JSON text ...
pub const WHOLE: &[u8] = &[1];
/// ... or only its first [`VALUE_BYTES`].
pub const CUT: &[u8] = &[2];
/// Longest property key indexed (its length is one byte of the entry).
pub const MAX_KEY_BYTES: usize = 255;
/// A value's JSON text is kept to this many bytes: an email, a plan, a country, a
/// browser are whole; a long URL is a prefix.
pub const VALUE_BYTES: usize = 64;
/// In `meta` once the compactor keeps the index, and while a build is due (see
/// [`first_seen::Marks`]).
const MARKS: first_seen::Marks = first_seen::Marks {
    version: b"persons_by_property.version",
    build: b"persons_by_property.build",
    version_now: 1,
};
/// Persons a build step indexes: each writes an entry a property.
const BUILD_BATCH: usize = 1024;

/// The start of every entry of `key` in `project`; None if the key is too long to be
/// indexed.
pub fn key_prefix(project: u64, key: &str) -> Option<Vec<u8>> {
    let len = u8::try_from(key.len()).ok()?;
    let mut k = Vec::with_capacity(8 + 1 + key.len() + 1 + VALUE_BYTES + 24);
    k.extend_from_slice(&keys::project(project));
    k.push(len);
    k.extend_from_slice(key.as_bytes());
    Some(k)
}

/// The entry of one property of a person, and whether its value was cut; None for a
/// key too long to be indexed.
fn entry(
    project: u64,
    key: &str,
    value: &Value,
    created_at: i64,
    id: Uuid,
) -> Option<(Vec<u8>, &'static [u8])> {
    let mut k = key_prefix(project, key)?;
    let text = serde_json::to_vec(value).unwrap_or_default();
    let kept = text.len().min(VALUE_BYTES);
    k.push(kept as u8);
    k.extend_from_slice(&text[..kept]);
    let place = keys::first_seen(project, created_at, id);
    k.extend_from_slice(&place[8..]);
    let cut = if kept < text.len() { CUT } else { WHOLE };
    Some((k, cut))
}

/// A person as the index sees it: its first event and properties.
pub type Indexed<'a> = (i64, &'a Map<String, Value>);

/// The writes that take the index from a person as it was (`was`, None if it was not
/// stored) to as it is (`now`, None if deleted): tombstones for the entries it loses,
/// then the entries it gains, as `put(key, value)`.
pub fn changes(
    project: u64,
    id: Uuid,
    was: Option<Indexed<'_>>,
    now: Option<Indexed<'_>>,
    mut put: impl FnMut(Vec<u8>, &[u8]),
) {
    // Only what differs moves, unless the first event did (every entry then moves).
    let moved = was.map(|w| w.0) != now.map(|n| n.0);
    let kept = |(k, v): (&String, &Value), other: Option<Indexed<'_>>| {
        !moved && other.is_some_and(|o| o.1.get(k) == Some(v))
    };
    if let Some((born, properties)) = was {
        for p in properties.iter().filter(|&p| !kept(p, now)) {
            if let Some((key, _)) = entry(project, p.0, p.1, born, id) {
                put(key, super::layered::TOMBSTONE);
            }
        }
    }
    if let Some((born, properties)) = now {
        for p in properties.iter().filter(|&p| !kept(p, was)) {
            if let Some((key, value)) = entry(project, p.0, p.1, born, id) {
                put(key, value);
            }
        }
    }
}

/// The first event and properties of a stored person, read without the rest of it.
#[derive(Deserialize)]
pub struct Stored {
    pub created_at: i64,
    #[serde(default)]
    pub properties: Map<String, Value>,
}

impl Stored {
    fn indexed(&self) -> Indexed<'_> {
        (self.created_at, &self.properties)
    }
}

/// Whether every stored person is in the index (no build due).
pub fn ready(meta: &sled::Tree) -> Result<bool, sled::Error> {
    MARKS.ready(meta)
}

/// Whether a build of the index or of its [`count`]s is due (for `pipeline`, deciding
/// to run one).
pub fn building(meta: &sled::Tree) -> Result<bool, sled::Error> {
    Ok(MARKS.building(meta)? || count::building(meta)?)
}

/// Make the index and its counts current, as [`first_seen::prepare`] does its own.
pub fn prepare(trees: &Trees) -> Result<(), sled::Error> {
    MARKS.prepare(
        trees,
        "persons are indexed by property in the background, for the console",
    )?;
    count::prepare(trees)
}

/// Record a build of the index and its counts from every stored person (the persons
/// benchmark calls it after filling persons directly).
pub fn start_build(trees: &Trees) -> Result<(), sled::Error> {
    MARKS.start_build(&trees.meta)?;
    count::start_build(trees)
}

/// A build of the index, a batch of persons at a time, then of its counts; its
/// position is in `meta` (the counts' in the table), so a restart resumes it, and a
/// batch of the index applied again after a crash writes the same entries.
pub struct Build {
    progress: first_seen::Progress,
    /// Whether the index was due too when the build began: the counts are then the
    /// second half of the percent.
    both: bool,
}

impl Build {
    pub fn new(trees: &Trees) -> Build {
        Build {
            progress: first_seen::Progress::new(trees),
            both: MARKS.building(&trees.meta).unwrap_or(false),
        }
    }

    /// Index the next batch of persons, or count it once all are indexed; `Done` once
    /// both are.
    pub fn step(&self, trees: &Trees) -> Result<Step, sled::Error> {
        let half = |p: u8| if self.both { p / 2 } else { p };
        match self.index(trees)? {
            Step::Progress(p) => return Ok(Step::Progress(half(p))),
            Step::Done if !count::building(&trees.meta)? => return Ok(Step::Done),
            Step::Done => {}
        }
        Ok(match count::step(trees, self.progress.total())? {
            Step::Progress(p) if self.both => Step::Progress(50 + p / 2),
            step => step,
        })
    }

    /// Index the next batch of persons; `Done` once all are.
    fn index(&self, trees: &Trees) -> Result<Step, sled::Error> {
        let mut read = Vec::with_capacity(BUILD_BATCH);
        let index = |project, id, bytes: &[u8], out: &mut Vec<(IVec, IVec)>| {
            if let Ok(p) = serde_json::from_slice::<Stored>(bytes) {
                let now = Some((p.created_at, &p.properties));
                changes(project, id, None, now, |k, v| {
                    out.push((IVec::from(k), IVec::from(v)));
                });
            }
            read.push((project, id, IVec::from(bytes)));
        };
        let step = self
            .progress
            .step(trees, &MARKS, &trees.by_property, BUILD_BATCH, index)?;
        put_right(trees, &read)?;
        Ok(step)
    }
}

/// After a build step wrote the entries of the persons it read (`read`: project, uuid,
/// bytes), the changes that take them to the persons as stored now, for those the
/// compactor changed in between (its own changes to the index, made from the person
/// as it was, were overwritten by the step's). Made and written while the journal is
/// held, so no chunk changes a person in between: every entry is then of a value its
/// person has.
fn put_right(trees: &Trees, read: &[(u64, Uuid, IVec)]) -> Result<(), sled::Error> {
    let parse = |bytes: &[u8]| serde_json::from_slice::<Stored>(bytes).ok();
    let made = || {
        let mut out = Vec::new();
        for (project, id, bytes) in read {
            let now = trees.persons.get(keys::with_uuid(*project, *id));
            let now = now.ok().flatten();
            if now.as_ref() == Some(bytes) {
                continue;
            }
            let (was, now) = (parse(bytes), now.as_deref().and_then(parse));
            let put = |k: Vec<u8>, v: &[u8]| out.push((IVec::from(k), IVec::from(v)));
            changes(
                *project,
                *id,
                was.as_ref().map(Stored::indexed),
                now.as_ref().map(Stored::indexed),
                put,
            );
        }
        out
    };
    trees.by_property.write_made(made).map_err(sled::Error::Io)
}

#[cfg(test)]
#[path = "tests/by_property.rs"]
mod tests;
