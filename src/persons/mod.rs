//! Persons: which distinct ids belong to one person, and that person's properties.
//!
//! The rules are PostHog's: `$set`, `$set_once` and `$unset` on any event (inside
//! `properties` or at the top level); `$identify` with `$anon_distinct_id` links the
//! anonymous id to the identified one; `$create_alias` merges the event's distinct id
//! into the person of `alias`; two existing persons merge into one. The logic runs
//! against the small [`Store`] trait, so the compactor applies it inside a storage
//! transaction and the tests apply it to a map.
//!
//! A new person's id is not random: it is PostHog's UUIDv5 of `"{project}:{distinct
//! id}"` ([`id_for`]), so nodes that never talk to each other give a distinct id they
//! both see the same person id. Ids stored before (UUIDv7) stay as they are: a person
//! is found through its distinct ids, never by recomputing its id.

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

/// PostHog's namespace for person ids (`PERSON_UUIDV5_NAMESPACE` in its ingestion and
/// in `posthog/models/person/util.py`); the same one makes the same ids as PostHog.
const PERSON_NAMESPACE: Uuid = uuid::uuid!("932979b4-65c3-4424-8467-0b66ec27bc22");

/// The id of a person created for `distinct_id` in `project`: UUIDv5 of
/// `"{project}:{distinct_id}"`, PostHog's `uuidFromDistinctId(team_id, distinct_id)`.
pub fn id_for(project: u64, distinct_id: &str) -> Uuid {
    Uuid::new_v5(
        &PERSON_NAMESPACE,
        format!("{project}:{distinct_id}").as_bytes(),
    )
}

/// Where one project's persons live. Implemented by the compactor's transaction and by a
/// map in tests.
pub trait Store {
    type Error;
    /// The project, which a new person's id derives from ([`id_for`]).
    fn project(&self) -> u64;
    fn person_of(&mut self, distinct_id: &str) -> Result<Option<Uuid>, Self::Error>;
    fn link(&mut self, distinct_id: &str, person: Uuid) -> Result<(), Self::Error>;
    fn load(&mut self, id: Uuid) -> Result<Option<Person>, Self::Error>;
    fn save(&mut self, person: &Person) -> Result<(), Self::Error>;
    fn delete(&mut self, id: Uuid) -> Result<(), Self::Error>;

    /// Change a person where it is; `change` says whether it changed anything, and
    /// only then is the person saved. False if there is no such person. A store that
    /// keeps persons decoded overrides this to avoid a copy per event.
    fn update(
        &mut self,
        id: Uuid,
        change: &mut dyn FnMut(&mut Person) -> bool,
    ) -> Result<bool, Self::Error> {
        let Some(mut person) = self.load(id)? else {
            return Ok(false);
        };
        if change(&mut person) {
            self.save(&person)?;
        }
        Ok(true)
    }
}

/// What of an event matters to persons: each operation from `properties` and from the
/// top level of the event, applied in that order. `$set` and `$set_once` have a source
/// between the two: additions to the properties' own (GeoIP's, which the compactor
/// keeps apart so it need not copy them into each event's map), applied as if appended
/// to it; they must not repeat its keys.
#[derive(Debug, Clone, Copy)]
pub struct EventView<'a> {
    pub name: &'a str,
    pub distinct_id: &'a str,
    /// Unix milliseconds.
    pub timestamp: i64,
    /// False when `$process_person_profile` is `false`.
    pub processes_person: bool,
    /// The `$anon_distinct_id` and `alias` properties.
    pub anon_distinct_id: Option<&'a Value>,
    pub alias: Option<&'a Value>,
    pub set_once: [Option<&'a Value>; 3],
    pub set: [Option<&'a Value>; 3],
    pub unset: [Option<&'a Value>; 2],
}

impl<'a> EventView<'a> {
    /// The view of a whole event object as sent.
    pub fn new(
        name: &'a str,
        distinct_id: &'a str,
        timestamp: i64,
        event: &'a Map<String, Value>,
    ) -> EventView<'a> {
        let properties = event.get("properties").and_then(Value::as_object);
        let property = |key: &str| properties.and_then(|p| p.get(key));
        let both = |key: &str| [property(key), event.get(key)];
        let three = |key: &str| [property(key), None, event.get(key)];
        EventView {
            name,
            distinct_id,
            timestamp,
            processes_person: property("$process_person_profile") != Some(&Value::Bool(false)),
            anon_distinct_id: property("$anon_distinct_id"),
            alias: property("alias"),
            set_once: three("$set_once"),
            set: three("$set"),
            unset: both("$unset"),
        }
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
    if !event.processes_person {
        return Ok(None);
    }
    let identify = event.name == "$identify";
    match event.name {
        "$identify" => {
            if let Some(anon) = id_property(event.anon_distinct_id) {
                if anon != event.distinct_id {
                    merge::link(
                        store,
                        &anon,
                        event.distinct_id,
                        merge::Mode::Identify,
                        event,
                    )?;
                }
            }
        }
        "$create_alias" => {
            if let Some(alias) = id_property(event.alias) {
                if alias != event.distinct_id {
                    merge::link(store, event.distinct_id, &alias, merge::Mode::Alias, event)?;
                }
            }
        }
        "$merge_dangerously" => {
            if let Some(other) = id_property(event.alias) {
                if other != event.distinct_id {
                    merge::link(store, &other, event.distinct_id, merge::Mode::Alias, event)?;
                }
            }
        }
        _ => {}
    }
    let mut change = |person: &mut Person| {
        let mut changed = update_properties(&mut person.properties, event);
        if identify && !person.is_identified {
            person.is_identified = true;
            changed = true;
        }
        changed
    };
    if let Some(id) = store.person_of(event.distinct_id)? {
        if store.update(id, &mut change)? {
            return Ok(Some(id));
        }
    }
    let id = merge::create(
        store,
        &[event.distinct_id],
        event.distinct_id,
        event.timestamp,
    )?
    .id;
    store.update(id, &mut change)?;
    Ok(Some(id))
}

/// `$set_once` fills only missing keys, `$set` overwrites, `$unset` removes. Returns
/// whether the properties changed, so an event that changes nothing writes nothing.
fn update_properties<'a>(props: &mut Map<String, Value>, event: &EventView<'a>) -> bool {
    let objects =
        |ops: [Option<&'a Value>; 3]| ops.into_iter().flatten().filter_map(Value::as_object);
    let mut changed = false;
    for set_once in objects(event.set_once) {
        for (k, v) in set_once {
            if !props.contains_key(k) {
                props.insert(k.clone(), v.clone());
                changed = true;
            }
        }
    }
    for set in objects(event.set) {
        for (k, v) in set {
            match props.get_mut(k) {
                Some(old) if old == v => {}
                Some(old) => {
                    *old = v.clone();
                    changed = true;
                }
                None => {
                    props.insert(k.clone(), v.clone());
                    changed = true;
                }
            }
        }
    }
    for unset in event.unset.into_iter().flatten() {
        match unset {
            Value::Array(keys) => {
                for k in keys.iter().filter_map(Value::as_str) {
                    changed |= props.remove(k).is_some();
                }
            }
            Value::Object(keys) => {
                for k in keys.keys() {
                    changed |= props.remove(k).is_some();
                }
            }
            _ => {}
        }
    }
    changed
}
