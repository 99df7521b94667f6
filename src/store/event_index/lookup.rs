//! What a read asks of the event index: the blocks holding events of any of some
//! distinct ids (a person's), of one name, with one property key, or several of these
//! at once, in a time range. Each part of the index (the recent part, a frozen one,
//! each run) answers for the blocks it holds: it holds every key of each of its
//! blocks (a block's keys are added together and runs are merged whole), so the
//! intersection is taken part by part, on the sorted block ids, before any block is
//! named by its place; the parts' answers are then taken newest first ([`Newest`]).
//! A property key is answered by the blocks naming it and those that may hold any key
//! (some event's properties kept whole).

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::names::WALK_SHARE;
use super::newest::{Newest, Range, Stream};
use super::recent::{key, Kind, Recent};
use super::run::{BlockRef, Run};
use super::table::resolve;
use super::Index;

/// A read's question, in one project.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    pub project: u64,
    /// Blocks with events of any of these distinct ids, when given.
    pub distinct_ids: Option<&'a [String]>,
    /// Blocks with events of this name, when given.
    pub event: Option<&'a str>,
    /// Blocks with an event that may have this property key, when given.
    pub property: Option<&'a str>,
    /// Blocks that may hold an event at or after this time.
    pub oldest: i64,
    /// Blocks that may hold an event at or before this time, when given.
    pub newest: Option<i64>,
}

/// The keys an [`Ask`] looks up.
struct Keys {
    who: Option<Vec<Vec<u8>>>,
    /// Each group must be met, by a block with any of its keys: the property's (the
    /// key, or any key), then the name's.
    all_of: Vec<Vec<Vec<u8>>>,
}

/// A part of the index that names blocks by key.
trait Part {
    /// The ids of `key`'s blocks, ascending, each once.
    fn ids(&self, key: &[u8]) -> io::Result<Vec<u64>>;
    /// Those of `ids` (ascending) whose blocks have `key`.
    fn with_key(&self, key: &[u8], ids: Vec<u64>) -> io::Result<Vec<u64>>;
    /// The blocks of `ids` (ascending) this part names, added to `out`.
    fn resolve(&self, ids: &[u64], out: &mut Vec<BlockRef>);
}

impl Part for Recent {
    fn ids(&self, key: &[u8]) -> io::Result<Vec<u64>> {
        Ok(Recent::ids(self, key))
    }

    fn with_key(&self, key: &[u8], ids: Vec<u64>) -> io::Result<Vec<u64>> {
        Ok(intersect(&ids, &Recent::ids(self, key)))
    }

    fn resolve(&self, ids: &[u64], out: &mut Vec<BlockRef>) {
        resolve(self.table(), ids, out);
    }
}

impl Part for Run {
    fn ids(&self, key: &[u8]) -> io::Result<Vec<u64>> {
        self.get(key)
    }

    /// Through the key's places, kept for the next read, rather than a list of all
    /// its blocks: a person's few blocks tested against a name in most of them.
    fn with_key(&self, key: &[u8], mut ids: Vec<u64>) -> io::Result<Vec<u64>> {
        match self.named(key)? {
            Some(places) => ids.retain(|&id| self.place_of(id).is_some_and(|p| places.has(p))),
            None => ids.clear(),
        }
        Ok(ids)
    }

    fn resolve(&self, ids: &[u64], out: &mut Vec<BlockRef>) {
        resolve(&self.blocks, ids, out);
    }
}

/// The ids of both sorted lists.
fn intersect(a: &[u64], b: &[u64]) -> Vec<u64> {
    let (small, large) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    small
        .iter()
        .copied()
        .filter(|id| large.binary_search(id).is_ok())
        .collect()
}

