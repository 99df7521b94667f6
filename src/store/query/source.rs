//! Where a read of events finds the blocks that may hold its matches, newest block
//! first: every block of the project in a time range, or the blocks the [event
//! index](super::super::event_index) names for the distinct ids the filter allows, the
//! name it asks for, the property key a test needs ([`Narrow`]), or several at once.
//! Without the index (not built yet), a read needing a property key reads every block
//! but passes over those whose key lists lack it, as the index would, up to a bound.

use std::collections::HashSet;

use super::super::block::{self, Files};
use super::super::event_index::{Ask, Index, Newest};
use super::super::{keys, Trees};
use super::{person, EventFilter};

type Entry = Result<(sled::IVec, sled::IVec), sled::Error>;

/// Where the blocks that may hold matches come from, newest block first.
pub(super) enum Source {
    /// Every block in the range; those lacking the key a test needs passed over.
    Scan(
        Box<std::iter::Peekable<std::iter::Rev<sled::Iter>>>,
        Option<Narrow>,
    ),
    /// The index's blocks still to read and the tree naming them.
    Index(Newest, sled::Tree),
}

/// A property key that every event a read can return has: only the blocks that may
/// hold it are read.
pub(super) struct Narrow {
    pub key: String,
    pub files: Files,
    /// What else the read asks the index for (its [`Plan`]'s): a block all of whose
    /// events are newer than `newest`, or without an event of the name or of one of
    /// the distinct ids, is passed over too, as the index leaves it out.
    pub newest: Option<i64>,
    pub event: Option<String>,
    pub who: Option<Vec<String>>,
    /// Blocks a scan passed over for lacking the key, and how many it may: past that
    /// it loads them, so that it stops within its bound ([`super::Events::tested`]).
    pub passed: usize,
    pub limit: usize,
}

impl Narrow {
    /// Whether the block (as the events tree holds it) has no event with the key, or
    /// none old enough: told from its key lists and its oldest time, the same answer
    /// the index gives. A block that cannot be read may hold it: it is loaded, which
    /// reports it.
    fn lacks(&self, key: &[u8], value: &[u8]) -> bool {
        let Ok(bytes) = self.files.resolve(value) else {
            return false;
        };
        let oldest = block::oldest(&bytes);
        if let (Some(newest), Some(oldest)) = (self.newest, oldest) {
            if oldest > newest {
                return true;
            }
        }
        let asks = self.event.is_some() || self.who.is_some();
        match block::may_hold_key(&bytes, &self.key) {
            Some(false) => return true,
            Some(true) if !asks => return false,
            _ => {}
        }
        // Older layouts tell the key only once decoded, and any tells the names and
        // distinct ids so (kept in the cache for the load).
        let Some(rows) = self.files.rows(key, value) else {
            return false;
        };
        if rows.column(&self.key).is_some_and(|c| !c.may_hold()) {
            return true;
        }
        let heads = rows.heads();
        let named =
            (self.event.as_deref()).is_none_or(|name| heads.iter().any(|h| rows.event(h) == name));
        let known = (self.who.as_ref()).is_none_or(|who| {
            heads
                .iter()
                .any(|h| who.iter().any(|d| d == rows.distinct_id(h)))
        });
        !(named && known)
    }
}

impl Source {
    /// The newest time of the next block: `Some(None)` when it cannot be read (it
    /// is loaded anyway, to return the error), `None` at the end.
    pub(super) fn peek_newest(&mut self) -> Option<Option<i64>> {
        match self {
            Source::Scan(blocks, narrow) => loop {
                match blocks.peek()? {
                    Err(_) => return Some(None),
                    Ok((key, value)) => {
                        let lacks = (narrow.as_ref())
                            .is_some_and(|n| n.passed < n.limit && n.lacks(key, value));
                        if !lacks {
                            return Some(keys::split_block(key).map(|(_, t)| t));
                        }
                    }
                }
                if let Some(n) = narrow.as_mut() {
                    n.passed += 1;
                }
                blocks.next();
            },
            Source::Index(blocks, _) => Some(Some(blocks.peek()?.newest)),
        }
    }

    /// Whether a scan has passed over as many blocks as it may.
    pub(super) fn passed_all(&self) -> bool {
        match self {
            Source::Scan(_, Some(n)) => n.passed >= n.limit,
            _ => false,
        }
    }

    pub(super) fn next(&mut self) -> Option<Entry> {
        match self {
            Source::Scan(blocks, _) => blocks.next(),
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

/// What a read's blocks are chosen by, kept so that a test needing a property key
/// chooses them again through the key's blocks.
pub(super) struct Plan {
    index: Index,
    events: sled::Tree,
    project: u64,
    /// The distinct ids the filter allows, when it names some.
    who: Option<Vec<String>>,
    event: Option<String>,
    /// The oldest and newest time an event that may match has.
    oldest: i64,
    newest: Option<i64>,
    /// The cursor is not one of the project's places: nothing matches.
    empty: bool,
}

impl Plan {
    pub(super) fn new(
        trees: &Trees,
        project: u64,
        (who, event): (Option<&HashSet<String>>, Option<&str>),
        (oldest, newest): (i64, Option<i64>),
        empty: bool,
    ) -> Plan {
        Plan {
            index: trees.event_index.clone(),
            events: trees.events.clone(),
            project,
            who: who.map(|w| w.iter().cloned().collect()),
            event: event.map(str::to_owned),
            oldest,
            newest,
            empty,
        }
    }

    /// The blocks the index names for the filter and `narrow`'s key, when it asks for
    /// any and the index is built; else every block of the range (those lacking the
    /// key passed over).
    pub(super) fn source(&self, mut narrow: Option<Narrow>) -> Result<Source, sled::Error> {
        if let Some(n) = narrow.as_mut() {
            n.newest = self.newest;
            n.event = self.event.clone();
            n.who = self.who.clone();
        }
        let property = narrow.as_ref().map(|n| n.key.as_str());
        let asks = self.who.is_some() || self.event.is_some() || property.is_some();
        if asks && !self.empty {
            let ask = Ask {
                project: self.project,
                distinct_ids: self.who.as_deref(),
                event: self.event.as_deref(),
                property,
                oldest: self.oldest,
                newest: self.newest,
            };
            if let Some(blocks) = self.index.blocks(&ask).map_err(sled::Error::Io)? {
                return Ok(Source::Index(blocks, self.events.clone()));
            }
        }
        Ok(self.scan(narrow))
    }

    /// Every block of the project whose newest event is in the range, newest first.
    pub(super) fn scan(&self, narrow: Option<Narrow>) -> Source {
        let (project, oldest) = (self.project, self.oldest);
        // The newest a block holding the newest event that may match may have.
        let newest = (self.newest).and_then(|t| t.checked_add(block::MAX_SPAN_MS));
        let lo = keys::event_bound(project, oldest).to_vec();
        let hi = match newest.and_then(|t| t.checked_add(1)) {
            Some(t) => keys::event_bound(project, t).to_vec(),
            None => match project.checked_add(1) {
                Some(next) => keys::project(next).to_vec(),
                None => vec![0xff; 25],
            },
        };
        let range = if lo < hi && !self.empty {
            self.events.range(lo..hi)
        } else {
            self.events.range(hi.clone()..hi)
        };
        Source::Scan(Box::new(range.rev().peekable()), narrow)
    }
}
