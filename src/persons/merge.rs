//! Linking two distinct ids and merging two persons.

use super::{EventView, Person, Store};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `$identify`: an already identified person is never merged into another.
    Identify,
    /// `$create_alias` and `$merge_dangerously`: the caller asked for it explicitly.
    Alias,
}

/// A new person holding `ids`; the first id is the one it was first seen with. Its id
/// derives from `named_by` (one of `ids`), so every node creating it agrees.
pub fn create<S: Store>(
    store: &mut S,
    ids: &[&str],
    named_by: &str,
    timestamp: i64,
) -> Result<Person, S::Error> {
    let person = Person {
        id: super::id_for(store.project(), named_by),
        created_at: timestamp,
        properties: Default::default(),
        distinct_ids: ids.iter().map(|s| s.to_string()).collect(),
        is_identified: false,
        first_distinct_id: ids.first().map_or_else(String::new, |s| s.to_string()),
    };
    for id in ids {
        store.link(id, person.id)?;
    }
    store.save(&person)?;
    Ok(person)
}

/// Make `src` and `dst` one person, the person of `dst` surviving a merge. `event` is
/// the `$identify`, `$create_alias` or `$merge_dangerously` asking for it.
pub fn link<S: Store>(
    store: &mut S,
    src: &str,
    dst: &str,
    mode: Mode,
    event: &EventView<'_>,
) -> Result<(), S::Error> {
    let src_person = load_of(store, src)?;
    let dst_person = load_of(store, dst)?;
    match (src_person, dst_person) {
        (None, None) => {
            // The source was the id seen first (the anonymous one, or the id being
            // aliased). The id is named after the event's distinct id, as PostHog names
            // a person created by a merge of two unseen ids (`mergeIntoDistinctId`).
            create(store, &[src, dst], event.distinct_id, event.timestamp)?;
        }
        (Some(mut p), None) => add_id(store, &mut p, dst)?,
        (None, Some(mut p)) => add_id(store, &mut p, src)?,
        (Some(s), Some(d)) if s.id == d.id => {}
        (Some(s), Some(_)) if mode == Mode::Identify && s.is_identified => {
            tracing::debug!(
                "not merging two identified persons on $identify; use $create_alias to merge them"
            );
        }
        (Some(s), Some(d)) => merge(store, s, d)?,
    }
    Ok(())
}

fn load_of<S: Store>(store: &mut S, distinct_id: &str) -> Result<Option<Person>, S::Error> {
    match store.person_of(distinct_id)? {
        Some(id) => store.load(id),
        None => Ok(None),
    }
}

fn add_id<S: Store>(store: &mut S, person: &mut Person, id: &str) -> Result<(), S::Error> {
    person.distinct_ids.push(id.to_string());
    store.link(id, person.id)?;
    store.save(person)
}

/// Merge `src` into `dst`: `dst`'s values win, `src` fills the keys `dst` lacks, the
/// older person's creation time and first distinct id are kept, and every id of
/// `src` now points at `dst`.
fn merge<S: Store>(store: &mut S, src: Person, mut dst: Person) -> Result<(), S::Error> {
    for (k, v) in src.properties {
        dst.properties.entry(k).or_insert(v);
    }
    if src.created_at < dst.created_at {
        dst.created_at = src.created_at;
        dst.first_distinct_id = src.first_distinct_id;
    }
    dst.is_identified |= src.is_identified;
    for id in src.distinct_ids {
        store.link(&id, dst.id)?;
        if !dst.distinct_ids.contains(&id) {
            dst.distinct_ids.push(id);
        }
    }
    store.delete(src.id)?;
    store.save(&dst)
}
