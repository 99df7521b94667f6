//! Evaluation of a compiled project for one request, in PostHog's order: early access,
//! holdout, then conditions in stored order. Each condition reads and buckets by its own
//! aggregation (the person, or a group named by the condition or the flag), and each
//! property filter reads the properties its `type` names. Flags are computed in
//! dependency order and reported in definition order. Property lookups are lazy: a
//! failed person (or group) lookup only fails the flags that actually read it, and their
//! dependents.
//!
//! What one request would compute twice, it computes once: each property key's value,
//! each person test that several filters make (flags and cohorts often test the same
//! property the same way, such as one URL pattern), and each hash whose input repeats
//! (the holdout hash, which has no flag key, and a flag's own hashes reused by its
//! early-access condition and by conditions that bucket alike). The per-request memory
//! for these sits on the stack for files of up to `STACK_SLOTS` keys and shared tests.

use std::borrow::Cow;
use std::cell::Cell;

use serde_json::Value;

use super::compile::ProjectRules;
use super::filter::{CohortRef, FlagRef, Leaf, Source};
use super::flag::{Aggregation, Condition, Flag, Logic};
use super::hash::{in_rollout, Computed, FlagHashes};
use super::outcome::{variant_key, Decision, Outcomes, Pick, Seen, Slot};
use super::props::find;
use super::result::{Context, Evaluation, FailureCause, ReasonCode};

mod cohorts;
mod memo;

use memo::{Known, Lookup, Memo, STACK_SLOTS};

impl ProjectRules {
    /// Evaluates every active flag for one request.
    pub fn evaluate(&self, ctx: &Context<'_>) -> Evaluation {
        self.outcomes(ctx).to_evaluation()
    }

