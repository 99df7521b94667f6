//! Reads for the read API and flag evaluation. All blocking (sled); callers on the
//! reactor move them to the blocking pool.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;

use uuid::Uuid;

use super::block::{self, Rows};
use super::event::StoredEvent;
use super::{keys, Group, Trees, MAX_GROUP_TYPES};
use crate::persons::Person;
use source::{who, Plan, Source};
pub use tested::BlockTest;

mod source;
mod tested;

/// Which events to list. Times are unix milliseconds: `after <= timestamp < before`.
#[derive(Debug, Default, Clone)]
pub struct EventFilter {
    pub after: Option<i64>,
    pub before: Option<i64>,
    pub event: Option<String>,
    pub distinct_id: Option<String>,
    /// Events of any of the person's distinct ids (as they are now).
    pub person_id: Option<Uuid>,
}

/// An event's place in the read order (time, then uuid); pages continue below one.
pub type Place = (i64, u128);

/// The filter plus the page's upper bound, checked against block headers only.
struct Bounds {
    filter: EventFilter,
    /// The distinct ids the filter allows, when it names some.
    who: Option<HashSet<String>>,
    /// Only places strictly below this (the cursor), if any.
    below: Option<Place>,
}

impl Bounds {
    fn matches(&self, b: &Rows, h: &block::Head) -> bool {
        let f = &self.filter;
        f.after.is_none_or(|t| h.timestamp >= t)
            && f.before.is_none_or(|t| h.timestamp < t)
            && self
                .below
                .is_none_or(|c| (h.timestamp, h.uuid.as_u128()) < c)
            && f.event.as_deref().is_none_or(|name| b.event(h) == name)
            && self
                .who
                .as_ref()
                .is_none_or(|who| who.contains(b.distinct_id(h)))
    }
}

/// At most this many matches left in a block are kept as events instead of the
/// decoded block. Blocks overlap by up to [`block::MAX_SPAN_MS`] (a chunk's block often
/// holds one event that arrived late), and a block held until its oldest match is
/// returned would keep every block of that span decoded at once.
const TAIL_EVENTS: usize = 4;

/// The matching events of a loaded block not yet returned, oldest first.
enum Loaded {
    /// The decoded block and the indexes of its matches.
    Block { block: Arc<Rows>, left: Vec<u32> },
    /// The last few matches, taken out of the block.
    Tail(Vec<StoredEvent>),
}

impl Loaded {
    /// The block's matches `left`, as a tail once there are few enough.
    fn new(block: Arc<Rows>, left: Vec<u32>) -> Loaded {
        Loaded::Block { block, left }.shrunk()
    }

    fn shrunk(self) -> Loaded {
        match self {
            Loaded::Block { block, left } if left.len() <= TAIL_EVENTS => Loaded::Tail(
                left.iter()
                    .filter_map(|&i| block.stored(i as usize))
                    .collect(),
            ),
            other => other,
        }
    }

    /// The place of the newest match left.
    fn next_place(&self) -> Option<Place> {
        match self {
            Loaded::Block { block, left } => {
                let h = &block.heads()[*left.last()? as usize];
                Some((h.timestamp, h.uuid.as_u128()))
            }
            Loaded::Tail(events) => events.last().map(|e| (e.timestamp, e.uuid.as_u128())),
        }
    }

    /// Take the newest match left.
    fn pop(&mut self) -> Option<StoredEvent> {
        match self {
            Loaded::Block { block, left } => block.stored(left.pop()? as usize),
            Loaded::Tail(events) => events.pop(),
        }
    }
}

/// The newest unreturned match of a loaded block, ordered by place.
#[derive(PartialEq, Eq)]
struct Next {
    place: Place,
    slot: usize,
}

impl Ord for Next {
    fn cmp(&self, other: &Self) -> Ordering {
        self.place
            .cmp(&other.place)
            .then(other.slot.cmp(&self.slot))
    }
}

