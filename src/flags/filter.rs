//! Leaf filters as they appear in flag conditions and cohort definitions: a property test,
//! a cohort membership test, or a dependency on another flag's value. References to cohorts
//! and flags are resolved to indexes while compiling, so evaluation never looks up names.

use std::cell::RefCell;
use std::collections::HashMap;

use serde_json::Value;

use super::definition::Node;
use super::error::{CompileError, ErrorKind};
use super::property::{Matching, Operator};
use super::vocabulary::UNEVALUATED_TYPES;

/// The operator of flag-dependency filters.
const FLAG_OPERATOR: &str = "flag_evaluates_to";

/// Where a cohort reference points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CohortRef {
    Index(usize),
    /// Not in the file's `cohorts`; the flag using it cannot be evaluated.
    Missing(i64),
}

/// Where a flag dependency points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum FlagRef {
    Index(usize),
    /// No live flag has this id or key; the dependent flag cannot be evaluated.
    Missing(String),
}

/// The value a `flag_evaluates_to` filter expects of its dependency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Expect {
    /// `true`: any enabled value, boolean or variant.
    Enabled,
    /// `false`: disabled only.
    Disabled,
    /// That variant exactly.
    Variant(String),
}

/// Whose properties a property filter reads: PostHog routes each filter by its `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Source {
    Person,
    /// A group's: the filter's `group_type_index`, else its condition's aggregation.
    Group(Option<i64>),
}

#[derive(Debug, Clone)]
pub(super) enum Leaf {
    Property {
        key: String,
        /// The key's number among all property keys of the file (see [`Scope::slot`]).
        slot: usize,
        /// The number of the test (key, source, operator and value) among the person
        /// tests several filters of the file make, which give the same answer for the
        /// same person; [`UNSHARED`] for the others (see `compile::share_predicates`).
        predicate: usize,
        source: Source,
        operator: Operator,
        negate: bool,
    },
    Cohort {
        cohort: CohortRef,
        member: bool,
        negate: bool,
    },
    Flag {
        flag: FlagRef,
        expect: Expect,
        negate: bool,
    },
}

/// Names known to the whole file, for resolving references while compiling.
pub(super) struct Scope {
    pub(super) cohorts: HashMap<i64, usize>,
    pub(super) flags_by_id: HashMap<i64, usize>,
    pub(super) flags_by_key: HashMap<String, usize>,
    /// Property keys numbered in order of first use, so evaluation can remember each
    /// key's lookup for the request in a vector.
    pub(super) property_keys: RefCell<HashMap<String, usize>>,
    /// Property tests numbered in order of first use, so evaluation can remember each
    /// test's answer for the request in a vector.
    pub(super) predicates: RefCell<HashMap<PredicateKey, usize>>,
    /// The file's `property_matching_version`.
    pub(super) matching: Matching,
}

/// The `predicate` of a property filter whose test no other filter makes.
pub(super) const UNSHARED: usize = usize::MAX;

/// What makes two property filters the same test: key, source, operator name and the
/// value's JSON text. The file's matching version is the same for all of them, so equal
/// keys compile to equal operators (equal values written differently only share less).
pub(super) type PredicateKey = (String, Source, String, String);

impl Scope {
    /// The number of a property key, the same for every filter that reads it.
    fn slot(&self, key: &str) -> usize {
        let mut keys = self.property_keys.borrow_mut();
        let next = keys.len();
        *keys.entry(key.to_owned()).or_insert(next)
    }

    /// The number of a property test, the same for every filter that is this test;
    /// renumbered once the whole file is compiled.
    fn predicate(&self, test: PredicateKey) -> usize {
        let mut tests = self.predicates.borrow_mut();
        let next = tests.len();
        *tests.entry(test).or_insert(next)
    }
}

/// Which leaf kinds a context allows: cohort definitions cannot depend on flags. It also
/// decides what `negation` means: PostHog honours it on the leaves of a cohort only, so
/// in a flag's own conditions it is read (and type-checked) but has no effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Allow {
    Everything,
    NoFlags,
}

