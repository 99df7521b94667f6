//! PostHog's `properties` parameter of the events API
//! (`?properties=[{"key":"$browser","value":"Chrome","operator":"exact","type":"event"}]`):
//! filters every event listed must pass, read in the shapes PostHog's
//! `posthog/models/property/parse.py` reads, each one tested by the console's
//! [`Matcher`], so their operators and their coercion of numbers and booleans are the
//! flags'. Event filters test each block's column of the property ([`ColumnTest`]), and
//! one that needs its key narrows the read to the blocks the event index names for it;
//! person filters test the current properties of each event's person, read once a
//! distinct id a request.
//!
//! The shapes: a list of filters (`type` is `event` unless given, `operator` `exact`);
//! an `AND` group `{"type":"AND","values":[...]}`, nested groups flattened; the old
//! object `{"$browser":"Chrome","n__gt":3}` (the operator after `__`). What PostHog
//! would drop without a word, matching more than was asked (a filter it cannot read, a
//! type other than `event` and `person`), or cannot answer (an `OR` of several), is
//! refused here with a 400 naming `properties`, as is an unknown operator or a regex
//! that does not compile.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::matching::{ColumnTest, Matcher};
use super::params::Params;
use crate::store::block::Rows;
use crate::store::live::Open;
use crate::store::query::{self, BlockTest};
use crate::store::{keys, person_bytes, person_probe};

/// Distinct ids whose answer a read remembers at most: a person's events share one or
/// a few, and the memory stays bounded when a read meets many.
const PERSONS_MEMO: usize = 4096;

/// What PostHog's API says of `properties` that is not JSON.
const UNPARSABLE: &str = "Properties are unparsable!";

/// The filters of a request, all of which an event must pass.
#[derive(Default)]
pub struct Filters {
    event: Vec<Matcher>,
    person: Vec<Matcher>,
}

/// A 400 about `properties`.
fn refused(detail: impl Into<String>) -> ApiError {
    ApiError::BadParam("properties", detail.into())
}

impl Filters {
    /// `?properties=`: None when absent, empty or an empty list.
    pub fn from_params(params: &Params) -> Result<Option<Filters>, ApiError> {
        let Some(text) = params.get("properties") else {
            return Ok(None);
        };
        let value: Value = serde_json::from_str(text).map_err(|_| refused(UNPARSABLE))?;
        let mut found = Vec::new();
        flatten(value, &mut found)?;
        let mut filters = Filters::default();
        for (i, filter) in found.into_iter().enumerate() {
            let at = |detail: String| refused(format!("properties[{i}]: {detail}"));
            let (person, filter) = normalize(filter).map_err(at)?;
            let matcher = Matcher::new(filter, None).map_err(|e| match e {
                ApiError::BadQuery(detail) => at(detail),
                other => other,
            })?;
            if person {
                filters.person.push(matcher);
            } else {
                filters.event.push(matcher);
            }
        }
        Ok((!filters.is_empty()).then_some(filters))
    }

    fn is_empty(&self) -> bool {
        self.event.is_empty() && self.person.is_empty()
    }

    /// These and an event filter more (the console's `property`).
    pub fn and(mut self, event: Matcher) -> Filters {
        self.event.push(event);
        self
    }

    /// The test of a read of `project`'s events in `open`.
    pub fn test(self, open: Arc<Open>, project: u64) -> Box<dyn BlockTest> {
        let persons = (!self.person.is_empty()).then(|| PersonTest {
            matchers: self.person,
            open,
            project,
            known: HashMap::new(),
        });
        Box::new(AllOf {
            columns: self.event.into_iter().map(ColumnTest::new).collect(),
            persons,
        })
    }
}

/// The filters of `properties` parsed as JSON, in order, groups flattened.
fn flatten(value: Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    match value {
        Value::Null => Ok(()),
        Value::Array(filters) => {
            out.extend(filters);
            Ok(())
        }
        Value::Object(group) if is_group(&group) => flatten_group(group, out),
        // The old form: key (and `__operator`) to value, all of events.
        Value::Object(old) => {
            for (key, value) in old {
                let (key, operator) = key.split_once("__").unwrap_or((&key, "exact"));
                let operator = operator.split("__").next().unwrap_or(operator);
                out.push(json!({"key": key, "operator": operator, "value": value}));
            }
            Ok(())
        }
        _ => Err(refused(
            "Properties must be a list of filters, a group of them or an object",
        )),
    }
}

