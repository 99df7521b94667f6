//! Evaluation of a compiled project for one request, in PostHog's order: group presence,
//! early access, holdout, then conditions in stored order. Flags are computed in dependency
//! order and reported in definition order. Property lookups are lazy: a failed person (or
//! group) lookup only fails the flags that actually read it, and their dependents.

use std::borrow::Cow;

use serde_json::{Map, Value};

use super::cohort::Tree;
use super::compile::ProjectRules;
use super::filter::{CohortRef, FlagRef, Leaf};
use super::flag::{Flag, Logic};
use super::hash::{holdout_hash, in_rollout, FlagHashes};
use super::result::{
    Context, Evaluation, FailureCause, FlagFailure, FlagResult, Reason, ReasonCode,
};

/// Payload key of enabled flags without a variant.
const BOOLEAN_PAYLOAD_KEY: &str = "true";

/// A flag's state during one evaluation, as its dependents see it.
enum Slot {
    /// Inactive: reads as disabled.
    Skipped,
    Done(FlagResult),
    Failed(FailureCause),
}

/// The outcome of one flag before it is dressed up as a `FlagResult`.
struct Decision {
    enabled: bool,
    variant: Option<String>,
    code: ReasonCode,
    condition_index: Option<usize>,
}

impl Decision {
    fn off(code: ReasonCode, condition_index: Option<usize>) -> Decision {
        Decision {
            enabled: false,
            variant: None,
            code,
            condition_index,
        }
    }
}

/// Where property filters read from; `Failed` when the lookup did not succeed.
#[derive(Clone)]
enum Props<'a> {
    Known(Option<&'a Map<String, Value>>),
    Failed(FailureCause),
}

impl<'a> Props<'a> {
    fn get(&self, key: &str) -> Result<Option<&'a Value>, FailureCause> {
        match self {
            Props::Known(map) => Ok(map.and_then(|m| m.get(key))),
            Props::Failed(cause) => Err(cause.clone()),
        }
    }
}

impl ProjectRules {
    /// Evaluates every active flag for one request.
    pub fn evaluate(&self, ctx: &Context<'_>) -> Evaluation {
        let mut slots: Vec<Slot> = self
            .flags
            .iter()
            .map(|flag| match (&flag.logic, flag.broken) {
                (Some(_), true) => Slot::Failed(FailureCause::MissingDependency),
                _ => Slot::Skipped,
            })
            .collect();
        for &i in &self.order {
            let flag = &self.flags[i];
            let Some(logic) = &flag.logic else { continue };
            let env = Env {
                rules: self,
                ctx,
                slots: &slots,
            };
            let slot = match env.flag(flag, logic) {
                Ok(decision) => Slot::Done(result(flag, logic, decision)),
                Err(cause) => Slot::Failed(cause),
            };
            slots[i] = slot;
        }
        let mut evaluation = Evaluation {
            flags: Vec::with_capacity(self.order.len()),
            errors: false,
            failed: Vec::new(),
        };
        for (flag, slot) in self.flags.iter().zip(slots) {
            match slot {
                Slot::Skipped => {}
                Slot::Done(result) => evaluation.flags.push(result),
                Slot::Failed(cause) => evaluation.failed.push(FlagFailure {
                    key: flag.header.key.clone(),
                    id: flag.header.id,
                    cause,
                }),
            }
        }
        evaluation.errors = !evaluation.failed.is_empty();
        evaluation
    }
}

fn result(flag: &Flag, logic: &Logic, decision: Decision) -> FlagResult {
    let payload = if decision.enabled {
        let key = decision.variant.as_deref().unwrap_or(BOOLEAN_PAYLOAD_KEY);
        logic.payloads.get(key).filter(|p| !p.is_null()).cloned()
    } else {
        None
    };
    FlagResult {
        key: flag.header.key.clone(),
        id: flag.header.id,
        version: flag.header.version,
        enabled: decision.enabled,
        variant: decision.variant,
        reason: Reason::new(decision.code, decision.condition_index),
        payload,
    }
}

