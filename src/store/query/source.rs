//! Where a read of events finds the blocks that may hold its matches, newest block
//! first: every block of the project in a time range, or the blocks the [event
//! index](super::super::event_index) names for the distinct ids the filter allows, the
//! name it asks for, or both.

use std::collections::HashSet;

use super::super::event_index::{Ask, Newest};
use super::super::{keys, Trees};
use super::{person, EventFilter};

type Entry = Result<(sled::IVec, sled::IVec), sled::Error>;

/// Where the blocks that may hold matches come from, newest block first.
pub(super) enum Source {
    Scan(Box<std::iter::Peekable<std::iter::Rev<sled::Iter>>>),
    /// The index's blocks still to read and the tree naming them.
    Index(Newest, sled::Tree),
}

impl Source {
    /// The newest time of the next block: `Some(None)` when it cannot be read (it
    /// is loaded anyway, to return the error), `None` at the end.
    pub(super) fn peek_newest(&mut self) -> Option<Option<i64>> {
        match self {
            Source::Scan(blocks) => Some(match blocks.peek()? {
                Err(_) => None,
                Ok((key, _)) => keys::split_block(key).map(|(_, t)| t),
            }),
            Source::Index(blocks, _) => Some(Some(blocks.peek()?.newest)),
        }
    }

    pub(super) fn next(&mut self) -> Option<Entry> {
        match self {
            Source::Scan(blocks) => blocks.next(),
            Source::Index(blocks, events) => loop {
                let b = blocks.pop()?;
                let key = keys::block(b.project, b.newest, b.id);
                match events.get(key) {
                    // Retention deleted it since it was indexed.
                    Ok(None) => continue,
                    Ok(Some(value)) => return Some(Ok((key[..].into(), value))),
                    Err(e) => return Some(Err(e)),
                }
            },
        }
    }
}

/// The distinct ids `filter` allows, if it names any: its distinct id, the person's
/// (both: those in each).
pub(super) fn who(
    trees: &Trees,
    project: u64,
    f: &EventFilter,
) -> Result<Option<HashSet<String>>, sled::Error> {
    let mut who: Option<HashSet<String>> = f.distinct_id.clone().map(|d| [d].into());
    if let Some(id) = f.person_id {
        let of_person: HashSet<String> = match person(trees, project, id)? {
            Some(p) => p.distinct_ids.into_iter().collect(),
            None => HashSet::new(),
        };
        who = Some(match who {
            Some(w) => w.intersection(&of_person).cloned().collect(),
            None => of_person,
        });
    }
    Ok(who)
}

/// The blocks the index names for `who` and `event` in `project` that may hold an
/// event from `oldest` to `newest` (both included), as [`Source::Index`] keeps them;
/// None while the index is not built.
pub(super) fn indexed(
    trees: &Trees,
    project: u64,
    who: Option<&HashSet<String>>,
    event: Option<&str>,
    oldest: i64,
    newest: Option<i64>,
) -> Result<Option<Source>, sled::Error> {
    let ids: Option<Vec<String>> = who.map(|w| w.iter().cloned().collect());
    let ask = Ask {
        project,
        distinct_ids: ids.as_deref(),
        event,
        oldest,
        newest,
    };
    let Some(blocks) = trees.event_index.blocks(&ask).map_err(sled::Error::Io)? else {
        return Ok(None);
    };
    Ok(Some(Source::Index(blocks, trees.events.clone())))
}

/// Every block of `project` whose newest event is in `oldest..=newest`, newest first.
pub(super) fn scan(
    trees: &Trees,
    project: u64,
    oldest: i64,
    newest: Option<i64>,
    empty: bool,
) -> Source {
    let lo = keys::event_bound(project, oldest).to_vec();
    let hi = match newest.and_then(|t| t.checked_add(1)) {
        Some(t) => keys::event_bound(project, t).to_vec(),
        None => match project.checked_add(1) {
            Some(next) => keys::project(next).to_vec(),
            None => vec![0xff; 25],
        },
    };
    let range = if lo < hi && !empty {
        trees.events.range(lo..hi)
    } else {
        trees.events.range(hi.clone()..hi)
    };
    Source::Scan(Box::new(range.rev().peekable()))
}
