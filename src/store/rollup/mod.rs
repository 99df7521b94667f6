//! Rollups: what the console's insights read instead of scanning stored events. Per
//! project and hour (of the event's timestamp, UTC): each event name's count and a
//! unique-person [`Sketch`]; `$feature_flag_called` counts per flag and returned
//! value; `survey sent` counts per survey and per answer. The compactor adds a chunk's
//! events in the same transaction that stores them ([`Pending`]: accumulated in memory,
//! one read-modify-write per key per chunk), so rollups and events never disagree; a
//! database written before rollups existed is filled in from its stored events by
//! [`backfill`], and until then [`status`] says so and the console scans. A chunk's
//! counts are held in memory and written with a later chunk ([`hot`]), so sled's file
//! does not fill with old copies of the current hour's keys.
//!
//! Keys (the on-disk format; times are [`keys::time`] of the hour's first millisecond,
//! texts are prefixed with their length, u32 big-endian):
//! - events: project, 1, name, hour -> version, count (u64 LE), sketch. Name first, so
//!   a chart of one event over 90 days is one range.
//! - exposures: project, 2, hour, flag, value -> version, count.
//! - surveys: project, 3, hour, survey id, 0 -> version, count, name (its latest);
//!   project, 3, hour, survey id, 1, answer -> version, count.

pub mod backfill;
pub mod hot;
mod read;
pub mod sketch;

use std::collections::HashMap;

use serde_json::Value;
use sled::transaction::{TransactionalTree, UnabortableTransactionError};
use uuid::Uuid;

pub use hot::Rollups;
pub use read::{events, exposures, series, surveys, top, Hours};
pub use sketch::Sketch;

use super::keys;

/// The tree's name, part of the on-disk format.
/// In `meta` while counts of stored blocks are only in memory: the first block id
/// (u64 big-endian) whose events the rollups tree does not count yet.
pub const FROM_KEY: &[u8] = b"rollups.from";
pub const TREE: &str = "rollups";
/// The version byte of every value, and in `meta` under [`VERSION_KEY`] once the
/// tree holds rollups of this version for every stored event (or a backfill is on
/// its way to that). Another version found there is rebuilt from the events.
pub const VERSION: u8 = 1;
pub const VERSION_KEY: &[u8] = b"rollups.version";
pub const HOUR_MS: i64 = 3_600_000;

const EVENTS: u8 = 1;
const EXPOSURES: u8 = 2;
const SURVEYS: u8 = 3;

/// The first millisecond of the hour `ms` falls in.
pub fn hour_of(ms: i64) -> i64 {
    ms.div_euclid(HOUR_MS) * HOUR_MS
}

fn push_text(key: &mut Vec<u8>, text: &str) {
    key.extend_from_slice(&(text.len() as u32).to_be_bytes());
    key.extend_from_slice(text.as_bytes());
}

fn prefix(project: u64, kind: u8) -> Vec<u8> {
    let mut k = Vec::with_capacity(64);
    k.extend_from_slice(&keys::project(project));
    k.push(kind);
    k
}

/// project, 1, name: every hour of one event name follows.
fn event_prefix(project: u64, name: &str) -> Vec<u8> {
    let mut k = prefix(project, EVENTS);
    push_text(&mut k, name);
    k
}

fn event_key(project: u64, name: &str, hour: i64) -> Vec<u8> {
    let mut k = event_prefix(project, name);
    k.extend_from_slice(&keys::time(hour));
    k
}

/// project, kind, hour: the hour-first kinds' keys of that hour follow.
fn hour_prefix(project: u64, kind: u8, hour: i64) -> Vec<u8> {
    let mut k = prefix(project, kind);
    k.extend_from_slice(&keys::time(hour));
    k
}

/// A text at the start of `bytes` and what follows it.
fn take_text(bytes: &[u8]) -> Option<(&str, &[u8])> {
    let len = u32::from_be_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let text = std::str::from_utf8(bytes.get(4..4 + len)?).ok()?;
    Some((text, &bytes[4 + len..]))
}

