//! Which flags an edge cannot decide exactly as its upstream would (edge mode only; local
//! evaluation never calls this, so it costs plain serving nothing). The classes are
//! those of PostHog's SDK local evaluation (posthog-node's `InconclusiveMatchError` and
//! `RequiresServerEvaluation`, posthog-python's `InconclusiveMatchError`), made
//! stricter where an edge must be: the SDKs answer `is_not_set` on a property the
//! caller did not pass as true, but upstream may have that property stored, so any
//! test of a property the edge does not have is inconclusive, whatever its operator.
//!
//! A flag is inconclusive when any of its conditions (or its early-access condition)
//! reads something the edge lacks, not only the first condition that would decide:
//! the answer carries the deciding condition's index and reason, and a condition the
//! edge cannot read might have been the one upstream decided by.
//!
//! Only the flags the request is answered (and what they depend on) are walked, and a
//! person property is looked up once a request however many filters read it: this
//! runs on every `/decide` at an edge, beside the evaluation itself.

use std::cell::Cell;

use serde_json::Map;

use super::cohort::Tree;
use super::compile::ProjectRules;
use super::compile::DISTINCT_ID;
use super::filter::{CohortRef, FlagRef, Leaf, Source};
use super::flag::{Aggregation, Condition, Logic};
use super::outcome::{Outcomes, Slot};
use super::props::find;
use super::result::Context;

impl ProjectRules {
    /// One entry per flag of the rules, in definition order: true when the flag, as
    /// `outcomes` computed it for `ctx`, may differ from upstream's answer. Flags that
    /// failed locally are inconclusive too: upstream may be able to compute them. A
    /// flag `outcomes` leaves unanswered (not named, or inactive) gets a verdict only
    /// when an answered flag depends on it; the others read false.
    pub fn inconclusive(&self, ctx: &Context<'_>, outcomes: &Outcomes<'_>) -> Vec<bool> {
        let mut out = vec![false; self.flags.len()];
        let known = vec![Cell::new(None); self.property_keys];
        let walk = Walk {
            rules: self,
            ctx,
            known: &known,
        };
        let answered = |i: usize| !matches!(outcomes.slots[i], Slot::Skipped);
        let mut wanted: Vec<bool> = (0..self.flags.len()).map(answered).collect();
        // Dependents come after their dependencies in `order`: walking it backwards
        // marks what each wanted flag depends on before that flag is reached.
        for &i in self.order.iter().rev() {
            if wanted[i] {
                for &j in &self.flags[i].deps {
                    wanted[j] = true;
                }
            }
        }
        for (i, (flag, slot)) in self.flags.iter().zip(&outcomes.slots).enumerate() {
            if flag.unsupported || matches!(slot, Slot::Failed(_)) {
                out[i] = true;
            }
        }
        // Dependency order, so a flag reads its dependencies' verdicts.
        for &i in self.order.iter().filter(|&&i| wanted[i]) {
            let Some(logic) = &self.flags[i].logic else {
                continue;
            };
            out[i] = out[i] || walk.flag(logic, &out);
        }
        out
    }

    /// The keys of the rules' flags, in definition order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.flags.iter().map(|f| f.header.key.as_str())
    }
}

struct Walk<'a, 'c> {
    rules: &'a ProjectRules,
    ctx: &'a Context<'c>,
    /// Whether the edge has each property key (by its slot), once looked up.
    known: &'a [Cell<Option<bool>>],
}

impl Walk<'_, '_> {
    fn flag(&self, logic: &Logic, verdicts: &[bool]) -> bool {
        // Upstream buckets a continuity flag by the first-seen id it stores (and writes
        // it when the request carries `$anon_distinct_id`).
        if logic.continuity {
            return true;
        }
        if let Some(property) = &logic.enrollment {
            if !self.has_person(property) {
                return true;
            }
        }
        if let Some(sup) = &logic.super_condition {
            if sup.keys.iter().any(|key| !self.has_person(key))
                || self.condition(&sup.condition, verdicts)
            {
                return true;
            }
        }
        logic
            .conditions
            .iter()
            .any(|condition| self.condition(condition, verdicts))
    }

    fn condition(&self, condition: &Condition, verdicts: &[bool]) -> bool {
        if let Some(aggregation) = &condition.aggregation {
            match aggregation.name.as_deref() {
                // A group type the mapping does not name: the SDKs' "unknown group type
                // index".
                None => return true,
                // Without the group in the request, upstream reads `no_group_type` too.
                Some(name) if find(self.ctx.groups, name).is_none() => return false,
                Some(_) => {}
            }
        }
        condition
            .filters
            .iter()
            .any(|leaf| self.leaf(leaf, condition.aggregation.as_ref(), verdicts))
    }

    fn leaf(&self, leaf: &Leaf, aggregation: Option<&Aggregation>, verdicts: &[bool]) -> bool {
        match leaf {
            Leaf::Property {
                key,
                slot,
                source: Source::Person,
                ..
            } => !self.has_slot(key, *slot),
            Leaf::Property {
                key,
                source: Source::Group(index),
                ..
            } => {
                let index = index.or(aggregation.map(|a| a.index));
                let Some(name) = index.and_then(|i| self.rules.group_type_mapping().get(&i)) else {
                    return true;
                };
                if find(self.ctx.groups, name).is_none() {
                    return false;
                }
                match self.ctx.group_properties.get(name) {
                    Some(Some(props)) => find(props, key).is_none(),
                    // The group's lookup failed, or it has no properties here at all.
                    _ => true,
                }
            }
            Leaf::Cohort { cohort, .. } => match cohort {
                // Static cohorts are left out of the feed: only upstream knows members.
                CohortRef::Missing(_) => true,
                CohortRef::Index(i) => self.cohort(*i),
            },
            Leaf::Flag { flag, .. } => match flag {
                FlagRef::Missing(_) => true,
                FlagRef::Index(j) => verdicts.get(*j).copied().unwrap_or(true),
            },
        }
    }

    fn cohort(&self, index: usize) -> bool {
        let cohorts = &self.rules.cohorts;
        match (cohorts.trees.get(index), cohorts.usable.get(index)) {
            (Some(tree), Some(true)) => self.tree(tree),
            _ => true,
        }
    }

    fn tree(&self, tree: &Tree) -> bool {
        match tree {
            Tree::All(children) | Tree::Any(children) => children.iter().any(|c| self.tree(c)),
            // Cohort leaves read the person whatever their type says.
            Tree::Leaf(Leaf::Property { key, slot, .. }) => !self.has_slot(key, *slot),
            Tree::Leaf(Leaf::Cohort { cohort, .. }) => match cohort {
                CohortRef::Missing(_) => true,
                CohortRef::Index(i) => self.cohort(*i),
            },
            Tree::Leaf(Leaf::Flag { .. }) => true,
        }
    }

    /// Whether the edge knows the person property `key` (PostHog fills `distinct_id`
    /// from the request when the person has none).
    fn has_person(&self, key: &str) -> bool {
        let Some(props): Option<&Map<_, _>> = self.ctx.person_properties else {
            return false;
        };
        find(props, key).is_some() || key == DISTINCT_ID
    }

    /// [`Walk::has_person`] for a filter's key, looked up once a request by its slot.
    fn has_slot(&self, key: &str, slot: usize) -> bool {
        let Some(known) = self.known.get(slot) else {
            return self.has_person(key);
        };
        if let Some(has) = known.get() {
            return has;
        }
        let has = self.has_person(key);
        known.set(Some(has));
        has
    }
}
