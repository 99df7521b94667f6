//! Applying one log record inside the compactor's transaction: update persons and
//! groups, and shape the event for its block. Every read and write goes through the
//! transaction, so a chunk of records is applied entirely or not at all.
//!
//! An event logged as serde_json writes it (every event capture logs) is edited as text
//! by [`splice`]; any other goes through a `serde_json::Value` here. Both store the same
//! properties.

use serde_json::{Map, Value};
use sled::transaction::{TransactionalTree, UnabortableTransactionError};
use uuid::Uuid;

use super::cache::Cache;
use super::{raw, splice};
use crate::log::Record;
use crate::persons::{self, EventView};
use crate::store::block::Entry;
use crate::store::{keys, Group, MAX_GROUP_TYPES};

type Result<T> = std::result::Result<T, UnabortableTransactionError>;

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
/// uses, looked up once per chunk for all the events from that address, and ready to
/// splice into event text.
#[derive(Debug, Default)]
pub struct Geo {
    pub found: crate::geoip::Properties,
    pub initial: Vec<String>,
    /// Each value of `found` as JSON text.
    pub json: Vec<String>,
    /// `found` as the `$set` and `$set_once` objects enrichment adds, as values and as
    /// text.
    pub objects: [Value; 2],
    pub texts: [String; 2],
    /// Every key starts with `$geoip_` (so its initial name with `$initial_geoip_`):
    /// then text without [`GEO_KEY_STARTS`] holds none of them.
    pub prefixed: bool,
    /// The address as a JSON string, for `$ip`.
    pub ip: Option<String>,
}

/// How the keys of GeoIP properties start in JSON text, in `$set` and `$set_once`.
pub const GEO_KEY_STARTS: [&str; 2] = ["\"$geoip_", "\"$initial_geoip_"];

impl Geo {
    pub fn new(found: crate::geoip::Properties) -> Geo {
        // "$geoip_city_name" becomes "$initial_geoip_city_name".
        let initial: Vec<String> = found
            .iter()
            .map(|(k, _)| match k.strip_prefix('$') {
                Some(rest) => format!("$initial_{rest}"),
                None => k.to_string(),
            })
            .collect();
        let json = found
            .iter()
            .map(|(_, v)| serde_json::to_string(v).unwrap_or_else(|_| "null".into()))
            .collect();
        let set: Map<String, Value> = found
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        let set_once: Map<String, Value> = initial
            .iter()
            .zip(&found)
            .map(|(k, (_, v))| (k.clone(), v.clone()))
            .collect();
        let objects = [Value::Object(set), Value::Object(set_once)];
        let texts = objects
            .each_ref()
            .map(|o| serde_json::to_string(o).unwrap_or_else(|_| "{}".into()));
        let prefixed = found
            .iter()
            .all(|(k, _)| k.starts_with(&GEO_KEY_STARTS[0][1..]));
        Geo {
            found,
            initial,
            json,
            objects,
            texts,
            prefixed,
            ip: None,
        }
    }

    /// The same, for events from `ip`.
    pub fn with_ip(mut self, ip: std::net::IpAddr) -> Geo {
        self.ip = Some(format!("\"{ip}\""));
        self
    }
}

/// Apply one record (already known not to be a duplicate); returns the event to store.
pub fn record(
    tx: &Tx<'_>,
    cache: &mut Cache,
    record: &Record,
    settings: ProjectSettings,
    geo: Option<&Geo>,
) -> Result<Entry> {
    let (person_id, properties) = match raw::Event::parse(&record.data) {
        Some(event) => splice::apply(tx, cache, record, &event, settings, geo)?,
        None => round_trip(tx, cache, record, settings, geo)?,
    };
    Ok(Entry {
        timestamp: record.timestamp,
        created_at: record.received_at,
        uuid: record.uuid,
        person_id,
        event: record.event.clone(),
        distinct_id: record.distinct_id.clone(),
        properties,
    })
}

