//! Applying one log record inside the compactor's transaction: update persons and
//! groups, and shape the event for its block. Every read and write goes through the
//! transaction, so a chunk of records is applied entirely or not at all.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};
use sled::transaction::{TransactionalTree, UnabortableTransactionError};
use uuid::Uuid;

use super::block::Entry;
use super::{keys, Record};
use crate::persons::{self, EventView, Person};

type Result<T> = std::result::Result<T, UnabortableTransactionError>;

/// PostHog's limit: five group types per project, indexes 0-4.
pub const MAX_GROUP_TYPES: u8 = 5;

/// The trees a record touches.
pub struct Tx<'a> {
    pub persons: &'a TransactionalTree,
    pub distinct_ids: &'a TransactionalTree,
    pub groups: &'a TransactionalTree,
    pub group_types: &'a TransactionalTree,
}

/// What the project asks of enrichment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProjectSettings {
    pub anonymize_ips: bool,
}

/// The GeoIP properties of one address, with the `$initial_geoip_*` names `$set_once`
/// uses, looked up once per chunk for all the events from that address.
#[derive(Debug, Default)]
pub struct Geo {
    found: crate::geoip::Properties,
    initial: Vec<String>,
}

impl Geo {
    pub fn new(found: crate::geoip::Properties) -> Geo {
        // "$geoip_city_name" becomes "$initial_geoip_city_name".
        let initial = found
            .iter()
            .map(|(k, _)| match k.strip_prefix('$') {
                Some(rest) => format!("$initial_{rest}"),
                None => k.to_string(),
            })
            .collect();
        Geo { found, initial }
    }
}

/// Apply one record (already known not to be a duplicate); returns the event to store.
pub fn record(
    tx: &Tx<'_>,
    cache: &mut PersonCache,
    record: &Record,
    settings: ProjectSettings,
    geo: Option<&Geo>,
) -> Result<Entry> {
    let project = record.project;
    let mut event: Map<String, Value> = match serde_json::from_slice(&record.data) {
        Ok(Value::Object(obj)) => obj,
        // Capture only logs objects; anything else is stored as an empty event.
        _ => Map::new(),
    };
    if let Some(geo) = geo {
        enrich(&mut event, geo);
    }
    let view = EventView {
        name: &record.event,
        distinct_id: &record.distinct_id,
        timestamp: record.timestamp,
        event: &event,
    };
    let person_id = persons::apply(&mut TxPersons { tx, project, cache }, &view)?;

    let mut properties = match event.remove("properties") {
        Some(Value::Object(p)) => p,
        _ => Map::new(),
    };
    // Top-level person operations are kept with the event, as properties.
    for op in ["$set", "$set_once", "$unset"] {
        if let Some(v) = event.remove(op) {
            properties.entry(op).or_insert(v);
        }
    }
    if record.event == "$groupidentify" {
        group_identify(tx, project, &properties, record.timestamp)?;
    }
    attach_groups(tx, project, &mut properties)?;
    if let (Some(ip), false) = (record.ip, settings.anonymize_ips) {
        properties
            .entry("$ip")
            .or_insert_with(|| Value::String(ip.to_string()));
    } else if settings.anonymize_ips {
        properties.remove("$ip");
    }
    Ok(Entry {
        timestamp: record.timestamp,
        created_at: record.received_at,
        uuid: record.uuid,
        person_id,
        event: record.event.clone(),
        distinct_id: record.distinct_id.clone(),
        properties: serde_json::to_vec(&properties).unwrap_or_else(|_| b"{}".to_vec()),
    })
}

/// Add the GeoIP properties of the client address to the event, and to its person:
/// the latest location with `$set`, the first with `$set_once` as `$initial_geoip_*`.
/// Values the client sent itself are kept; `$geoip_disable: true` skips it all.
fn enrich(event: &mut Map<String, Value>, geo: &Geo) {
    let found = &geo.found;
    if found.is_empty() {
        return;
    }
    let props = match event
        .entry("properties")
        .or_insert_with(|| Value::Object(Map::new()))
    {
        Value::Object(p) => p,
        _ => return,
    };
    if props.get("$geoip_disable") == Some(&Value::Bool(true)) {
        return;
    }
    for (k, v) in found {
        props.entry(*k).or_insert_with(|| v.clone());
    }
    for (op, initial) in [("$set", false), ("$set_once", true)] {
        if let Value::Object(target) = props.entry(op).or_insert_with(|| Value::Object(Map::new()))
        {
            for (i, (k, v)) in found.iter().enumerate() {
                let key = if initial { &geo.initial[i] } else { *k };
                if !target.contains_key(key) {
                    target.insert(key.to_string(), v.clone());
                }
            }
        }
    }
}

/// The index of a group type, allocating the next free one (up to five) if asked.
pub fn group_type_index(tx: &Tx<'_>, project: u64, name: &str, create: bool) -> Result<Option<u8>> {
    if let Some(v) = tx
        .group_types
        .get(keys::group_type_by_name(project, name))?
    {
        return Ok(v.first().copied());
    }
    if !create {
        return Ok(None);
    }
    for index in 0..MAX_GROUP_TYPES {
        if tx
            .group_types
            .get(keys::group_type_by_index(project, index))?
            .is_none()
        {
            tx.group_types
                .insert(keys::group_type_by_name(project, name), &[index][..])?;
            tx.group_types.insert(
                &keys::group_type_by_index(project, index)[..],
                name.as_bytes(),
            )?;
            return Ok(Some(index));
        }
    }
    tracing::debug!(project, "group type limit reached; not adding {name:?}");
    Ok(None)
}

