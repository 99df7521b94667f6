//! The property test events and persons are searched with, by the console and the read
//! API's `properties`, and a flag's reach is found with. Each filter is compiled as the
//! release condition of a one-flag project ([`Matcher`]): what the flags refuse is
//! refused, and a flag's reach is matched by the flag evaluation `/decide` runs. The
//! read API and the console compare as PostHog's events API and UI do instead
//! ([`hogql`]: `exact` case-sensitive, a JSON `null` no value, ...), leaving to the
//! flags only the dates and versions, which both compare alike. Event filters test each
//! block's column of the property ([`ColumnTest`]) and stop after
//! [`MAX_BLOCKS_EXAMINED`] blocks that may hold it (the event index names them); the
//! page's cursor resumes where they stopped.

use std::collections::HashMap;

use serde_json::{json, Map, Value};
use uuid::Uuid;

use super::error::ApiError;
use super::hogql::{self, Compare};
use super::params::Params;
use crate::flags::{CompileError, Context, ProjectRules};
use crate::store::block::{Cell, Column, Rows};
use crate::store::keys;
use crate::store::query::{self, BlockTest};

/// Blocks a property filter reads per page at most; the next page goes on from
/// there. Blocks without the property are not read when only events with it can pass
/// (the event index names the others); one with it costs a parse of each distinct
/// value, so this bounds one request to tens of milliseconds
/// (BENCHMARKS.md, "The console's pages by a property"): about 100,000 events of
/// web traffic.
pub const MAX_BLOCKS_EXAMINED: usize = 2_000;

/// One property test, compiled as PostHog compiles a flag's property filter.
pub struct Matcher {
    rules: ProjectRules,
    /// The comparison of PostHog's events API, where it is not the flags'.
    compare: Option<Compare>,
    now: time::OffsetDateTime,
    /// The property it tests.
    key: String,
    /// Whether properties without the key pass: the same for all of them, as a test
    /// reads nothing else (its rollout is 100%, so nothing is hashed), except for the
    /// key `distinct_id`, which PostHog fills with the distinct id (None then).
    absent: Option<bool>,
    /// An `icontains` test's value without wildcards, ASCII-lowercased as it folds.
    needle: Option<Vec<u8>>,
    /// A `not_icontains` test's value, ASCII-lowercased: a text holding it as it is
    /// matches its `ILIKE` whatever wildcards it has, so it fails the test.
    excluded: Option<Vec<u8>>,
}

impl Matcher {
    /// `?property=&operator=&value=` (operator `exact` unless given), compared as
    /// PostHog's UI compares; None without a property. `value` is a list for `exact`
    /// and `is_not` (comma separated), else text. A filter the flags would refuse is
    /// refused with their words.
    pub fn from_params(params: &Params) -> Result<Option<Matcher>, ApiError> {
        let Some(key) = params.get("property") else {
            return Ok(None);
        };
        let operator = params.get("operator").unwrap_or("exact");
        let text = params.get("value").unwrap_or("");
        let value = match operator {
            "exact" | "is_not" => Value::from(
                text.split(',')
                    .map(|v| Value::from(v.trim()))
                    .collect::<Vec<_>>(),
            ),
            "is_set" | "is_not_set" => Value::from(operator),
            _ => Value::from(text),
        };
        let filter = json!({"key": key, "operator": operator, "value": value});
        Matcher::posthog(filter).map(Some)
    }

    /// A filter `{"key", "operator", "value"}` compared as PostHog's events API
    /// compares it ([`hogql`]), refused as [`Matcher::new`] refuses.
    pub fn posthog(mut filter: Value) -> Result<Matcher, ApiError> {
        filter["type"] = Value::from("person");
        let mut matcher = Matcher::new(filter.clone(), None)?;
        let operator = (filter.get("operator").and_then(Value::as_str)).unwrap_or("exact");
        let value = filter.get("value").unwrap_or(&Value::Null);
        let compare = Compare::new(operator, value)
            .map_err(|e| ApiError::BadQuery(format!("the property filter is not valid: {e}")))?;
        let needle = match (operator, value) {
            ("icontains", Value::String(text)) => hogql::plain_needle(text),
            _ => None,
        };
        let excluded = match (operator, value) {
            ("not_icontains", Value::String(text)) => Some(text.to_ascii_lowercase().into_bytes()),
            _ => None,
        };
        matcher.compare = Some(compare);
        matcher.needle = needle;
        matcher.excluded = excluded;
        matcher.absent = matcher.absent.map(|_| matcher.matches("", &Map::new()));
        Ok(matcher)
    }