impl Leaf {
    pub(super) fn compile(
        node: &Node<'_>,
        scope: &Scope,
        allow: Allow,
    ) -> Result<Leaf, CompileError> {
        let negation = node.get("negation").bool_or(false)?;
        let negate = negation && allow == Allow::NoFlags;
        let kind = node.get("type");
        match kind.opt_str()?.unwrap_or("person") {
            name @ ("person" | "group") => {
                let key = node.get("key").str()?.to_owned();
                let op = node.get("operator");
                let value = node.get("value");
                let operator = Operator::compile_with(op.opt_str()?, value.value(), scope.matching)
                    .ok_or_else(|| unknown_operator(&op))?;
                let source = match name {
                    "group" => Source::Group(node.get("group_type_index").opt_i64()?),
                    _ => Source::Person,
                };
                let test = (
                    key.clone(),
                    source,
                    op.opt_str()?.unwrap_or("exact").to_owned(),
                    value.value().to_string(),
                );
                Ok(Leaf::Property {
                    predicate: scope.predicate(test),
                    slot: scope.slot(&key),
                    key,
                    source,
                    operator,
                    negate,
                })
            }
            "cohort" => {
                let op = node.get("operator");
                let member = match op.opt_str()? {
                    None | Some("in") | Some("exact") => true,
                    Some("not_in") => false,
                    Some(_) => return Err(unknown_operator(&op)),
                };
                let value = node.get("value");
                let id = cohort_id(&value)?;
                let cohort = match scope.cohorts.get(&id) {
                    Some(&index) => CohortRef::Index(index),
                    None => CohortRef::Missing(id),
                };
                Ok(Leaf::Cohort {
                    cohort,
                    member,
                    negate,
                })
            }
            "flag" if allow == Allow::Everything => {
                let op = node.get("operator");
                if !matches!(op.opt_str()?, None | Some(FLAG_OPERATOR)) {
                    return Err(unknown_operator(&op));
                }
                let key = node.get("key");
                let flag = resolve_flag(key_text(&key)?, scope);
                let expect = expectation(&node.get("value"))?;
                Ok(Leaf::Flag {
                    flag,
                    expect,
                    negate,
                })
            }
            "flag" => Err(kind.invalid("flag filters cannot be used inside cohorts")),
            known if UNEVALUATED_TYPES.contains(&known) => {
                Err(kind.error(ErrorKind::UnsupportedFilterType(known.to_owned())))
            }
            other => Err(kind.error(ErrorKind::UnknownFilterType(other.to_owned()))),
        }
    }
}

fn unknown_operator(op: &Node<'_>) -> CompileError {
    let name = op.value().as_str().unwrap_or_default().to_owned();
    op.error(ErrorKind::UnknownOperator(name))
}

/// A cohort id written as a number or a numeric string.
pub(super) fn cohort_id(value: &Node<'_>) -> Result<i64, CompileError> {
    match value.value() {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        Value::Null => return Err(value.error(ErrorKind::Missing)),
        _ => None,
    }
    .ok_or_else(|| value.wrong_type("a cohort id"))
}

/// PostHog writes the dependency's id as the filter key; a flag key is accepted too.
fn key_text(key: &Node<'_>) -> Result<String, CompileError> {
    match key.value() {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Null => Err(key.error(ErrorKind::Missing)),
        _ => Err(key.wrong_type("a flag id or key")),
    }
}

fn resolve_flag(key: String, scope: &Scope) -> FlagRef {
    let by_id = key
        .parse::<i64>()
        .ok()
        .and_then(|id| scope.flags_by_id.get(&id));
    match by_id.or_else(|| scope.flags_by_key.get(&key)) {
        Some(&index) => FlagRef::Index(index),
        None => FlagRef::Missing(key),
    }
}

fn expectation(value: &Node<'_>) -> Result<Expect, CompileError> {
    match value.value() {
        Value::Bool(true) => Ok(Expect::Enabled),
        Value::Bool(false) => Ok(Expect::Disabled),
        // A variant cannot be called "true" or "false": those are the payload keys of
        // boolean values, so the strings mean the booleans.
        Value::String(s) if s.eq_ignore_ascii_case("true") => Ok(Expect::Enabled),
        Value::String(s) if s.eq_ignore_ascii_case("false") => Ok(Expect::Disabled),
        Value::String(s) => Ok(Expect::Variant(s.clone())),
        _ => Err(value.wrong_type("true, false or a variant key")),
    }
}

impl Expect {
    /// Whether a dependency's evaluated value satisfies this expectation.
    pub(super) fn accepts(&self, enabled: bool, variant: Option<&str>) -> bool {
        match self {
            Expect::Enabled => enabled,
            Expect::Disabled => !enabled,
            Expect::Variant(want) => enabled && variant == Some(want.as_str()),
        }
    }
}