/// [`record`] for any event JSON: parsed into a `Value`, changed, and written again.
/// Returns the person id and the properties to store.
pub(super) fn round_trip(
    tx: &Tx<'_>,
    cache: &mut Cache,
    record: &Record,
    settings: ProjectSettings,
    geo: Option<&Geo>,
) -> Result<(Option<Uuid>, Vec<u8>)> {
    let project = record.project;
    let mut event: Map<String, Value> = match serde_json::from_slice(&record.data) {
        Ok(Value::Object(obj)) => obj,
        // Capture only logs objects; anything else is stored as an empty event.
        _ => Map::new(),
    };
    if let Some(geo) = geo {
        enrich(&mut event, geo);
    }
    let view = EventView::new(&record.event, &record.distinct_id, record.timestamp, &event);
    let person_id = persons::apply(&mut cache.persons(tx, project), &view)?;

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
        group_identify(
            tx,
            cache,
            project,
            [
                properties.get("$group_type"),
                properties.get("$group_key"),
                properties.get("$group_set"),
            ],
            record.timestamp,
        )?;
    }
    for (k, v) in groups(tx, cache, project, properties.get("$groups"))? {
        properties.insert(k, Value::String(v));
    }
    if let (Some(ip), false) = (record.ip, settings.anonymize_ips) {
        properties
            .entry("$ip")
            .or_insert_with(|| Value::String(ip.to_string()));
    } else if settings.anonymize_ips {
        properties.remove("$ip");
    }
    let properties = serde_json::to_vec(&properties).unwrap_or_else(|_| b"{}".to_vec());
    Ok((person_id, properties))
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

/// The index of a group type, allocating the next free one (up to five).
fn group_type_index(
    tx: &Tx<'_>,
    cache: &mut Cache,
    project: u64,
    name: &str,
) -> Result<Option<u8>> {
    if let Some(index) = cache.group_type(project, name) {
        return Ok(Some(index));
    }
    if let Some(v) = tx
        .group_types
        .get(keys::group_type_by_name(project, name))?
    {
        if let Some(&index) = v.first() {
            cache.set_group_type(project, name, index);
        }
        return Ok(v.first().copied());
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
            cache.added_group_type(project, name, index);
            return Ok(Some(index));
        }
    }
    tracing::debug!(project, "group type limit reached; not adding {name:?}");
    Ok(None)
}

fn scalar_key(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// `$groupidentify` creates the group or updates its properties with `$group_set`;
/// given the `$group_type`, `$group_key` and `$group_set` properties.
pub(super) fn group_identify(
    tx: &Tx<'_>,
    cache: &mut Cache,
    project: u64,
    [kind, key, set]: [Option<&Value>; 3],
    timestamp: i64,
) -> Result<()> {
    let (Some(kind), Some(key)) = (kind.and_then(Value::as_str), scalar_key(key)) else {
        return Ok(());
    };
    let Some(index) = group_type_index(tx, cache, project, kind)? else {
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
    if let Some(Value::Object(set)) = set {
        for (pk, pv) in set {
            group.properties.insert(pk.clone(), pv.clone());
        }
    }
    group.created_at = group.created_at.min(timestamp);
    tx.groups
        .insert(k, serde_json::to_vec(&group).unwrap_or_default())?;
    cache.wrote_group(project, index, &key);
    Ok(())
}

/// `$groups: {type: key}` attaches the event to groups: the `$group_<index>`
/// properties to set, with their keys. It names group types (as PostHog does) but
/// never creates a group.
pub(super) fn groups(
    tx: &Tx<'_>,
    cache: &mut Cache,
    project: u64,
    groups: Option<&Value>,
) -> Result<Vec<(String, String)>> {
    let Some(Value::Object(groups)) = groups else {
        return Ok(Vec::new());
    };
    let mut attached = Vec::new();
    for (kind, key) in groups {
        if let (Some(key), Some(index)) = (
            scalar_key(Some(key)),
            group_type_index(tx, cache, project, kind)?,
        ) {
            attached.push((format!("$group_{index}"), key));
        }
    }
    Ok(attached)
}

#[cfg(test)]
#[path = "apply_tests.rs"]
pub(super) mod tests;
