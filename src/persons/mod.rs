//! Persons: which distinct ids belong to one person, and that person's properties.
//!
//! The rules are PostHog's: `$set`, `$set_once` and `$unset` on any event (inside
//! `properties` or at the top level); `$identify` with `$anon_distinct_id` links the
//! anonymous id to the identified one; `$create_alias` merges the event's distinct id
//! into the person of `alias`; two existing persons merge into one. The logic runs
//! against the small [`Store`] trait, so the compactor applies it inside a storage
//! transaction and the tests apply it to a map.

mod merge;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::capture::clean_distinct_id;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Person {
    pub id: Uuid,
    /// Unix milliseconds of the first event that created it.
    pub created_at: i64,
    pub properties: Map<String, Value>,
    pub distinct_ids: Vec<String>,
    /// Set by `$identify`; an identified person is never merged away by another
    /// `$identify` (two real users must not become one).
    pub is_identified: bool,
    /// The distinct id the person was first seen with. Flags with
    /// `ensure_experience_continuity` bucket by it, so a user keeps their variant
    /// after logging in.
    pub first_distinct_id: String,
}

/// Where persons live. Implemented by the compactor's transaction and by a map in tests.
pub trait Store {
    type Error;
    fn person_of(&mut self, distinct_id: &str) -> Result<Option<Uuid>, Self::Error>;
    fn link(&mut self, distinct_id: &str, person: Uuid) -> Result<(), Self::Error>;
    fn load(&mut self, id: Uuid) -> Result<Option<Person>, Self::Error>;
    fn save(&mut self, person: &Person) -> Result<(), Self::Error>;
    fn delete(&mut self, id: Uuid) -> Result<(), Self::Error>;
}

/// What of an event matters to persons.
pub struct EventView<'a> {
    pub name: &'a str,
    pub distinct_id: &'a str,
    /// Unix milliseconds.
    pub timestamp: i64,
    /// The whole event object as sent (for top-level `$set` and friends).
    pub event: &'a Map<String, Value>,
}

impl EventView<'_> {
    fn properties(&self) -> Option<&Map<String, Value>> {
        self.event.get("properties").and_then(Value::as_object)
    }

    fn property(&self, key: &str) -> Option<&Value> {
        self.properties().and_then(|p| p.get(key))
    }

    /// `$set` (or another operation) from properties and from the top level; the
    /// top level wins where both set a key.
    fn operation(&self, key: &str) -> Vec<&Map<String, Value>> {
        [self.property(key), self.event.get(key)]
            .into_iter()
            .flatten()
            .filter_map(Value::as_object)
            .collect()
    }

    /// Whether this event should create or update a person at all.
    pub fn processes_person(&self) -> bool {
        self.property("$process_person_profile") != Some(&Value::Bool(false))
    }
}

/// A distinct id given as a property: a string or a number, cleaned like the event's.
fn id_property(v: Option<&Value>) -> Option<String> {
    let id = match v? {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    (!id.is_empty()).then(|| clean_distinct_id(&id))
}

/// Apply an event to persons; returns the id of the person it belongs to.
/// Events with `$process_person_profile: false` touch nothing and belong to no one.
pub fn apply<S: Store>(store: &mut S, event: &EventView<'_>) -> Result<Option<Uuid>, S::Error> {
    if !event.processes_person() {
        return Ok(None);
    }
    let identify = event.name == "$identify";
    match event.name {
        "$identify" => {
            if let Some(anon) = id_property(event.property("$anon_distinct_id")) {
                if anon != event.distinct_id {
                    merge::link(
                        store,
                        &anon,
                        event.distinct_id,
                        merge::Mode::Identify,
                        event.timestamp,
                    )?;
                }
            }
        }
        "$create_alias" => {
            if let Some(alias) = id_property(event.property("alias")) {
                if alias != event.distinct_id {
                    merge::link(
                        store,
                        event.distinct_id,
                        &alias,
                        merge::Mode::Alias,
                        event.timestamp,
                    )?;
                }
            }
        }
        "$merge_dangerously" => {
            if let Some(other) = id_property(event.property("alias")) {
                if other != event.distinct_id {
                    merge::link(
                        store,
                        &other,
                        event.distinct_id,
                        merge::Mode::Alias,
                        event.timestamp,
                    )?;
                }
            }
        }
        _ => {}
    }
    let mut person = match store.person_of(event.distinct_id)? {
        Some(id) => match store.load(id)? {
            Some(p) => p,
            None => merge::create(store, &[event.distinct_id], event.timestamp)?,
        },
        None => merge::create(store, &[event.distinct_id], event.timestamp)?,
    };
    let before = person.clone();
    update_properties(&mut person.properties, event);
    if identify {
        person.is_identified = true;
    }
    if person != before {
        store.save(&person)?;
    }
    Ok(Some(person.id))
}

/// `$set_once` fills only missing keys, `$set` overwrites, `$unset` removes.
fn update_properties(props: &mut Map<String, Value>, event: &EventView<'_>) {
    for set_once in event.operation("$set_once") {
        for (k, v) in set_once {
            if !props.contains_key(k) {
                props.insert(k.clone(), v.clone());
            }
        }
    }
    for set in event.operation("$set") {
        for (k, v) in set {
            props.insert(k.clone(), v.clone());
        }
    }
    for unset in [event.property("$unset"), event.event.get("$unset")]
        .into_iter()
        .flatten()
    {
        match unset {
            Value::Array(keys) => {
                for k in keys.iter().filter_map(Value::as_str) {
                    props.remove(k);
                }
            }
            Value::Object(keys) => {
                for k in keys.keys() {
                    props.remove(k);
                }
            }
            _ => {}
        }
    }
}