/// The ids of `part`'s blocks with any of `keys`, ascending, each once.
fn any_of(part: &dyn Part, keys: &[Vec<u8>]) -> io::Result<Vec<u64>> {
    let mut ids = Vec::new();
    for k in keys {
        ids.extend(part.ids(k)?);
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// The ids of `part`'s blocks that answer `keys`, ascending: those of the distinct
/// ids, then of those the ones meeting each group in turn.
fn matching(part: &dyn Part, keys: &Keys) -> io::Result<Vec<u64>> {
    let mut ids = match &keys.who {
        Some(who) => Some(any_of(part, who)?),
        None => None,
    };
    for group in &keys.all_of {
        ids = Some(match ids {
            Some(ids) if ids.is_empty() => return Ok(ids),
            Some(ids) => {
                let mut met = Vec::new();
                for k in group {
                    met.extend(part.with_key(k, ids.clone())?);
                }
                met.sort_unstable();
                met.dedup();
                met
            }
            None => any_of(part, group)?,
        });
    }
    Ok(ids.unwrap_or_default())
}

/// A recent part's answer, listed.
fn listed(part: &dyn Part, keys: &Keys, range: &Range) -> io::Result<Stream> {
    let ids = matching(part, keys)?;
    let mut blocks = Vec::with_capacity(ids.len());
    part.resolve(&ids, &mut blocks);
    Ok(Stream::listed(blocks, range))
}

/// A run's answer: a name's (or a property key's) places in its read order, kept in
/// the run, a stream for each of the group's keys; a person's blocks as places too
/// when they are a good share of the run's, else listed.
fn of_run(run: &Arc<Run>, keys: &Keys, range: &Range, out: &mut Vec<Stream>) -> io::Result<()> {
    if let (None, [group]) = (&keys.who, &keys.all_of[..]) {
        for k in group {
            if let Some(places) = run.named(k)? {
                out.push(Stream::places(run.clone(), places, range));
            }
        }
        return Ok(());
    }
    let ids = matching(run.as_ref(), keys)?;
    if ids.len() * WALK_SHARE >= run.blocks.len() {
        let places = Arc::new(run.places(&ids));
        out.push(Stream::places(run.clone(), places, range));
        return Ok(());
    }
    let mut blocks = Vec::with_capacity(ids.len());
    run.resolve(&ids, &mut blocks);
    out.push(Stream::listed(blocks, range));
    Ok(())
}

impl Index {
    /// The blocks holding events that answer `ask`, newest first; None while the
    /// index is not built, when every block must be read instead (said once in the
    /// log).
    pub fn blocks(&self, ask: &Ask) -> io::Result<Option<Newest>> {
        let keys = Keys {
            who: ask.distinct_ids.map(|ids| {
                ids.iter()
                    .map(|d| key(ask.project, Kind::DistinctId, d))
                    .collect()
            }),
            all_of: [
                ask.property.map(|p| {
                    vec![
                        key(ask.project, Kind::Property, p),
                        key(ask.project, Kind::AnyProperty, ""),
                    ]
                }),
                ask.event
                    .map(|name| vec![key(ask.project, Kind::Event, name)]),
            ]
            .into_iter()
            .flatten()
            .collect(),
        };
        let range = Range {
            project: ask.project,
            oldest: ask.oldest,
            newest: ask.newest,
        };
        let mut streams = Vec::new();
        let (runs, frozen) = {
            let s = self.state();
            if !s.complete {
                drop(s);
                if !self.shared.said_scanning.swap(true, Ordering::Relaxed) {
                    tracing::info!(
                        "event index not built yet: events by distinct id, person, name or property are read from every block until it is"
                    );
                }
                return Ok(None);
            }
            streams.push(listed(&s.active, &keys, &range)?);
            let runs: Vec<Arc<Run>> = s.runs.iter().map(|(_, r)| r.clone()).collect();
            (runs, s.frozen.clone())
        };
        if let Some(f) = &frozen {
            streams.push(listed(f.as_ref(), &keys, &range)?);
        }
        for r in &runs {
            of_run(r, &keys, &range, &mut streams)?;
        }
        Ok(Some(Newest::new(range, streams)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_ids_intersect_either_way_round() {
        assert_eq!(intersect(&[1, 4, 9, 12], &[2, 4, 5, 12, 40]), [4, 12]);
        assert_eq!(intersect(&[2, 4, 5, 12, 40], &[1, 4, 9, 12]), [4, 12]);
        assert!(intersect(&[], &[1]).is_empty());
    }
}
