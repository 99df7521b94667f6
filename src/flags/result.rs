//! What evaluation hands back: the request context it reads and the per-flag results, with
//! PostHog's reason codes and descriptions (clients show them in debugging tools, so the
//! wording matches PostHog's).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use serde_json::{Map, Value};
use time::OffsetDateTime;

/// Everything one evaluation reads about the caller.
#[derive(Debug, Clone)]
pub struct Context<'a> {
    pub distinct_id: &'a str,
    /// The request's `$anon_distinct_id`.
    pub anon_distinct_id: Option<&'a str>,
    /// The stored "first seen" distinct id, for `ensure_experience_continuity`.
    pub hash_key_override: Option<&'a str>,
    /// Person properties, stored then overridden key by key by the request. `None` means
    /// the storage lookup failed: flags that need them are left out and `errors` is set.
    pub person_properties: Option<&'a Map<String, Value>>,
    /// The request's `groups`: group type name to key (string or number).
    pub groups: &'a Map<String, Value>,
    /// Group type name to merged group properties; `None` for a type whose lookup failed.
    /// A type absent from the map has no properties.
    pub group_properties: &'a HashMap<String, Option<Map<String, Value>>>,
    /// The time relative dates (`-7d`) count back from.
    pub now: OffsetDateTime,
}

/// The flags of one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evaluation {
    /// In definition order; inactive, deleted and failed flags are absent.
    pub flags: Vec<FlagResult>,
    /// Some flag could not be computed; clients then merge instead of replacing.
    pub errors: bool,
    /// The flags left out because they could not be computed, and why.
    pub failed: Vec<FlagFailure>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FlagResult {
    pub key: String,
    pub id: i64,
    pub version: Option<i64>,
    pub enabled: bool,
    pub variant: Option<String>,
    pub reason: Reason,
    /// `payloads[variant or "true"]`, only when enabled.
    pub payload: Option<Value>,
}

impl FlagResult {
    /// The flag's value as clients see it: the variant key, else the boolean.
    pub fn value(&self) -> Value {
        match &self.variant {
            Some(variant) if self.enabled => Value::String(variant.clone()),
            _ => Value::Bool(self.enabled),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason {
    pub code: ReasonCode,
    /// The condition that decided, for condition results and rollout misses.
    pub condition_index: Option<usize>,
    pub description: Cow<'static, str>,
}

impl Reason {
    pub(super) fn new(code: ReasonCode, condition_index: Option<usize>) -> Reason {
        let description = match code.fixed_description() {
            Some(text) => Cow::Borrowed(text),
            None => Cow::Owned(format!(
                "{MATCHED_CONDITION_PREFIX}{}",
                matched_condition_set(condition_index)
            )),
        };
        Reason {
            code,
            condition_index,
            description,
        }
    }
}

/// The description of `condition_match`, followed by the 1-based condition number.
pub(super) const MATCHED_CONDITION_PREFIX: &str = "Matched condition set ";

/// The 1-based number a `condition_match` description gives its condition.
pub(super) fn matched_condition_set(condition_index: Option<usize>) -> usize {
    condition_index.unwrap_or(0) + 1
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReasonCode {
    ConditionMatch,
    SuperConditionValue,
    HoldoutConditionValue,
    OutOfRolloutBound,
    NoConditionMatch,
    NoGroupType,
    MissingDependency,
}

impl ReasonCode {
    /// The wire name, e.g. `condition_match`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReasonCode::ConditionMatch => "condition_match",
            ReasonCode::SuperConditionValue => "super_condition_value",
            ReasonCode::HoldoutConditionValue => "holdout_condition_value",
            ReasonCode::OutOfRolloutBound => "out_of_rollout_bound",
            ReasonCode::NoConditionMatch => "no_condition_match",
            ReasonCode::NoGroupType => "no_group_type",
            ReasonCode::MissingDependency => "missing_dependency",
        }
    }

    /// PostHog's description of the reason; `None` for `condition_match`, whose
    /// description names the condition (see [`MATCHED_CONDITION_PREFIX`]).
    pub(super) fn fixed_description(self) -> Option<&'static str> {
        match self {
            ReasonCode::ConditionMatch => None,
            ReasonCode::SuperConditionValue => Some("Super condition value"),
            ReasonCode::HoldoutConditionValue => Some("Holdout condition value"),
            ReasonCode::OutOfRolloutBound => Some("Out of rollout bound"),
            ReasonCode::NoConditionMatch => Some("No matching condition set"),
            ReasonCode::NoGroupType => Some("No group type"),
            ReasonCode::MissingDependency => {
                Some("Flag cannot be evaluated due to missing dependency")
            }
        }
    }
}

impl fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A flag left out of the response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagFailure {
    pub key: String,
    pub id: i64,
    pub cause: FailureCause,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailureCause {
    /// The person-property lookup failed and the flag reads person properties.
    PersonProperties,
    /// The lookup of this group type's properties failed and the flag reads them.
    GroupProperties(String),
    /// A flag it depends on is missing or cyclic (reason `missing_dependency`).
    MissingDependency,
    /// It uses something that cannot be evaluated: an operator or filter type PostHog's
    /// flags service does not evaluate, or a cohort that is missing or unusable.
    Unsupported,
    /// Edge mode: only upstream can decide it, and upstream did not answer in time.
    Upstream,
}

impl fmt::Display for FailureCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailureCause::PersonProperties => f.write_str("person properties unavailable"),
            FailureCause::GroupProperties(group_type) => {
                write!(f, "properties of group type {group_type:?} unavailable")
            }
            FailureCause::MissingDependency => f.write_str(ReasonCode::MissingDependency.as_str()),
            FailureCause::Unsupported => f.write_str("uses a filter that cannot be evaluated"),
            FailureCause::Upstream => f.write_str("left to upstream, which did not answer"),
        }
    }
}