    /// A flag's person property `filter` alone, matched as a file whose
    /// `property_matching_version` is `matching` matches it: the flags' comparison.
    pub fn new(filter: Value, matching: Option<&Value>) -> Result<Matcher, ApiError> {
        let key = match filter.get("key") {
            Some(Value::String(key)) => key.clone(),
            _ => return Err(ApiError::BadQuery("the property filter has no key".into())),
        };
        let operator = filter.get("operator").and_then(Value::as_str);
        if let (Some("regex" | "not_regex"), Some(Value::String(pattern))) =
            (operator, filter.get("value"))
        {
            // The flags treat a regex that does not compile as never matching; a search
            // says why instead.
            regex::Regex::new(pattern).map_err(|e| {
                ApiError::BadQuery(format!("the property filter is not valid: {e}"))
            })?;
        }
        let mut definitions = json!({"flags": [{"id": 1, "key": "console-filter", "active": true,
            "filters": {"groups": [{"properties": [filter], "rollout_percentage": 100}]}}]});
        if let Some(version) = matching {
            definitions["property_matching_version"] = version.clone();
        }
        let refused = |e: &CompileError| {
            // The field of the filter at fault, without the flag it was compiled in.
            let field = e.field();
            let field = field.split_once("properties[0]").map_or(field, |(_, f)| f);
            let field = field.trim_start_matches('.');
            let at = if field.is_empty() {
                String::new()
            } else {
                format!("{field}: ")
            };
            ApiError::BadQuery(format!(
                "the property filter is not valid: {at}{}",
                e.kind()
            ))
        };
        // What `check` refuses too (an unknown operator, a field no filter has, ...):
        // the flags would quietly never match it.
        if let Some(problem) = crate::flags::lint(&definitions).first() {
            return Err(refused(problem));
        }
        let rules = ProjectRules::from_value(definitions).map_err(|e| refused(&e))?;
        if let Some(w) = rules.warnings().first() {
            return Err(refused(w));
        }
        let mut matcher = Matcher {
            rules,
            compare: None,
            now: crate::flags::now(),
            absent: None,
            key,
            needle: None,
            excluded: None,
        };
        if matcher.key != "distinct_id" {
            matcher.absent = Some(matcher.matches("", &Map::new()));
        }
        Ok(matcher)
    }

    /// The property it tests.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The text an `icontains` test looks for, ASCII-lowercased.
    pub fn needle(&self) -> Option<&[u8]> {
        self.needle.as_deref()
    }

    /// The text a `not_icontains` test refuses, ASCII-lowercased.
    pub fn excluded(&self) -> Option<&[u8]> {
        self.excluded.as_deref()
    }

    /// Whether only properties that have the key can pass (every operator but the
    /// negative ones, `is_not_set` and `distinct_id`'s tests).
    pub fn needs_key(&self) -> bool {
        self.absent == Some(false)
    }

    /// Whether properties whose only tested value is `value` (none: without the key)
    /// pass: the same answer as [`Matcher::matches`] on the whole properties.
    pub fn matches_value(&self, distinct_id: &str, value: Option<Value>) -> bool {
        match (value, self.absent) {
            (None, Some(known)) => known,
            (None, None) => self.matches(distinct_id, &Map::new()),
            (Some(value), _) => {
                let mut one = Map::with_capacity(1);
                one.insert(self.key.clone(), value);
                self.matches(distinct_id, &one)
            }
        }
    }

    /// Whether these properties pass the test. `distinct_id`, when they lack it, is
    /// the distinct id (the flags', and PostHog's persons' distinct id).
    pub fn matches(&self, distinct_id: &str, properties: &Map<String, Value>) -> bool {
        let Some(compare) = &self.compare else {
            return self.flag_matches(distinct_id, properties);
        };
        let filled;
        let mut value = properties.get(&self.key);
        if value.is_none() && self.key == "distinct_id" {
            filled = Value::from(distinct_id);
            value = Some(&filled);
        }
        compare
            .test(value)
            .unwrap_or_else(|| self.flag_matches(distinct_id, properties))
    }

