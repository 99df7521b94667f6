//! Evaluation of a compiled project for one request, in PostHog's order: group presence,
//! early access, holdout, then conditions in stored order. Flags are computed in dependency
//! order and reported in definition order. Property lookups are lazy: a failed person (or
//! group) lookup only fails the flags that actually read it, and their dependents.

use std::borrow::Cow;
use std::cell::Cell;

use serde_json::{Map, Value};

use super::cohort::Tree;
use super::compile::ProjectRules;
use super::filter::{CohortRef, FlagRef, Leaf};
use super::flag::{Flag, Logic};
use super::hash::{holdout_hash, in_rollout, FlagHashes};
use super::outcome::{variant_key, Decision, Outcomes, Pick, Slot};
use super::result::{Context, Evaluation, FailureCause, ReasonCode};

/// One property key's value for the request, remembered from its first lookup on (the
/// outer `None` is "not looked up yet"). Indexed by the filters' slots.
type Lookup<'c> = Cell<Option<Option<&'c Value>>>;

/// Where property filters read from; `Failed` when the lookup did not succeed.
#[derive(Clone)]
enum Props<'a, 'c> {
    Known(Option<&'c Map<String, Value>>),
    /// The person's properties: most filters read them, many read the same keys, so
    /// each key is hashed and found once per request.
    Person(&'c Map<String, Value>, &'a [Lookup<'c>]),
    Failed(FailureCause),
}

impl<'c> Props<'_, 'c> {
    fn get(&self, key: &str) -> Result<Option<&'c Value>, FailureCause> {
        match self {
            Props::Known(map) => Ok(map.and_then(|m| m.get(key))),
            Props::Person(map, _) => Ok(map.get(key)),
            Props::Failed(cause) => Err(cause.clone()),
        }
    }

    /// [`Props::get`] for a filter's key, whose number among the file's keys is `slot`.
    fn lookup(&self, key: &str, slot: usize) -> Result<Option<&'c Value>, FailureCause> {
        let Props::Person(map, lookups) = self else {
            return self.get(key);
        };
        let Some(lookup) = lookups.get(slot) else {
            return Ok(map.get(key));
        };
        if let Some(found) = lookup.get() {
            return Ok(found);
        }
        let found = map.get(key);
        lookup.set(Some(found));
        Ok(found)
    }
}

impl ProjectRules {
    /// Evaluates every active flag for one request.
    pub fn evaluate(&self, ctx: &Context<'_>) -> Evaluation {
        self.outcomes(ctx).to_evaluation()
    }

    /// Evaluates every active flag for one request, without copying anything out of the
    /// rules: for writing a response straight away.
    pub fn outcomes(&self, ctx: &Context<'_>) -> Outcomes<'_> {
        let mut slots: Vec<Slot> = self
            .flags
            .iter()
            .map(|flag| match (&flag.logic, flag.broken) {
                (Some(_), true) => Slot::Failed(FailureCause::MissingDependency),
                _ => Slot::Skipped,
            })
            .collect();
        let lookups: Vec<Lookup<'_>> = vec![Cell::new(None); self.property_keys];
        for &i in &self.order {
            let flag = &self.flags[i];
            let Some(logic) = &flag.logic else { continue };
            let env = Env {
                rules: self,
                ctx,
                slots: &slots,
                lookups: &lookups,
            };
            slots[i] = match env.flag(flag, logic) {
                Ok(decision) => Slot::Done(decision),
                Err(cause) => Slot::Failed(cause),
            };
        }
        Outcomes { rules: self, slots }
    }
}

struct Env<'r, 'c> {
    rules: &'r ProjectRules,
    ctx: &'r Context<'c>,
    slots: &'r [Slot],
    lookups: &'r [Lookup<'c>],
}

impl<'r, 'c> Env<'r, 'c> {
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
                    pick: Pick::Holdout,
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
            pick: if enabled {
                variant(logic, hashes)
            } else {
                Pick::None
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
        target: &Props<'_, '_>,
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
            let pick = match condition.variant {
                Some(v) if v < logic.variants.len() => Pick::Variant(v),
                Some(_) => Pick::None,
                None => variant(logic, hashes),
            };
            return Ok(Decision {
                enabled: true,
                pick,
                code: ReasonCode::ConditionMatch,
                condition_index: Some(i),
            });
        }
        Ok(Decision::off(code, index))
    }

    fn all(&self, filters: &[Leaf], target: &Props<'_, '_>) -> Result<bool, FailureCause> {
        for leaf in filters {
            if !self.leaf(leaf, target)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn leaf(&self, leaf: &Leaf, target: &Props<'_, '_>) -> Result<bool, FailureCause> {
        let (matched, negate) = match leaf {
            Leaf::Property {
                key,
                slot,
                operator,
                negate,
            } => (
                operator.matches(target.lookup(key, *slot)?, self.ctx.now),
                *negate,
            ),
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
                    Some(Slot::Done(dep)) => {
                        let logic = self.rules.flags.get(*j).and_then(|f| f.logic.as_ref());
                        let variant = logic.and_then(|logic| variant_key(logic, dep.pick));
                        expect.accepts(dep.enabled, variant)
                    }
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

    fn person(&self) -> Props<'r, 'c> {
        match self.ctx.person_properties {
            Some(map) => Props::Person(map, self.lookups),
            None => Props::Failed(FailureCause::PersonProperties),
        }
    }

    fn group_props(&self, name: &str) -> Props<'r, 'c> {
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
fn variant(logic: &Logic, hashes: &mut FlagHashes<'_>) -> Pick {
    if logic.variants.is_empty() {
        return Pick::None;
    }
    let hash = hashes.variant();
    match logic.variants.iter().position(|v| v.boundary > hash) {
        Some(i) => Pick::Variant(i),
        None => Pick::None,
    }
}