/// What a chunk adds to one key.
#[derive(Debug, Clone, PartialEq)]
enum Delta {
    Event { count: u64, sketch: Sketch },
    Count(u64),
    Survey { count: u64, name: String },
}

impl Delta {
    fn count(&self) -> u64 {
        match self {
            Delta::Event { count, .. } | Delta::Count(count) | Delta::Survey { count, .. } => {
                *count
            }
        }
    }

    /// This added to what is stored: counts add, sketches merge, the later name wins.
    fn merge(&mut self, other: Delta) {
        match (self, other) {
            (
                Delta::Event { count, sketch },
                Delta::Event {
                    count: c,
                    sketch: s,
                },
            ) => {
                *count += c;
                sketch.merge(&s);
            }
            (Delta::Count(count), Delta::Count(c)) => *count += c,
            (Delta::Survey { count, name }, Delta::Survey { count: c, name: n }) => {
                *count += c;
                *name = n;
            }
            // Kinds never share a key.
            _ => {}
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = vec![VERSION];
        out.extend_from_slice(&self.count().to_le_bytes());
        match self {
            Delta::Event { sketch, .. } => sketch.encode(&mut out),
            Delta::Count(_) => {}
            Delta::Survey { name, .. } => out.extend_from_slice(name.as_bytes()),
        }
        out
    }

    /// A stored value as the kind `like` is; None if damaged.
    fn decode(value: &[u8], like: &Delta) -> Option<Delta> {
        let count = count_of(value)?;
        let rest = &value[9..];
        Some(match like {
            Delta::Event { .. } => Delta::Event {
                count,
                sketch: Sketch::decode(rest)?,
            },
            Delta::Count(_) => Delta::Count(count),
            Delta::Survey { .. } => Delta::Survey {
                count,
                name: std::str::from_utf8(rest).ok()?.to_owned(),
            },
        })
    }
}

/// The count of a stored value of any kind, without decoding the rest.
fn count_of(value: &[u8]) -> Option<u64> {
    if *value.first()? != VERSION {
        return None;
    }
    Some(u64::from_le_bytes(value.get(1..9)?.try_into().ok()?))
}

/// A chunk's rollups, accumulated in memory and written once per key.
#[derive(Debug, Default, PartialEq)]
pub struct Pending {
    deltas: HashMap<Vec<u8>, Delta>,
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.deltas.is_empty()
    }

    fn add_to(&mut self, key: Vec<u8>, delta: Delta) {
        match self.deltas.get_mut(&key) {
            Some(d) => d.merge(delta),
            None => {
                self.deltas.insert(key, delta);
            }
        }
    }

    /// Count one stored event. `properties` (its JSON) is read only for flag calls and
    /// survey responses, exactly as the console's scan read them.
    pub fn add(
        &mut self,
        project: u64,
        timestamp: i64,
        name: &str,
        person: Option<Uuid>,
        distinct_id: &str,
        properties: &[u8],
    ) {
        let hour = hour_of(timestamp);
        let mut sketch = Sketch::default();
        sketch.insert(sketch::who(person, distinct_id));
        self.add_to(
            event_key(project, name, hour),
            Delta::Event { count: 1, sketch },
        );
        if name != "$feature_flag_called" && name != "survey sent" {
            return;
        }
        let Ok(Value::Object(p)) = serde_json::from_slice::<Value>(properties) else {
            return;
        };
        if name == "$feature_flag_called" {
            let Some(flag) = p.get("$feature_flag").and_then(Value::as_str) else {
                return;
            };
            let mut key = hour_prefix(project, EXPOSURES, hour);
            push_text(&mut key, flag);
            key.extend_from_slice(exposure_value(p.get("$feature_flag_response")).as_bytes());
            self.add_to(key, Delta::Count(1));
            return;
        }
        let Some(id) = p.get("$survey_id").and_then(Value::as_str) else {
            return;
        };
        let survey_name = p.get("$survey_name").and_then(Value::as_str).unwrap_or(id);
        let mut key = hour_prefix(project, SURVEYS, hour);
        push_text(&mut key, id);
        for answer in answers(p.get("$survey_response")) {
            let mut k = key.clone();
            k.push(1);
            k.extend_from_slice(answer.as_bytes());
            self.add_to(k, Delta::Count(1));
        }
        key.push(0);
        let name = survey_name.to_owned();
        self.add_to(key, Delta::Survey { count: 1, name });
    }