    fn flag_matches(&self, distinct_id: &str, properties: &Map<String, Value>) -> bool {
        let (groups, group_properties) = (Map::new(), HashMap::new());
        let ctx = Context {
            distinct_id,
            anon_distinct_id: None,
            hash_key_override: None,
            person_properties: Some(properties),
            groups: &groups,
            group_properties: &group_properties,
            now: self.now,
        };
        self.rules
            .evaluate(&ctx)
            .flags
            .first()
            .is_some_and(|f| f.enabled)
    }
}

/// A page of events filtered by a property.
pub struct EventsPage {
    pub events: Vec<Value>,
    /// The cursor of the next page, if there may be more.
    pub next: Option<[u8; 32]>,
    pub examined: usize,
}

/// Up to `limit` events of a `walk` made [`query::Events::tested`]; the cursor of the
/// next page is the last event's when the page is full, else where the walk stopped.
pub fn events_page(
    mut walk: query::Events,
    project: u64,
    limit: usize,
) -> Result<EventsPage, sled::Error> {
    let mut events = Vec::new();
    for entry in walk.by_ref() {
        let (key, event) = entry?;
        events.push(event.to_api());
        if events.len() >= limit {
            return Ok(EventsPage {
                events,
                next: Some(key),
                examined: walk.examined(),
            });
        }
    }
    let next =
        (walk.stopped_at()).map(|(time, id)| keys::event(project, time, Uuid::from_u128(id)));
    Ok(EventsPage {
        events,
        next,
        examined: walk.examined(),
    })
}

/// [`Matcher`] run on the property's column of each block: a block whose key lists
/// lack the property is not read when only properties that have it can pass, each value is parsed once however many events repeat it, and only the
/// events that pass are made whole. Stored properties are the JSON serde_json wrote,
/// so a value parsed alone is what it is in its object parsed whole; one that does
/// not parse has its event read whole, as the plain test reads it.
pub struct ColumnTest {
    matcher: Matcher,
    /// Each value's answer, by its JSON text (see [`VALUES_MEMO`]).
    known: HashMap<Vec<u8>, bool>,
    text: Vec<u8>,
}

/// Values whose answer a read remembers at most: most events repeat a few values
/// (a browser, a page), and the memory stays bounded when they do not.
const VALUES_MEMO: usize = 4096;

impl ColumnTest {
    pub fn new(matcher: Matcher) -> ColumnTest {
        ColumnTest {
            matcher,
            known: HashMap::new(),
            text: Vec::new(),
        }
    }

    fn passes(&mut self, rows: &Rows, column: &Column<'_>, i: usize) -> bool {
        let distinct_id = rows.heads().get(i).map_or("", |h| rows.distinct_id(h));
        self.text.clear();
        match column.value(i, &mut self.text) {
            Cell::Absent => return self.matcher.matches_value(distinct_id, None),
            Cell::Whole => {}
            Cell::Value => {
                if let Some(&known) = self.known.get(&self.text) {
                    return known;
                }
                if let Ok(value) = serde_json::from_slice::<Value>(&self.text) {
                    let passes = self.matcher.matches_value(distinct_id, Some(value));
                    if self.known.len() >= VALUES_MEMO {
                        self.known.clear();
                    }
                    self.known.insert(self.text.clone(), passes);
                    return passes;
                }
            }
        }
        let event = rows.stored(i);
        event.is_some_and(|e| self.matcher.matches(&e.distinct_id, &e.properties))
    }
}

impl BlockTest for ColumnTest {
    fn key(&self) -> Option<String> {
        (self.matcher.needs_key()).then(|| self.matcher.key().to_owned())
    }

    fn keep(&mut self, rows: &Rows, left: &mut Vec<u32>) -> Result<(), sled::Error> {
        let key = self.matcher.key().to_owned();
        let Some(column) = rows.column(&key) else {
            // Layouts 1 and 2 keep each event's properties whole.
            left.retain(|&i| {
                let event = rows.stored(i as usize);
                event.is_some_and(|e| self.matcher.matches(&e.distinct_id, &e.properties))
            });
            return Ok(());
        };
        if self.matcher.needs_key() && !column.may_hold() {
            left.clear();
            return Ok(());
        }
        left.retain(|&i| self.passes(rows, &column, i as usize));
        Ok(())
    }
}

#[cfg(test)]
#[path = "tests/matching.rs"]
pub(crate) mod tests;
