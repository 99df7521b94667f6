//! PostHog's `properties` parameter of the events API
//! (`?properties=[{"key":"$browser","value":"Chrome","operator":"exact","type":"event"}]`):
//! filters in AND and OR groups, read in the shapes PostHog's
//! `posthog/models/property/parse.py` reads and compared as its events API compares
//! ([`Matcher::posthog`], HogQL's rules). Event filters test each block's column of the
//! property ([`ColumnTest`]), and one every passing event needs narrows the read to the
//! blocks the event index names for its key; person filters test the current
//! properties of each event's person, read once a distinct id a request.
//!
//! The shapes: a list of filters, all of which pass (`type` is `event` unless given,
//! `operator` `exact`); a group `{"type":"AND"|"OR","values":[...]}` of filters and
//! groups; the old object `{"$browser":"Chrome","n__gt":3}` (the operator after `__`).
//! What PostHog would drop without a word, matching more than was asked (a filter it
//! cannot read, a type other than `event` and `person`), is refused here with a 400
//! naming `properties`, as is an unknown operator, a regex that does not compile, and
//! a filter of more than [`MAX_FILTERS`] filters or groups nested deeper than
//! [`MAX_DEPTH`].

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

/// Filters a request may hold: each is a test of every event a page examines.
pub const MAX_FILTERS: usize = 100;

/// Groups nested in groups at most (PostHog's UI makes two).
pub const MAX_DEPTH: usize = 8;

/// What PostHog's API says of `properties` that is not JSON.
const UNPARSABLE: &str = "Properties are unparsable!";

/// The filters of a request: what an event must pass.
pub enum Filters {
    /// A test of the event's properties.
    Event(Matcher),
    /// A test of its person's.
    Person(Matcher),
    /// Every one of these (none: every event).
    All(Vec<Filters>),
    /// One of these at least.
    Any(Vec<Filters>),
}

impl Default for Filters {
    fn default() -> Filters {
        Filters::All(Vec::new())
    }
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
        let mut read = 0;
        let filters = match value {
            Value::Null => Filters::default(),
            Value::Array(filters) => Filters::All(each(filters, 0, &mut read)?),
            Value::Object(group) if is_group(&group) => read_group(group, 1, &mut read)?,
            // The old form: key (and `__operator`) to value, all of events.
            Value::Object(old) => {
                let filters = old.into_iter().map(|(key, value)| {
                    let (key, operator) = key.split_once("__").unwrap_or((&key, "exact"));
                    let operator = operator.split("__").next().unwrap_or(operator);
                    json!({"key": key, "operator": operator, "value": value})
                });
                Filters::All(each(filters.collect(), 0, &mut read)?)
            }
            _ => {
                return Err(refused(
                    "Properties must be a list of filters, a group of them or an object",
                ))
            }
        };
        Ok((read > 0).then_some(filters))
    }

    /// These and an event filter more (the console's `property`).
    pub fn and(self, event: Matcher) -> Filters {
        match self {
            Filters::All(mut all) => {
                all.push(Filters::Event(event));
                Filters::All(all)
            }
            other => Filters::All(vec![other, Filters::Event(event)]),
        }
    }

    /// The test of a read of `project`'s events in `open`.
    pub fn test(self, open: Arc<Open>, project: u64) -> Box<dyn BlockTest> {
        Box::new(self.node(&open, project))
    }

    fn node(self, open: &Arc<Open>, project: u64) -> Node {
        let persons = |matchers| PersonTest {
            matchers,
            open: open.clone(),
            project,
            known: HashMap::new(),
        };
        match self {
            Filters::Event(m) => Node::Column(Box::new(ColumnTest::new(m))),
            Filters::Person(m) => Node::Person(persons(vec![m])),
            // The block's columns first, then the groups, then the persons all at once.
            Filters::All(all) => {
                let (mut nodes, mut people, mut groups) = (Vec::new(), Vec::new(), Vec::new());
                for filter in all {
                    match filter {
                        Filters::Event(m) => nodes.push(Node::Column(Box::new(ColumnTest::new(m)))),
                        Filters::Person(m) => people.push(m),
                        group => groups.push(group.node(open, project)),
                    }
                }
                nodes.extend(groups);
                if !people.is_empty() {
                    nodes.push(Node::Person(persons(people)));
                }
                Node::All(nodes)
            }
            Filters::Any(any) => {
                Node::Any(any.into_iter().map(|f| f.node(open, project)).collect())
            }
        }
    }
}