impl PartialOrd for Next {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Matching events, newest first (by time, then uuid), lazily: a merge over the
/// blocks that may hold them. Blocks are visited by their newest event, descending,
/// and one is decoded only once the next event to return could come from it; a block
/// down to its last few matches keeps only those (see [`TAIL_EVENTS`]), so the blocks
/// held decoded are those with many matches around the current time. An event's `person_id`
/// is the person its distinct id belongs to now, so events stored before a merge show
/// the merged person.
pub struct Events {
    blocks: Source,
    /// How `blocks` were chosen, to choose again for a test ([`Events::tested`]).
    plan: Plan,
    /// A read failed before the first block: returned first.
    failed: Option<sled::Error>,
    /// Where the blocks' bytes are.
    files: block::Files,
    bounds: Bounds,
    loaded: Vec<Option<Loaded>>,
    heap: BinaryHeap<Next>,
    distinct_ids: super::layered::Layered,
    /// The person of each distinct id met so far (see [`PERSONS_MEMO`]).
    person_of: HashMap<String, Option<Uuid>>,
    project: u64,
    /// A test of each block's events and a bound on the blocks read ([`Events::tested`]).
    test: Option<tested::Tested>,
}

/// A read remembers the person of at most this many distinct ids: a person's events
/// share one or a few, each looked up in the distinct ids' runs once instead of once an
/// event; a read of every event forgets them all past this, to stay bounded.
const PERSONS_MEMO: usize = 4096;

impl Events {
    /// Decode the next block in key order if the newest pending match could be older
    /// than its newest event; false when there is nothing more to load now.
    fn load_next(&mut self) -> Result<bool, sled::Error> {
        let top = self.heap.peek().map(|n| n.place.0);
        let Some(newest) = self.blocks.peek_newest() else {
            return Ok(false);
        };
        // A block whose newest event is older than the top cannot come before it.
        if let (Some(top), Some(newest)) = (top, newest) {
            if newest < top {
                return Ok(false);
            }
        }
        if self.over_budget(newest) {
            return Ok(false);
        }
        let Some(entry) = self.blocks.next() else {
            return Ok(false);
        };
        let (key, value) = entry?;
        self.count_loaded();
        // A block that cannot be read or decoded is skipped: one damaged block must not
        // hide all the others.
        let Some(block) = self.files.rows(&key, &value) else {
            return Ok(true);
        };
        let mut left: Vec<u32> = (0..block.heads().len() as u32)
            .filter(|&i| self.bounds.matches(&block, &block.heads()[i as usize]))
            .collect();
        self.keep(&block, &mut left)?;
        let loaded = Loaded::new(block, left);
        if let Some(place) = loaded.next_place() {
            let slot = match self.loaded.iter().position(Option::is_none) {
                Some(free) => free,
                None => {
                    self.loaded.push(None);
                    self.loaded.len() - 1
                }
            };
            self.heap.push(Next { place, slot });
            self.loaded[slot] = Some(loaded);
        }
        Ok(true)
    }

    /// Take the newest match of everything loaded.
    fn pop(&mut self) -> Option<StoredEvent> {
        let Next { slot, .. } = self.heap.pop()?;
        let mut loaded = self.loaded.get_mut(slot)?.take()?;
        let event = loaded.pop()?;
        let loaded = loaded.shrunk();
        if let Some(place) = loaded.next_place() {
            self.heap.push(Next { place, slot });
            self.loaded[slot] = Some(loaded);
        }
        Some(event)
    }

    fn current_person(&mut self, event: &mut StoredEvent) -> Result<(), sled::Error> {
        if event.person_id.is_none() {
            return Ok(());
        }
        let now = match self.person_of.get(&event.distinct_id) {
            Some(&known) => known,
            None => {
                let key = keys::with_str(self.project, &event.distinct_id);
                let now = self.distinct_ids.get(key)?;
                let now = now.and_then(|id| Uuid::from_slice(&id).ok());
                if self.person_of.len() >= PERSONS_MEMO {
                    self.person_of.clear();
                }
                self.person_of.insert(event.distinct_id.clone(), now);
                now
            }
        };
        event.person_id = now.or(event.person_id);
        Ok(())
    }
}

#[cfg(test)]
impl Events {
    /// Whether the blocks come from the event index.
    pub(crate) fn through_index(&self) -> bool {
        matches!(self.blocks, Source::Index(..))
    }

    /// How many blocks the index named to read, when it answers.
    fn named_blocks(&self) -> Option<usize> {
        match &self.blocks {
            Source::Index(named, _) => Some(named.count()),
            Source::Scan(..) => None,
        }
    }

    /// How many parts of the index were walked and how many listed, when it answers.
    fn index_ways(&self) -> Option<(usize, usize)> {
        match &self.blocks {
            Source::Index(named, _) => Some(named.ways()),
            Source::Scan(..) => None,
        }
    }

    /// How many blocks are held decoded right now.
    fn decoded_blocks(&self) -> usize {
        let decoded = |l: &&Loaded| matches!(l, Loaded::Block { .. });
        self.loaded.iter().flatten().filter(decoded).count()
    }
}

impl Iterator for Events {
    /// The event and its place (the cursor for the next page).
    type Item = Result<([u8; 32], StoredEvent), sled::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.failed.take() {
            return Some(Err(e));
        }
        loop {
            match self.load_next() {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => return Some(Err(e)),
            }
        }
        if self.held_back() {
            return None;
        }
        let mut event = self.pop()?;
        if let Err(e) = self.current_person(&mut event) {
            return Some(Err(e));
        }
        let cursor = keys::event(self.project, event.timestamp, event.uuid);
        Some(Ok((cursor, event)))
    }
}

/// The place a cursor names: the 32 bytes of [`keys::event`] of the last event of the
/// previous page, in `project`. None if it is not one.
pub fn cursor_place(project: u64, cursor: &[u8]) -> Option<Place> {
    if cursor.len() != 32 || cursor.get(..8)? != keys::project(project) {
        return None;
    }
    let (ts, uuid) = keys::split_event(cursor)?;
    Some((ts, uuid.as_u128()))
}

