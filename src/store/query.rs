//! Reads for the read API and flag evaluation. All blocking (sled); callers on the
//! reactor move them to the blocking pool.

use sled::IVec;
use uuid::Uuid;

use super::event::StoredEvent;
use super::{keys, Group, Trees, MAX_GROUP_TYPES};
use crate::persons::Person;

/// Which events to list. Times are unix milliseconds: `after <= timestamp < before`.
#[derive(Debug, Default, Clone)]
pub struct EventFilter {
    pub after: Option<i64>,
    pub before: Option<i64>,
    pub event: Option<String>,
    pub distinct_id: Option<String>,
}

impl EventFilter {
    fn matches(&self, e: &StoredEvent) -> bool {
        self.event.as_deref().is_none_or(|name| e.event == name)
            && self
                .distinct_id
                .as_deref()
                .is_none_or(|id| e.distinct_id == id)
    }
}

/// Matching events, newest first, lazily. `cursor` continues a previous page: only
/// keys strictly before it are visited. An event's `person_id` is the person its
/// distinct id belongs to now, so events stored before a merge show the merged person.
pub struct Events {
    inner: std::iter::Rev<sled::Iter>,
    filter: EventFilter,
    distinct_ids: sled::Tree,
    project: u64,
}

impl Iterator for Events {
    /// The event and its key (the cursor for the next page).
    type Item = Result<(IVec, StoredEvent), sled::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        for entry in self.inner.by_ref() {
            let (key, value) = match entry {
                Ok(kv) => kv,
                Err(e) => return Some(Err(e)),
            };
            // A value that does not decode is skipped: one damaged event must not
            // hide all the others.
            if let Some(mut event) = StoredEvent::decode(&value) {
                if self.filter.matches(&event) {
                    if event.person_id.is_some() {
                        match self
                            .distinct_ids
                            .get(keys::with_str(self.project, &event.distinct_id))
                        {
                            Ok(Some(id)) => {
                                event.person_id = Uuid::from_slice(&id).ok().or(event.person_id)
                            }
                            Ok(None) => {}
                            Err(e) => return Some(Err(e)),
                        }
                    }
                    return Some(Ok((key, event)));
                }
            }
        }
        None
    }
}

pub fn events(trees: &Trees, project: u64, filter: EventFilter, cursor: Option<&[u8]>) -> Events {
    let lo = keys::event_bound(project, filter.after.unwrap_or(i64::MIN)).to_vec();
    let mut hi = match filter.before {
        Some(before) => keys::event_bound(project, before).to_vec(),
        None => match project.checked_add(1) {
            Some(next) => keys::project(next).to_vec(),
            None => vec![0xff; 33],
        },
    };
    if let Some(c) = cursor {
        if c < hi.as_slice() {
            hi = c.to_vec();
        }
    }
    let inner = if lo < hi {
        trees.events.range(lo..hi)
    } else {
        trees.events.range(hi.clone()..hi)
    };
    Events {
        inner: inner.rev(),
        filter,
        distinct_ids: trees.distinct_ids.clone(),
        project,
    }
}

/// One page: up to `limit` events and, if there may be more, the cursor for the next.
pub fn events_page(
    trees: &Trees,
    project: u64,
    filter: EventFilter,
    cursor: Option<&[u8]>,
    limit: usize,
) -> Result<(Vec<StoredEvent>, Option<IVec>), sled::Error> {
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

/// Entries waiting in the log plus records waiting in the slower lanes, from the span
/// of their keys: O(log n), exact unless sequence numbers were skipped at a restart.
pub fn log_depth(trees: &Trees) -> u64 {
    [&trees.wal, &trees.historical, &trees.overflow]
        .into_iter()
        .map(|tree| {
            let first = tree.first().ok().flatten().and_then(|(k, _)| keys::seq(&k));
            let last = tree.last().ok().flatten().and_then(|(k, _)| keys::seq(&k));
            match (first, last) {
                (Some(a), Some(b)) => b.saturating_sub(a) + 1,
                _ => 0,
            }
        })
        .sum()
}