/// The filters (and groups) of a list at `depth`, `read` counting them.
fn each(values: Vec<Value>, depth: usize, read: &mut usize) -> Result<Vec<Filters>, ApiError> {
    let mut filters = Vec::with_capacity(values.len());
    for value in values {
        filters.push(match value {
            Value::Object(group) if is_group(&group) => read_group(group, depth + 1, read)?,
            filter => {
                let i = *read;
                *read += 1;
                if *read > MAX_FILTERS {
                    return Err(refused(format!(
                        "properties hold {MAX_FILTERS} filters at most"
                    )));
                }
                let at = |detail: String| refused(format!("properties[{i}]: {detail}"));
                let (person, filter) = normalize(filter).map_err(at)?;
                let matcher = Matcher::posthog(filter).map_err(|e| match e {
                    ApiError::BadQuery(detail) => at(detail),
                    other => other,
                })?;
                match person {
                    true => Filters::Person(matcher),
                    false => Filters::Event(matcher),
                }
            }
        });
    }
    Ok(filters)
}

/// A group `{"type": "AND"|"OR", "values": [...]}` at `depth` (1 for the outermost).
fn read_group(
    mut group: Map<String, Value>,
    depth: usize,
    read: &mut usize,
) -> Result<Filters, ApiError> {
    if depth > MAX_DEPTH {
        return Err(refused(format!(
            "property groups nest {MAX_DEPTH} deep at most"
        )));
    }
    let kind = (group.get("type").and_then(Value::as_str)).map(str::to_uppercase);
    let Some(Value::Array(values)) = group.remove("values") else {
        return Err(refused(
            "PropertyGroup is unparsable: values must be a list",
        ));
    };
    let any = match kind.as_deref() {
        Some("AND") => false,
        Some("OR") => true,
        _ => {
            return Err(refused(
                "PropertyGroup is unparsable: type must be AND or OR",
            ))
        }
    };
    let mut filters = each(values, depth, read)?;
    Ok(match filters.len() {
        1 => filters.remove(0),
        // PostHog's empty group passes every event, as an empty AND does.
        n if any && n > 1 => Filters::Any(filters),
        _ => Filters::All(filters),
    })
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

/// The test of a block's events by a tree of filters.
enum Node {
    Column(Box<ColumnTest>),
    Person(PersonTest),
    All(Vec<Node>),
    Any(Vec<Node>),
}

impl BlockTest for Node {
    /// A key every passing event has: the first one any test of an `All` needs, the
    /// one all tests of an `Any` need.
    fn key(&self) -> Option<String> {
        match self {
            Node::Column(test) => test.key(),
            Node::Person(_) => None,
            Node::All(all) => all.iter().find_map(Node::key),
            Node::Any(any) => {
                let mut keys = any.iter().map(Node::key);
                let first = keys.next()??;
                keys.all(|k| k.as_ref() == Some(&first)).then_some(first)
            }
        }
    }

    fn keep(&mut self, rows: &Rows, left: &mut Vec<u32>) -> Result<(), sled::Error> {
        match self {
            Node::Column(test) => test.keep(rows, left),
            Node::Person(test) => test.keep(rows, left),
            Node::All(all) => {
                for node in all {
                    if left.is_empty() {
                        break;
                    }
                    node.keep(rows, left)?;
                }
                Ok(())
            }
            // Each test sees only the events the ones before it did not pass.
            Node::Any(any) => {
                let mut passed = vec![false; rows.heads().len()];
                let mut rest = left.clone();
                for node in any {
                    if rest.is_empty() {
                        break;
                    }
                    let mut kept = rest.clone();
                    node.keep(rows, &mut kept)?;
                    for &i in &kept {
                        if let Some(p) = passed.get_mut(i as usize) {
                            *p = true;
                        }
                    }
                    rest.retain(|&i| passed.get(i as usize) == Some(&false));
                }
                left.retain(|&i| passed.get(i as usize) == Some(&true));
                Ok(())
            }
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