    /// Evaluates every active flag for one request, without copying anything out of the
    /// rules: for writing a response straight away.
    pub fn outcomes(&self, ctx: &Context<'_>) -> Outcomes<'_> {
        self.outcomes_noting(ctx, false)
    }

    /// [`ProjectRules::outcomes`] at an edge: the outcomes also note which person
    /// properties the evaluation found, so that the edge's verdicts
    /// ([`ProjectRules::inconclusive`]) need not look them up again.
    pub fn outcomes_at_edge(&self, ctx: &Context<'_>) -> Outcomes<'_> {
        self.outcomes_noting(ctx, true)
    }

    // Inlined into both callers, so plain serving's copy does no noting at all.
    #[inline(always)]
    fn outcomes_noting(&self, ctx: &Context<'_>, note: bool) -> Outcomes<'_> {
        // Only built when a filter reads `distinct_id`, so other projects pay nothing.
        let distinct = self
            .distinct_id_slot
            .map(|_| Value::String(ctx.distinct_id.to_owned()));
        if self.property_keys <= STACK_SLOTS && self.predicates <= STACK_SLOTS {
            let lookups: [Lookup<'_>; STACK_SLOTS] = [const { Cell::new(None) }; STACK_SLOTS];
            let known: [Known; STACK_SLOTS] = [const { Cell::new(None) }; STACK_SLOTS];
            let mut outcomes = self.outcomes_with(ctx, distinct.as_ref(), &lookups, &known);
            if note {
                outcomes.seen = memo::seen(&lookups[..self.property_keys]);
            }
            outcomes
        } else {
            let lookups: Vec<Lookup<'_>> = vec![Cell::new(None); self.property_keys];
            let known: Vec<Known> = vec![Cell::new(None); self.predicates];
            let mut outcomes = self.outcomes_with(ctx, distinct.as_ref(), &lookups, &known);
            if note {
                outcomes.seen = memo::seen(&lookups);
            }
            outcomes
        }
    }

    fn outcomes_with<'c>(
        &self,
        ctx: &Context<'c>,
        distinct: Option<&'c Value>,
        lookups: &[Lookup<'c>],
        known: &[Known],
    ) -> Outcomes<'_> {
        let mut slots: Vec<Slot> = self
            .flags
            .iter()
            .map(|flag| {
                if flag.unsupported {
                    Slot::Failed(FailureCause::Unsupported)
                } else if flag.logic.is_some() && flag.broken {
                    Slot::Done(Decision::off(ReasonCode::MissingDependency, None))
                } else {
                    Slot::Skipped
                }
            })
            .collect();
        let memo = Memo {
            lookups,
            known,
            holdout: Cell::new(None),
            distinct,
        };
        for &i in &self.order {
            let flag = &self.flags[i];
            let Some(logic) = &flag.logic else { continue };
            let env = Env {
                rules: self,
                ctx,
                slots: &slots,
                memo: &memo,
            };
            slots[i] = match env.flag(flag, logic) {
                Ok(decision) => Slot::Done(decision),
                Err(cause) => Slot::Failed(cause),
            };
        }
        Outcomes {
            rules: self,
            slots,
            unknown_named: false,
            seen: Seen::default(),
        }
    }
}

struct Env<'r, 'c> {
    rules: &'r ProjectRules,
    ctx: &'r Context<'c>,
    slots: &'r [Slot],
    memo: &'r Memo<'r, 'c>,
}

/// The most telling non-match so far and its condition, as PostHog ranks them:
/// out of rollout beats no match beats a missing group; among equals the later wins.
struct Miss {
    code: ReasonCode,
    index: Option<usize>,
}

impl Miss {
    fn rank(code: ReasonCode) -> u8 {
        match code {
            ReasonCode::OutOfRolloutBound => 3,
            ReasonCode::NoConditionMatch => 2,
            _ => 1,
        }
    }

    fn note(&mut self, code: ReasonCode, index: usize) {
        if Miss::rank(code) >= Miss::rank(self.code) {
            self.code = code;
            self.index = Some(index);
        }
    }
}

impl<'r, 'c> Env<'r, 'c> {
    // Runs once per flag per request; inlined into the flag loop (with the condition
    // loops into it) so a flag costs no call frames: about 1,100 instructions a request
    // on the 50-flag mix.
    #[inline(always)]
    fn flag(&self, flag: &Flag, logic: &Logic) -> Result<Decision, FailureCause> {
        let key = flag.header.key.as_str();
        let early_access = logic.enrollment.is_some() || logic.super_condition.is_some();
        let person_bucket = self.person_bucket(logic);
        // The flag's own bucketing id: the person's, or its group's key (`None` when the
        // request lacks that group; then every condition on it reads `no_group_type`).
        let bucket = match &logic.aggregation {
            Some(aggregation) => self.group_key(aggregation),
            None => Some(Cow::Borrowed(person_bucket)),
        };
        let Some(bucket) = bucket else {
            return self.conditions(key, logic, None);
        };
        let mut hashes = FlagHashes::new(key, &bucket);
        if early_access {
            // A person flag's early-access hash is its own rollout hash.
            let shared = logic.aggregation.is_none().then_some(&mut hashes);
            if let Some(decision) = self.early_access(key, logic, person_bucket, shared)? {
                return Ok(decision);
            }
        }
        if let Some(holdout) = &logic.holdout {
            if in_rollout(holdout.percentage, || self.holdout_hash(&bucket)) {
                return Ok(Decision {
                    enabled: true,
                    pick: Pick::Holdout,
                    code: ReasonCode::HoldoutConditionValue,
                    condition_index: None,
                });
            }
        }
        self.conditions(key, logic, Some(&mut hashes))
    }

    /// `feature_enrollment` (the person's `$feature_enrollment/<key>`: true or "true"
    /// enables), else legacy `super_groups[0]`; each decides only when the person has
    /// the property it is about, and never picks a variant. `shared` are the flag's own
    /// hashes when it buckets by `person_bucket` too.
    fn early_access<'h>(
        &self,
        key: &'h str,
        logic: &Logic,
        person_bucket: &'h str,
        shared: Option<&mut FlagHashes<'h>>,
    ) -> Result<Option<Decision>, FailureCause> {
        let person = self.person();
        let mut decided = None;
        if let Some(property) = &logic.enrollment {
            if let Some(value) = person.get(property)? {
                decided = Some(matches!(value, Value::Bool(true)) || value == "true");
            }
        } else if let Some(sup) = &logic.super_condition {
            let mut present = false;
            for key in &sup.keys {
                present |= person.get(key)?.is_some();
            }
            if present {
                let condition = &sup.condition;
                let mut own;
                let hashes = match shared {
                    Some(hashes) => hashes,
                    None => {
                        own = FlagHashes::new(key, person_bucket);
                        &mut own
                    }
                };
                decided = Some(
                    self.all(&condition.filters, None)?
                        && in_rollout(condition.rollout, || hashes.rollout()),
                );
            }
        }
        Ok(decided.map(|enabled| Decision {
            enabled,
            pick: Pick::None,
            code: ReasonCode::SuperConditionValue,
            condition_index: Some(0),
        }))
    }

    /// The first condition whose filters match and whose rollout admits wins. `hashes`
    /// are the flag's own bucketing (`None` when its group is missing); a condition with
    /// a different aggregation buckets by its own id.
    #[inline(always)]
    fn conditions(
        &self,
        key: &str,
        logic: &Logic,
        mut hashes: Option<&mut FlagHashes<'_>>,
    ) -> Result<Decision, FailureCause> {
        if !logic.own_buckets {
            return match hashes {
                Some(hashes) => self.shared_conditions(logic, hashes),
                // Every condition needs the missing group; the last one is reported.
                None => Ok(Decision::off(
                    ReasonCode::NoGroupType,
                    logic.conditions.len().checked_sub(1),
                )),
            };
        }
        let flag_index = logic.aggregation.as_ref().map(|a| a.index);
        let mut miss = Miss {
            code: ReasonCode::NoGroupType,
            index: None,
        };
        // The last other aggregation seen, its bucketing id and the hashes known for it,
        // for the next condition on it.
        let mut other: Option<(Option<i64>, Option<Cow<'c, str>>, Computed)> = None;
        for (i, condition) in logic.conditions.iter().enumerate() {
            let own_index = condition.aggregation.as_ref().map(|a| a.index);
            let step = if own_index == flag_index {
                match hashes.as_deref_mut() {
                    Some(hashes) => self.condition(logic, condition, i, hashes)?,
                    None => Err(ReasonCode::NoGroupType),
                }
            } else {
                if other.as_ref().map(|(index, ..)| *index) != Some(own_index) {
                    let own_bucket = match &condition.aggregation {
                        Some(aggregation) => self.group_key(aggregation),
                        None => Some(Cow::Borrowed(self.person_bucket(logic))),
                    };
                    other = Some((own_index, own_bucket, Computed::default()));
                }
                match &mut other {
                    Some((_, Some(bucket), known)) => {
                        let mut own = FlagHashes::resume(key, bucket, *known);
                        let step = self.condition(logic, condition, i, &mut own)?;
                        *known = own.known();
                        step
                    }
                    _ => Err(ReasonCode::NoGroupType),
                }
            };
            match step {
                Ok(decision) => return Ok(decision),
                Err(ReasonCode::OutOfRolloutBound) if logic.early_exit => {
                    return Ok(Decision::off(ReasonCode::OutOfRolloutBound, Some(i)));
                }
                Err(code) => miss.note(code, i),
            }
        }
        Ok(Decision::off(miss.code, miss.index))
    }

    /// [`Env::conditions`] when every condition buckets by the flag's own id (most flags):
    /// one set of hashes, no per-condition bucketing.
    #[inline(always)]
    fn shared_conditions(
        &self,
        logic: &Logic,
        hashes: &mut FlagHashes<'_>,
    ) -> Result<Decision, FailureCause> {
        let mut miss = Miss {
            code: ReasonCode::NoGroupType,
            index: None,
        };
        for (i, condition) in logic.conditions.iter().enumerate() {
            if !self.all(&condition.filters, condition.aggregation.as_ref())? {
                miss.note(ReasonCode::NoConditionMatch, i);
                continue;
            }
            if !in_rollout(condition.rollout, || hashes.rollout()) {
                if logic.early_exit {
                    return Ok(Decision::off(ReasonCode::OutOfRolloutBound, Some(i)));
                }
                miss.note(ReasonCode::OutOfRolloutBound, i);
                continue;
            }
            return Ok(Decision {
                enabled: true,
                pick: pick(condition, logic, hashes),
                code: ReasonCode::ConditionMatch,
                condition_index: Some(i),
            });
        }
        Ok(Decision::off(miss.code, miss.index))
    }

    /// One condition: the decision when it matches, else why not.
    fn condition(
        &self,
        logic: &Logic,
        condition: &Condition,
        i: usize,
        hashes: &mut FlagHashes<'_>,
    ) -> Result<Result<Decision, ReasonCode>, FailureCause> {
        if !self.all(&condition.filters, condition.aggregation.as_ref())? {
            return Ok(Err(ReasonCode::NoConditionMatch));
        }
        if !in_rollout(condition.rollout, || hashes.rollout()) {
            return Ok(Err(ReasonCode::OutOfRolloutBound));
        }
        Ok(Ok(Decision {
            enabled: true,
            pick: pick(condition, logic, hashes),
            code: ReasonCode::ConditionMatch,
            condition_index: Some(i),
        }))
    }

    /// Whether every filter matches; group filters without their own group type read
    /// the condition's `aggregation`.
    fn all(
        &self,
        filters: &[Leaf],
        aggregation: Option<&Aggregation>,
    ) -> Result<bool, FailureCause> {
        for leaf in filters {
            if !self.leaf(leaf, aggregation)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn leaf(&self, leaf: &Leaf, aggregation: Option<&Aggregation>) -> Result<bool, FailureCause> {
        let (matched, negate) = match leaf {
            Leaf::Property {
                key,
                slot,
                predicate,
                source,
                operator,
                negate,
            } => {
                let matched = match source {
                    Source::Person => self.person_test(key, *slot, *predicate, operator)?,
                    Source::Group(index) => {
                        let index = index.or(aggregation.map(|a| a.index));
                        let name = index.and_then(|i| self.rules.group_type_mapping().get(&i));
                        let actual = match name {
                            Some(name) => self.group_props(name).get(key)?,
                            None => None,
                        };
                        operator.matches(actual, self.ctx.now)
                    }
                };
                (matched, *negate)
            }
            Leaf::Cohort {
                cohort,
                member,
                negate,
            } => {
                let CohortRef::Index(i) = cohort else {
                    return Err(FailureCause::Unsupported);
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

    /// The request's key for a group aggregation; `None` when the type is unmapped or
    /// the request has no such group.
    fn group_key(&self, aggregation: &Aggregation) -> Option<Cow<'c, str>> {
        let name = aggregation.name.as_deref()?;
        group_key(find(self.ctx.groups, name)?)
    }

    /// The id a person flag buckets by: with experience continuity, the id the person had
    /// when first seen, so identify/alias does not reshuffle them.
    fn person_bucket(&self, logic: &Logic) -> &'c str {
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

/// A matched condition's value: its variant override when it names a defined variant,
/// else the variant hash's pick.
fn pick(condition: &Condition, logic: &Logic, hashes: &mut FlagHashes<'_>) -> Pick {
    match condition.variant {
        Some(v) if v < logic.variants.len() => Pick::Variant(v),
        _ => variant(logic, hashes),
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
