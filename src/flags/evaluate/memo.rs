//! What one request remembers while its flags are evaluated: each property key's value
//! for the person, each person test's answer, and the last holdout hash. Flags and
//! cohorts often read the same keys and test them the same way (one URL pattern in
//! several flags), and the holdout hash has no flag key, so each is computed once.

use std::borrow::Cow;
use std::cell::Cell;

use serde_json::{Map, Value};

use super::super::filter::UNSHARED;
use super::super::hash::holdout_hash;
use super::super::outcome::Seen;
use super::super::property::Operator;
use super::super::props::{person_get, Props};
use super::super::result::FailureCause;
use super::Env;

/// One property key's value for the request, remembered from its first lookup on: `None`
/// until then, [`ABSENT`] for a key the person does not have. Indexed by the filters'
/// slots. One word, so the request's lookups start as a block of zeros.
pub(super) type Lookup<'c> = Cell<Option<&'c Value>>;

/// Remembered for a key the person does not have; told apart by its address.
static ABSENT: Value = Value::Null;

/// What the evaluation found of the person's properties, by slot (the first
/// [`Seen::SLOTS`]), for an edge's verdicts.
pub(super) fn seen(lookups: &[Lookup<'_>]) -> Seen {
    let mut seen = Seen::default();
    for (slot, lookup) in lookups.iter().take(Seen::SLOTS).enumerate() {
        if let Some(found) = lookup.get() {
            seen.looked |= 1 << slot;
            if !std::ptr::eq(found, &ABSENT) {
                seen.present |= 1 << slot;
            }
        }
    }
    seen
}

/// One shared person test's answer for the request, remembered from its first evaluation
/// on. Indexed by the filters' predicate numbers.
pub(super) type Known = Cell<Option<bool>>;

/// Files with up to this many property keys and shared tests keep the request's lookups
/// and answers on the stack (under 300 bytes); larger ones allocate them.
pub(super) const STACK_SLOTS: usize = 32;

/// The request's memory, shared by every flag's evaluation.
pub(super) struct Memo<'r, 'c> {
    pub(super) lookups: &'r [Lookup<'c>],
    pub(super) known: &'r [Known],
    /// The last holdout hash and the id it was computed for: one holdout hash serves
    /// every flag of the request that buckets by the same id.
    pub(super) holdout: Cell<Option<(&'c str, f64)>>,
    pub(super) distinct: Option<&'c Value>,
}

impl<'c> Env<'_, 'c> {
    /// [`holdout_hash`] of `id`, once per request for a borrowed id.
    // The `Cow` is the point: only an id borrowed from the request lives long enough
    // to be remembered.
    #[allow(clippy::ptr_arg)]
    pub(super) fn holdout_hash(&self, id: &Cow<'c, str>) -> f64 {
        let Cow::Borrowed(id) = id else {
            return holdout_hash(id);
        };
        if let Some((seen, hash)) = self.memo.holdout.get() {
            if seen == *id {
                return hash;
            }
        }
        let hash = holdout_hash(id);
        self.memo.holdout.set(Some((id, hash)));
        hash
    }

    /// Whether the person passes a property test (before any negation), whose number
    /// among the file's shared tests is `predicate`: each runs once per request.
    #[inline(always)]
    pub(super) fn person_test(
        &self,
        key: &str,
        slot: usize,
        predicate: usize,
        operator: &Operator,
    ) -> Result<bool, FailureCause> {
        if predicate == UNSHARED {
            return Ok(operator.matches(self.person_value(key, slot)?, self.ctx.now));
        }
        let known = self.memo.known.get(predicate);
        if let Some(matched) = known.and_then(Cell::get) {
            return Ok(matched);
        }
        let matched = operator.matches(self.person_value(key, slot)?, self.ctx.now);
        if let Some(known) = known {
            known.set(Some(matched));
        }
        Ok(matched)
    }

    /// The person's value for a filter's key, whose number among the file's keys is
    /// `slot`: each key is hashed and found once per request.
    #[inline]
    pub(super) fn person_value(
        &self,
        key: &str,
        slot: usize,
    ) -> Result<Option<&'c Value>, FailureCause> {
        let Some(map) = self.ctx.person_properties else {
            return Err(FailureCause::PersonProperties);
        };
        match self.memo.lookups.get(slot).map(Cell::get) {
            Some(Some(found)) if std::ptr::eq(found, &ABSENT) => Ok(None),
            Some(Some(found)) => Ok(Some(found)),
            _ => Ok(self.find_person_value(map, key, slot)),
        }
    }

    /// The first lookup of a key: found in the map and remembered.
    #[inline(never)]
    fn find_person_value(
        &self,
        map: &'c Map<String, Value>,
        key: &str,
        slot: usize,
    ) -> Option<&'c Value> {
        let found = person_get(map, key, self.memo.distinct);
        if let Some(lookup) = self.memo.lookups.get(slot) {
            lookup.set(Some(found.unwrap_or(&ABSENT)));
        }
        found
    }

    #[inline]
    pub(super) fn person(&self) -> Props<'c> {
        match self.ctx.person_properties {
            Some(map) => Props::Person(map, self.memo.distinct),
            None => Props::Failed(FailureCause::PersonProperties),
        }
    }

    pub(super) fn group_props(&self, name: &str) -> Props<'c> {
        match self.ctx.group_properties.get(name) {
            Some(Some(map)) => Props::Known(Some(map)),
            Some(None) => Props::Failed(FailureCause::GroupProperties(name.to_owned())),
            None => Props::Known(None),
        }
    }
}
