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

use serde_json::{Map, Value};

use super::cohort::Tree;
use super::compile::ProjectRules;
use super::filter::{CohortRef, FlagRef, Leaf, Source};
use super::flag::{Aggregation, Condition, Logic};
use super::outcome::{Outcomes, Slot};
use super::props::{find, person_get};
use super::result::Context;

impl ProjectRules {
    /// One entry per flag of the rules, in definition order: true when the flag, as
    /// `outcomes` computed it for `ctx`, may differ from upstream's answer. Flags that
    /// failed locally are inconclusive too: upstream may be able to compute them.
    pub fn inconclusive(&self, ctx: &Context<'_>, outcomes: &Outcomes<'_>) -> Vec<bool> {
        let mut out = vec![false; self.flags.len()];
        let walk = Walk {
            rules: self,
            ctx,
            distinct: Value::String(ctx.distinct_id.to_owned()),
        };
        for (i, (flag, slot)) in self.flags.iter().zip(&outcomes.slots).enumerate() {
            if flag.unsupported || matches!(slot, Slot::Failed(_)) {
                out[i] = true;
            }
        }
        // Dependency order, so a flag reads its dependencies' verdicts.
        for &i in &self.order {
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
    /// The request's distinct id as the `distinct_id` property PostHog adds.
    distinct: Value,
}

impl Walk<'_, '_> {
    fn flag(&self, logic: &Logic, verdicts: &[bool]) -> bool {
        // Upstream buckets a continuity flag by the first-seen id it stores (and writes
        // it when the request carries `$anon_distinct_id`).
        if logic.continuity {
            return true;
        }
        if let Some(property) = &logic.enrollment {
            if self.person(property).is_none() {
                return true;
            }
        }
        if let Some(sup) = &logic.super_condition {
            if sup.keys.iter().any(|key| self.person(key).is_none())
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
                source: Source::Person,
                ..
            } => self.person(key).is_none(),
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
            Tree::Leaf(Leaf::Property { key, .. }) => self.person(key).is_none(),
            Tree::Leaf(Leaf::Cohort { cohort, .. }) => match cohort {
                CohortRef::Missing(_) => true,
                CohortRef::Index(i) => self.cohort(*i),
            },
            Tree::Leaf(Leaf::Flag { .. }) => true,
        }
    }

    /// A person property's value as the edge knows it; `None` when it does not.
    fn person(&self, key: &str) -> Option<&Value> {
        let props: &Map<String, Value> = self.ctx.person_properties?;
        person_get(props, key, Some(&self.distinct))
    }
}