struct Env<'r, 'c> {
    rules: &'r ProjectRules,
    ctx: &'r Context<'c>,
    slots: &'r [Slot],
}

impl<'r> Env<'r, '_> {
    fn flag(&self, flag: &Flag, logic: &Logic) -> Result<Decision, FailureCause> {
        let (bucket, target) = match &logic.aggregation {
            Some(aggregation) => {
                let group = aggregation.name.as_deref().and_then(|name| {
                    let key = group_key(self.ctx.groups.get(name)?)?;
                    Some((key, self.group_props(name)))
                });
                match group {
                    Some(group) => group,
                    None => return Ok(Decision::off(ReasonCode::NoGroupType, None)),
                }
            }
            None => (Cow::Borrowed(self.person_bucket(logic)), self.person()),
        };
        let mut hashes = FlagHashes::new(&flag.header.key, &bucket);
        if let Some(decision) = self.early_access(logic, &mut hashes)? {
            return Ok(decision);
        }
        if let Some(holdout) = &logic.holdout {
            if in_rollout(holdout.percentage, || holdout_hash(&bucket)) {
                return Ok(Decision {
                    enabled: true,
                    variant: Some(holdout.variant.clone()),
                    code: ReasonCode::HoldoutConditionValue,
                    condition_index: None,
                });
            }
        }
        self.conditions(logic, &target, &mut hashes)
    }

    /// `feature_enrollment`, then legacy `super_groups[0]`; each decides only when the
    /// person has the property it is about.
    fn early_access(
        &self,
        logic: &Logic,
        hashes: &mut FlagHashes<'_>,
    ) -> Result<Option<Decision>, FailureCause> {
        let person = self.person();
        let mut decided = None;
        if let Some(property) = &logic.enrollment {
            if let Some(value) = person.get(property)? {
                decided = Some(match value {
                    Value::Bool(b) => *b,
                    Value::String(s) => s.eq_ignore_ascii_case("true"),
                    _ => false,
                });
            }
        }
        if let (None, Some(sup)) = (decided, &logic.super_condition) {
            let mut present = false;
            for key in &sup.keys {
                present |= person.get(key)?.is_some();
            }
            if present {
                let condition = &sup.condition;
                decided = Some(
                    self.all(&condition.filters, &person)?
                        && in_rollout(condition.rollout, || hashes.rollout()),
                );
            }
        }
        Ok(decided.map(|enabled| Decision {
            enabled,
            variant: if enabled {
                variant(logic, hashes)
            } else {
                None
            },
            code: ReasonCode::SuperConditionValue,
            condition_index: Some(0),
        }))
    }

    /// The first condition whose filters match and whose rollout admits wins. A rollout
    /// miss beats a filter miss as the reported reason (and ends the walk with early_exit).
    fn conditions(
        &self,
        logic: &Logic,
        target: &Props<'_>,
        hashes: &mut FlagHashes<'_>,
    ) -> Result<Decision, FailureCause> {
        let mut code = ReasonCode::NoConditionMatch;
        let mut index = None;
        for (i, condition) in logic.conditions.iter().enumerate() {
            index.get_or_insert(i);
            if !self.all(&condition.filters, target)? {
                continue;
            }
            if !in_rollout(condition.rollout, || hashes.rollout()) {
                if logic.early_exit {
                    return Ok(Decision::off(ReasonCode::OutOfRolloutBound, Some(i)));
                }
                if code != ReasonCode::OutOfRolloutBound {
                    code = ReasonCode::OutOfRolloutBound;
                    index = Some(i);
                }
                continue;
            }
            let variant = match condition.variant {
                Some(v) => logic.variants.get(v).map(|v| v.key.clone()),
                None => variant(logic, hashes),
            };
            return Ok(Decision {
                enabled: true,
                variant,
                code: ReasonCode::ConditionMatch,
                condition_index: Some(i),
            });
        }
        Ok(Decision::off(code, index))
    }

    fn all(&self, filters: &[Leaf], target: &Props<'_>) -> Result<bool, FailureCause> {
        for leaf in filters {
            if !self.leaf(leaf, target)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn leaf(&self, leaf: &Leaf, target: &Props<'_>) -> Result<bool, FailureCause> {
        let (matched, negate) = match leaf {
            Leaf::Property {
                key,
                operator,
                negate,
            } => (operator.matches(target.get(key)?, self.ctx.now), *negate),
            Leaf::Cohort {
                cohort,
                member,
                negate,
            } => {
                let CohortRef::Index(i) = cohort else {
                    return Err(FailureCause::MissingDependency);
                };
                (self.cohort(*i)? == *member, *negate)
            }
            Leaf::Flag {
                flag,
                expect,
                negate,
            } => {
                let FlagRef::Index(j) = flag else {
                    return Err(FailureCause::MissingDependency);
                };
                let matched = match self.slots.get(*j) {
                    Some(Slot::Done(dep)) => expect.accepts(dep.enabled, dep.variant.as_deref()),
                    Some(Slot::Skipped) => expect.accepts(false, None),
                    Some(Slot::Failed(cause)) => return Err(cause.clone()),
                    None => return Err(FailureCause::MissingDependency),
                };
                (matched, *negate)
            }
        };
        Ok(matched != negate)
    }

    fn cohort(&self, index: usize) -> Result<bool, FailureCause> {
        let cohorts = &self.rules.cohorts;
        match (cohorts.trees.get(index), cohorts.usable.get(index)) {
            (Some(tree), Some(true)) => self.tree(tree),
            _ => Err(FailureCause::MissingDependency),
        }
    }

    fn tree(&self, tree: &Tree) -> Result<bool, FailureCause> {
        match tree {
            Tree::All(children) => {
                for child in children {
                    if !self.tree(child)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            Tree::Any(children) => {
                for child in children {
                    if self.tree(child)? {
                        return Ok(true);
                    }
                }
                Ok(children.is_empty())
            }
            Tree::Leaf(leaf) => self.leaf(leaf, &self.person()),
        }
    }

    fn person(&self) -> Props<'r> {
        match self.ctx.person_properties {
            Some(map) => Props::Known(Some(map)),
            None => Props::Failed(FailureCause::PersonProperties),
        }
    }

    fn group_props(&self, name: &str) -> Props<'r> {
        match self.ctx.group_properties.get(name) {
            Some(Some(map)) => Props::Known(Some(map)),
            Some(None) => Props::Failed(FailureCause::GroupProperties(name.to_owned())),
            None => Props::Known(None),
        }
    }

    /// The id a person flag buckets by: with experience continuity, the id the person had
    /// when first seen, so identify/alias does not reshuffle them.
    fn person_bucket(&self, logic: &Logic) -> &'r str {
        let ctx = self.ctx;
        if logic.continuity {
            let first_seen = ctx.hash_key_override.filter(|id| !id.is_empty());
            let anon = ctx.anon_distinct_id.filter(|id| !id.is_empty());
            first_seen.or(anon).unwrap_or(ctx.distinct_id)
        } else {
            ctx.distinct_id
        }
    }
}

/// A group key from the request: strings as is, numbers as decimal text.
fn group_key(value: &Value) -> Option<Cow<'_, str>> {
    match value {
        Value::String(s) if !s.is_empty() => Some(Cow::Borrowed(s)),
        Value::Number(n) => Some(Cow::Owned(n.to_string())),
        _ => None,
    }
}

/// The variant whose running boundary first exceeds the variant hash; none (a plain
/// `true`) for boolean flags or when rounding leaves the hash past the last boundary.
fn variant(logic: &Logic, hashes: &mut FlagHashes<'_>) -> Option<String> {
    if logic.variants.is_empty() {
        return None;
    }
    let hash = hashes.variant();
    logic
        .variants
        .iter()
        .find(|v| v.boundary > hash)
        .map(|v| v.key.clone())
}