/// A group `{"type": "AND"|"OR", "values": [...]}`: its filters and those of the groups
/// in it. An `OR` of more than one is refused: the read tests conjunctions only.
fn flatten_group(mut group: Map<String, Value>, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let kind = (group.get("type").and_then(Value::as_str)).map(str::to_uppercase);
    let Some(Value::Array(values)) = group.remove("values") else {
        return Err(refused(
            "PropertyGroup is unparsable: values must be a list",
        ));
    };
    match kind.as_deref() {
        Some("AND") => {}
        Some("OR") if values.len() <= 1 => {}
        Some("OR") => {
            return Err(refused(
                "an OR group of several filters is not supported: ask once for each",
            ))
        }
        _ => {
            return Err(refused(
                "PropertyGroup is unparsable: type must be AND or OR",
            ))
        }
    }
    for value in values {
        match value {
            Value::Object(inner) if is_group(&inner) => flatten_group(inner, out)?,
            filter => out.push(filter),
        }
    }
    Ok(())
}

fn is_group(object: &Map<String, Value>) -> bool {
    object.contains_key("type") && object.contains_key("values")
}

/// A filter as PostHog's `Property` takes it, made the person filter a [`Matcher`]
/// compiles, and whether it tests the person's properties (else the event's).
fn normalize(filter: Value) -> Result<(bool, Value), String> {
    let Value::Object(filter) = filter else {
        return Err("a filter must be an object with key, value and operator".into());
    };
    let key = match filter.get("key") {
        Some(Value::String(key)) => key.clone(),
        _ => return Err("key must be a property name".into()),
    };
    let person = match filter.get("type") {
        None | Some(Value::Null) => false,
        Some(Value::String(t)) if t == "event" => false,
        Some(Value::String(t)) if t == "person" => true,
        Some(other) => {
            return Err(format!(
                "filters of type {other} are not supported: only \"event\" and \"person\""
            ))
        }
    };
    let operator = match filter.get("operator") {
        None | Some(Value::Null) => "exact",
        Some(Value::String(op)) => op,
        Some(_) => return Err("operator must be a string".into()),
    };
    let value = match (filter.get("value"), operator) {
        (None | Some(Value::Null), "is_set" | "is_not_set") => Value::from(operator),
        (None | Some(Value::Null), _) => {
            return Err(format!("value is required for operator {operator:?}"))
        }
        (Some(value), _) => value.clone(),
    };
    Ok((
        person,
        json!({"key": key, "operator": operator, "value": value, "type": "person"}),
    ))
}

/// Every event filter on the block's columns, then the person filters.
struct AllOf {
    columns: Vec<ColumnTest>,
    persons: Option<PersonTest>,
}

impl BlockTest for AllOf {
    /// The first key an event filter needs: every event passing has it.
    fn key(&self) -> Option<String> {
        self.columns.iter().find_map(BlockTest::key)
    }

    fn keep(&mut self, rows: &Rows, left: &mut Vec<u32>) -> Result<(), sled::Error> {
        for column in &mut self.columns {
            if left.is_empty() {
                return Ok(());
            }
            column.keep(rows, left)?;
        }
        match &mut self.persons {
            Some(persons) if !left.is_empty() => persons.keep(rows, left),
            _ => Ok(()),
        }
    }
}

/// Person filters on the current properties of the person of each event's distinct
/// id (none: no properties), each distinct id's answer remembered for the read.
/// A person is read from the runs (a random block read each), so a page costs about
/// a person read for each distinct id among the events it tests.
struct PersonTest {
    matchers: Vec<Matcher>,
    open: Arc<Open>,
    project: u64,
    known: HashMap<String, bool>,
}

impl PersonTest {
    fn passes(&mut self, distinct_id: &str) -> Result<bool, sled::Error> {
        if let Some(&known) = self.known.get(distinct_id) {
            return Ok(known);
        }
        let trees = &self.open.trees;
        let person = query::person_id_of(trees, self.project, distinct_id)?;
        // Read as the console's searches of persons read them: bytes kept between
        // requests, and only the properties tested taken out.
        let bytes = person.and_then(|id| {
            let key = keys::with_uuid(self.project, id);
            person_bytes::global().get(&trees.persons, &key)
        });
        let tested: Vec<&str> = self.matchers.iter().map(Matcher::key).collect();
        let probe = bytes.and_then(|b| person_probe::probe(&b, &tested));
        let properties = probe.map(|p| p.properties).unwrap_or_default();
        let passes = (self.matchers.iter()).all(|m| m.matches(distinct_id, &properties));
        if self.known.len() >= PERSONS_MEMO {
            self.known.clear();
        }
        self.known.insert(distinct_id.to_owned(), passes);
        Ok(passes)
    }

    fn keep(&mut self, rows: &Rows, left: &mut Vec<u32>) -> Result<(), sled::Error> {
        let mut failed = None;
        left.retain(|&i| {
            let Some(head) = rows.heads().get(i as usize) else {
                return false;
            };
            match self.passes(rows.distinct_id(head)) {
                Ok(passes) => passes,
                Err(e) => {
                    failed.get_or_insert(e);
                    false
                }
            }
        });
        failed.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
#[path = "tests/properties.rs"]
mod tests;
