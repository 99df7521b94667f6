//! Applying one log record inside the compactor's transaction: update persons and
//! groups, and shape the event for its block. Every read and write goes through the
//! transaction, so a chunk of records is applied entirely or not at all.
//!
//! An event logged as serde_json writes it (every event capture logs) is edited as text
//! by [`splice`]; any other goes through a `serde_json::Value` here. Both store the same
//! properties.

use serde_json::{Map, Value};
use sled::transaction::UnabortableTransactionError;
use uuid::Uuid;

use super::cache::{Cache, Tx};
use super::enrich::{Geo, ProjectSettings};
use super::groups::{group_identify, groups};
use super::{raw, splice};
use crate::log::Record;
use crate::persons::{self, EventView};
use crate::store::block::Entry;

type Result<T> = std::result::Result<T, UnabortableTransactionError>;

/// Apply one record (already known not to be a duplicate); returns the event to store.
pub fn record<'a>(
    tx: &Tx<'_>,
    cache: &mut Cache,
    record: &'a Record,
    settings: ProjectSettings,
    geo: Option<&'a Geo>,
    scratch: &mut splice::Scratch<'a>,
) -> Result<Entry> {
    let (person_id, properties) = match raw::Event::parse(&record.data) {
        Some(event) => splice::apply(tx, cache, record, &event, settings, geo, scratch)?,
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

#[cfg(test)]
#[path = "tests/apply.rs"]
pub(super) mod tests;