    /// Add everything to the stored rollups, inside the caller's transaction. A stored
    /// value that does not decode is replaced: the tree is rebuilt whole on a version
    /// change, so only damage gets here.
    /// Takes `&self`: sled runs a transaction's closure again after a conflict.
    pub fn write(&self, tree: &TransactionalTree) -> Result<(), UnabortableTransactionError> {
        for (key, delta) in &self.deltas {
            let value = match tree.get(key)?.and_then(|v| Delta::decode(&v, delta)) {
                Some(mut stored) => {
                    stored.merge(delta.clone());
                    stored.encode()
                }
                None => delta.encode(),
            };
            tree.insert(key.as_slice(), value)?;
        }
        Ok(())
    }
}

/// A flag call's answer as one label: the variant, or `true`/`false`.
pub fn exposure_value(response: Option<&Value>) -> String {
    match response {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        None | Some(Value::Null) => "false".into(),
        Some(other) => other.to_string(),
    }
}

/// A survey response's answers as labels: each choice of a multiple choice, else the
/// value.
pub fn answers(v: Option<&Value>) -> Vec<String> {
    match v {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items.iter().flat_map(|i| answers(Some(i))).collect(),
        Some(other) => vec![other.to_string()],
    }
}

/// Whether the rollups answer for every stored event, or are still being built from
/// them (with the backfill's progress, 0-100).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ready,
    Building(u8),
}

pub fn status(meta: &sled::Tree) -> Result<Status, sled::Error> {
    Ok(match backfill::State::load(meta)? {
        None => Status::Ready,
        Some(state) => Status::Building(state.percent),
    })
}

/// Delete every rollup of an hour before `hour` (retention): hours whose events are
/// all deleted.
pub fn forget_before(tree: &sled::Tree, hour: i64) -> Result<u64, sled::Error> {
    let mut deleted = 0u64;
    let mut next_project = Some(0u64);
    while let Some(start) = next_project {
        let Some((key, _)) = tree.get_gt(keys::project(start))? else {
            break;
        };
        let Some(project) = key.get(..8).and_then(|p| p.try_into().ok()) else {
            break;
        };
        let project = u64::from_be_bytes(project);
        let mut old = Vec::new();
        // Each event name's hours, then the hour-first kinds.
        let mut at = prefix(project, EVENTS);
        while let Some((key, _)) = tree.get_gt(&at)? {
            let Some((name, _)) = key.get(9..).and_then(take_text) else {
                break;
            };
            if !key.starts_with(&prefix(project, EVENTS)) {
                break;
            }
            let name_prefix = event_prefix(project, name);
            for entry in
                tree.range(event_key(project, name, i64::MIN)..event_key(project, name, hour))
            {
                old.push(entry?.0);
            }
            at = [name_prefix.as_slice(), &[0xff; 9]].concat();
        }
        for kind in [EXPOSURES, SURVEYS] {
            let range = hour_prefix(project, kind, i64::MIN)..hour_prefix(project, kind, hour);
            for entry in tree.range(range) {
                old.push(entry?.0);
            }
        }
        let mut batch = sled::Batch::default();
        deleted += old.len() as u64;
        for k in old {
            batch.remove(k);
        }
        tree.apply_batch(batch)?;
        next_project = project.checked_add(1);
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests;