/// A group's stored record.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Group {
    pub group_type_index: u8,
    pub group_key: String,
    pub properties: Map<String, Value>,
    pub created_at: i64,
}

fn scalar_key(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// `$groupidentify` creates the group or updates its properties with `$group_set`.
fn group_identify(
    tx: &Tx<'_>,
    project: u64,
    properties: &Map<String, Value>,
    timestamp: i64,
) -> Result<()> {
    let (Some(kind), Some(key)) = (
        properties.get("$group_type").and_then(Value::as_str),
        scalar_key(properties.get("$group_key")),
    ) else {
        return Ok(());
    };
    let Some(index) = group_type_index(tx, project, kind, true)? else {
        return Ok(());
    };
    let k = keys::group(project, index, &key);
    let mut group = match tx.groups.get(&k)? {
        Some(bytes) => serde_json::from_slice(&bytes).ok(),
        None => None,
    }
    .unwrap_or_else(|| Group {
        group_type_index: index,
        group_key: key.clone(),
        properties: Map::new(),
        created_at: timestamp,
    });
    if let Some(Value::Object(set)) = properties.get("$group_set") {
        for (pk, pv) in set {
            group.properties.insert(pk.clone(), pv.clone());
        }
    }
    group.created_at = group.created_at.min(timestamp);
    tx.groups
        .insert(k, serde_json::to_vec(&group).unwrap_or_default())?;
    Ok(())
}

/// `$groups: {type: key}` attaches the event to groups as `$group_<index>`. It names
/// group types (as PostHog does) but never creates a group.
fn attach_groups(tx: &Tx<'_>, project: u64, properties: &mut Map<String, Value>) -> Result<()> {
    let Some(Value::Object(groups)) = properties.get("$groups") else {
        return Ok(());
    };
    let mut attached = Vec::new();
    for (kind, key) in groups {
        if let (Some(key), Some(index)) = (
            scalar_key(Some(key)),
            group_type_index(tx, project, kind, true)?,
        ) {
            attached.push((format!("$group_{index}"), Value::String(key)));
        }
    }
    for (k, v) in attached {
        properties.insert(k, v);
    }
    Ok(())
}

/// The persons a chunk touches, kept decoded for the whole chunk: a batch is often one
/// user's events, and each would otherwise parse and re-encode the same person. Changed
/// persons are written to the transaction once, by [`PersonCache::write`].
#[derive(Default)]
pub struct PersonCache {
    /// (project, distinct id) -> person, as read or linked during this chunk.
    ids: HashMap<(u64, String), Option<Uuid>>,
    /// (project, person) -> the person, or None once deleted by a merge.
    persons: HashMap<(u64, Uuid), Option<Person>>,
    dirty: HashSet<(u64, Uuid)>,
}

impl PersonCache {
    /// Write every person changed during the chunk into the transaction.
    pub fn write(&self, tx: &Tx<'_>) -> Result<()> {
        for key @ (project, id) in &self.dirty {
            let k = keys::with_uuid(*project, *id);
            match self.persons.get(key) {
                Some(Some(person)) => {
                    tx.persons
                        .insert(&k[..], serde_json::to_vec(person).unwrap_or_default())?;
                }
                _ => {
                    tx.persons.remove(&k[..])?;
                }
            }
        }
        Ok(())
    }
}

/// Persons of one project, read through the chunk's cache and the transaction.
struct TxPersons<'a, 'b> {
    tx: &'a Tx<'b>,
    project: u64,
    cache: &'a mut PersonCache,
}

impl persons::Store for TxPersons<'_, '_> {
    type Error = UnabortableTransactionError;

    fn person_of(&mut self, distinct_id: &str) -> Result<Option<Uuid>> {
        let key = (self.project, distinct_id.to_string());
        if let Some(found) = self.cache.ids.get(&key) {
            return Ok(*found);
        }
        let found = self
            .tx
            .distinct_ids
            .get(keys::with_str(self.project, distinct_id))?
            .and_then(|b| Uuid::from_slice(&b).ok());
        self.cache.ids.insert(key, found);
        Ok(found)
    }

    fn link(&mut self, distinct_id: &str, person: Uuid) -> Result<()> {
        self.tx.distinct_ids.insert(
            keys::with_str(self.project, distinct_id),
            &person.as_bytes()[..],
        )?;
        self.cache
            .ids
            .insert((self.project, distinct_id.to_string()), Some(person));
        Ok(())
    }

    fn load(&mut self, id: Uuid) -> Result<Option<Person>> {
        let key = (self.project, id);
        if let Some(found) = self.cache.persons.get(&key) {
            return Ok(found.clone());
        }
        let found: Option<Person> = self
            .tx
            .persons
            .get(keys::with_uuid(self.project, id))?
            .and_then(|b| serde_json::from_slice(&b).ok());
        self.cache.persons.insert(key, found.clone());
        Ok(found)
    }

    fn save(&mut self, person: &Person) -> Result<()> {
        let key = (self.project, person.id);
        self.cache.persons.insert(key, Some(person.clone()));
        self.cache.dirty.insert(key);
        Ok(())
    }

    fn delete(&mut self, id: Uuid) -> Result<()> {
        let key = (self.project, id);
        self.cache.persons.insert(key, None);
        self.cache.dirty.insert(key);
        Ok(())
    }
}
