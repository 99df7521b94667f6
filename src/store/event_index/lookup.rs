//! What a read asks of the event index: the blocks holding events of any of some
//! distinct ids (a person's), of one name, or of both at once. Each part of the index
//! (the recent part, a frozen one, each run) answers for the blocks it holds: it
//! holds every key of each of its blocks (a block's keys are added together and runs
//! are merged whole), so the intersection is taken part by part, on the sorted block
//! ids, before any block is named by its place.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::recent::{key, Kind, Recent};
use super::run::{BlockRef, Run};
use super::Index;

/// A read's question, in one project.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    pub project: u64,
    /// Blocks with events of any of these distinct ids, when given.
    pub distinct_ids: Option<&'a [String]>,
    /// Blocks with events of this name, when given.
    pub event: Option<&'a str>,
}

/// The keys an [`Ask`] looks up.
struct Keys {
    who: Option<Vec<Vec<u8>>>,
    event: Option<Vec<u8>>,
}

/// A part of the index that names blocks by key.
trait Part {
    /// The ids of `key`'s blocks, ascending, each once.
    fn ids(&self, key: &[u8]) -> io::Result<Vec<u64>>;
    /// The blocks of `ids` (ascending) this part names, added to `out`.
    fn resolve(&self, ids: &[u64], out: &mut Vec<BlockRef>);
}

impl Part for Recent {
    fn ids(&self, key: &[u8]) -> io::Result<Vec<u64>> {
        Ok(Recent::ids(self, key))
    }

    fn resolve(&self, ids: &[u64], out: &mut Vec<BlockRef>) {
        out.extend(ids.iter().filter_map(|&id| self.block(id)));
    }
}

impl Part for Run {
    fn ids(&self, key: &[u8]) -> io::Result<Vec<u64>> {
        self.get(key)
    }

    fn resolve(&self, ids: &[u64], out: &mut Vec<BlockRef>) {
        // A name common to most blocks asks for most of the table: walked once along
        // it rather than searched for each id.
        if ids.len() * 8 < self.blocks.len() {
            out.extend(ids.iter().filter_map(|&id| self.block(id)));
            return;
        }
        let mut table = self.blocks.iter().peekable();
        for &id in ids {
            while table.next_if(|b| b.id < id).is_some() {}
            if let Some(b) = table.next_if(|b| b.id == id) {
                out.push(*b);
            }
        }
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

/// The blocks of `part` that answer `keys`.
fn matching(part: &dyn Part, keys: &Keys, out: &mut Vec<BlockRef>) -> io::Result<()> {
    let who = match &keys.who {
        Some(who) => {
            let mut ids = Vec::new();
            for k in who {
                ids.extend(part.ids(k)?);
            }
            ids.sort_unstable();
            ids.dedup();
            if ids.is_empty() {
                return Ok(());
            }
            Some(ids)
        }
        None => None,
    };
    let ids = match (&keys.event, who) {
        (Some(k), Some(who)) => intersect(&who, &part.ids(k)?),
        (Some(k), None) => part.ids(k)?,
        (None, Some(who)) => who,
        (None, None) => return Ok(()),
    };
    part.resolve(&ids, out);
    Ok(())
}

impl Index {
    /// The blocks holding events that answer `ask`, in no order, a block possibly
    /// more than once (when a crash had it indexed twice); None while the index is not
    /// built, when every block must be read instead (said once in the log).
    pub fn blocks(&self, ask: &Ask) -> io::Result<Option<Vec<BlockRef>>> {
        let keys = Keys {
            who: ask.distinct_ids.map(|ids| {
                ids.iter()
                    .map(|d| key(ask.project, Kind::DistinctId, d))
                    .collect()
            }),
            event: ask.event.map(|name| key(ask.project, Kind::Event, name)),
        };
        let mut out = Vec::new();
        let (runs, frozen) = {
            let s = self.state();
            if !s.complete {
                drop(s);
                if !self.shared.said_scanning.swap(true, Ordering::Relaxed) {
                    tracing::info!(
                        "event index not built yet: events by distinct id, person or name are read from every block until it is"
                    );
                }
                return Ok(None);
            }
            matching(&s.active, &keys, &mut out)?;
            let runs: Vec<Arc<Run>> = s.runs.iter().map(|(_, r)| r.clone()).collect();
            (runs, s.frozen.clone())
        };
        if let Some(f) = &frozen {
            matching(f.as_ref(), &keys, &mut out)?;
        }
        for r in &runs {
            matching(r.as_ref(), &keys, &mut out)?;
        }
        Ok(Some(out))
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