/// Matching events of `project`, newest first, strictly below `cursor` if given. A
/// cursor that is not one of this project's places matches nothing. A filter naming
/// a distinct id, a person or an event name (or a test needing a property key,
/// [`Events::tested`]) reads only the blocks the event index names for them (for
/// several, the blocks in each), once the index is built; until then every block is
/// read.
pub fn events(trees: &Trees, project: u64, filter: EventFilter, cursor: Option<&[u8]>) -> Events {
    let below = cursor.map(|c| cursor_place(project, c));
    let empty = matches!(below, Some(None));
    let below = below.flatten();
    // The newest event that may match.
    let newest = [
        filter.before.map(|t| t.saturating_sub(1)),
        below.map(|c| c.0),
    ]
    .into_iter()
    .flatten()
    .min();
    let oldest = filter.after.unwrap_or(i64::MIN);
    let mut failed = None;
    let who = who(trees, project, &filter).unwrap_or_else(|e| {
        failed = Some(e);
        None
    });
    let asked = (who.as_ref(), filter.event.as_deref());
    let plan = Plan::new(trees, project, asked, (oldest, newest), empty);
    let blocks = match failed {
        Some(_) => plan.scan(None),
        None => plan.source(None).unwrap_or_else(|e| {
            failed = Some(e);
            plan.scan(None)
        }),
    };
    Events {
        blocks,
        plan,
        failed,
        files: trees.blocks.clone(),
        bounds: Bounds { filter, who, below },
        loaded: Vec::new(),
        heap: BinaryHeap::new(),
        distinct_ids: trees.distinct_ids.clone(),
        person_of: HashMap::new(),
        project,
        test: None,
    }
}

/// One page: up to `limit` events and, if there may be more, the cursor for the next.
pub fn events_page(
    trees: &Trees,
    project: u64,
    filter: EventFilter,
    cursor: Option<&[u8]>,
    limit: usize,
) -> Result<(Vec<StoredEvent>, Option<[u8; 32]>), sled::Error> {
    let mut out = Vec::with_capacity(limit.min(1024));
    for entry in events(trees, project, filter, cursor) {
        let (key, event) = entry?;
        out.push(event);
        if out.len() >= limit {
            return Ok((out, Some(key)));
        }
    }
    Ok((out, None))
}

pub fn person_id_of(
    trees: &Trees,
    project: u64,
    distinct_id: &str,
) -> Result<Option<Uuid>, sled::Error> {
    Ok(trees
        .distinct_ids
        .get(keys::with_str(project, distinct_id))?
        .and_then(|b| Uuid::from_slice(&b).ok()))
}

pub fn person(trees: &Trees, project: u64, id: Uuid) -> Result<Option<Person>, sled::Error> {
    Ok(trees
        .persons
        .get(keys::with_uuid(project, id))?
        .and_then(|b| serde_json::from_slice(&b).ok()))
}

pub fn person_by_distinct_id(
    trees: &Trees,
    project: u64,
    distinct_id: &str,
) -> Result<Option<Person>, sled::Error> {
    match person_id_of(trees, project, distinct_id)? {
        Some(id) => person(trees, project, id),
        None => Ok(None),
    }
}

/// Up to `limit` persons of a project, in id order (which is creation order).
pub fn persons(trees: &Trees, project: u64, limit: usize) -> Result<Vec<Person>, sled::Error> {
    let mut out = Vec::new();
    for entry in trees.persons.scan_prefix(keys::project(project)) {
        let (_, v) = entry?;
        if let Ok(p) = serde_json::from_slice(&v) {
            out.push(p);
        }
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
}

pub fn group(
    trees: &Trees,
    project: u64,
    index: u8,
    key: &str,
) -> Result<Option<Group>, sled::Error> {
    Ok(trees
        .groups
        .get(keys::group(project, index, key))?
        .and_then(|b| serde_json::from_slice(&b).ok()))
}

pub fn groups_of_type(
    trees: &Trees,
    project: u64,
    index: u8,
    limit: usize,
) -> Result<Vec<Group>, sled::Error> {
    let mut prefix = keys::project(project).to_vec();
    prefix.push(index);
    let mut out = Vec::new();
    for entry in trees.groups.scan_prefix(prefix) {
        let (_, v) = entry?;
        if let Ok(g) = serde_json::from_slice(&v) {
            out.push(g);
        }
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
}

/// The project's group types: index and name, in index order.
pub fn group_types(trees: &Trees, project: u64) -> Result<Vec<(u8, String)>, sled::Error> {
    let mut out = Vec::new();
    for index in 0..MAX_GROUP_TYPES {
        if let Some(name) = trees
            .group_types
            .get(keys::group_type_by_index(project, index))?
        {
            out.push((index, String::from_utf8_lossy(&name).into_owned()));
        }
    }
    Ok(out)
}

pub fn group_type_index(
    trees: &Trees,
    project: u64,
    name: &str,
) -> Result<Option<u8>, sled::Error> {
    Ok(trees
        .group_types
        .get(keys::group_type_by_name(project, name))?
        .and_then(|v| v.first().copied()))
}

#[cfg(test)]
#[path = "tests/query.rs"]
mod tests;

#[cfg(test)]
#[path = "tests/query_names.rs"]
mod names_tests;
