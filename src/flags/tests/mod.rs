//! Scenario tests of the whole module: compile a definition file, evaluate it for crafted
//! requests, and assert exact results. Expected hashes were computed independently from
//! SHA-1 (`"<key>.<id><salt>"`, first 15 hex digits over 0xFFFFFFFFFFFFFFF).

mod cohorts;
mod compile_errors;
mod dependencies;
mod evaluation;
mod gates;
mod groups;
mod inconclusive;
mod operators;
mod parity;
mod refusals;
mod reload;
mod responses;
mod shared;

use std::collections::HashMap;

use serde_json::{json, Map, Value};
use time::macros::datetime;
use time::OffsetDateTime;

use super::{Context, Evaluation, FlagResult, ProjectRules, ReasonCode};

/// The fixed "now" of every scenario, so relative dates are reproducible.
pub(super) const NOW: OffsetDateTime = datetime!(2024-06-15 12:00:00 UTC);

/// A request, owning what `Context` borrows.
pub(super) struct Request {
    pub(super) distinct_id: String,
    pub(super) anon: Option<String>,
    pub(super) hash_key_override: Option<String>,
    pub(super) person: Option<Map<String, Value>>,
    pub(super) groups: Map<String, Value>,
    pub(super) group_properties: HashMap<String, Option<Map<String, Value>>>,
}

impl Request {
    pub(super) fn new(distinct_id: &str) -> Request {
        Request {
            distinct_id: distinct_id.to_owned(),
            anon: None,
            hash_key_override: None,
            person: Some(Map::new()),
            groups: Map::new(),
            group_properties: HashMap::new(),
        }
    }

    pub(super) fn person(mut self, properties: Value) -> Request {
        self.person = Some(object(properties));
        self
    }

    /// The person lookup failed.
    pub(super) fn person_unavailable(mut self) -> Request {
        self.person = None;
        self
    }

    pub(super) fn anon(mut self, id: &str) -> Request {
        self.anon = Some(id.to_owned());
        self
    }

    pub(super) fn hash_key_override(mut self, id: &str) -> Request {
        self.hash_key_override = Some(id.to_owned());
        self
    }

    pub(super) fn groups(mut self, groups: Value) -> Request {
        self.groups = object(groups);
        self
    }

    pub(super) fn group_properties(mut self, group_type: &str, props: Option<Value>) -> Request {
        self.group_properties
            .insert(group_type.to_owned(), props.map(object));
        self
    }

    pub(super) fn evaluate(&self, rules: &ProjectRules) -> Evaluation {
        rules.evaluate(&self.context())
    }

    pub(super) fn context(&self) -> Context<'_> {
        Context {
            distinct_id: &self.distinct_id,
            anon_distinct_id: self.anon.as_deref(),
            hash_key_override: self.hash_key_override.as_deref(),
            person_properties: self.person.as_ref(),
            groups: &self.groups,
            group_properties: &self.group_properties,
            now: NOW,
        }
    }
}

pub(super) fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("test data must be an object, got {other}"),
    }
}

pub(super) fn compile(definitions: Value) -> ProjectRules {
    ProjectRules::from_value(definitions).expect("test definitions compile")
}

/// A file with one flag.
pub(super) fn single(flag: Value) -> ProjectRules {
    compile(json!({ "flags": [flag] }))
}

/// A minimal active flag with the given filters.
pub(super) fn flag(id: i64, key: &str, filters: Value) -> Value {
    json!({"id": id, "key": key, "active": true, "deleted": false, "version": 1, "filters": filters})
}

/// A boolean flag with one condition at `rollout` percent and no filters.
pub(super) fn rollout_flag(key: &str, rollout: f64) -> Value {
    flag(
        1,
        key,
        json!({"groups": [{"properties": [], "rollout_percentage": rollout}]}),
    )
}

/// Three variants at 34/33/33 %: boundaries 0.34, 0.67 and 1.0.
pub(super) fn three_way() -> serde_json::Value {
    json!({"variants": [
        {"key": "control", "rollout_percentage": 34},
        {"key": "test-a", "rollout_percentage": 33},
        {"key": "test-b", "rollout_percentage": 33}
    ]})
}

pub(super) fn find<'e>(eval: &'e Evaluation, key: &str) -> &'e FlagResult {
    eval.flags
        .iter()
        .find(|f| f.key == key)
        .unwrap_or_else(|| panic!("flag {key} missing from {eval:?}"))
}

/// `(enabled, variant, reason code, condition index)` of one flag, for compact asserts.
pub(super) fn outcome(
    eval: &Evaluation,
    key: &str,
) -> (bool, Option<String>, ReasonCode, Option<usize>) {
    let f = find(eval, key);
    (
        f.enabled,
        f.variant.clone(),
        f.reason.code,
        f.reason.condition_index,
    )
}

pub(super) fn keys(eval: &Evaluation) -> Vec<&str> {
    eval.flags.iter().map(|f| f.key.as_str()).collect()
}

/// The flags that failed, with why.
pub(super) fn failed(eval: &Evaluation) -> Vec<(&str, &super::FailureCause)> {
    eval.failed
        .iter()
        .map(|f| (f.key.as_str(), &f.cause))
        .collect()
}
