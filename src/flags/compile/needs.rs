//! What each flag needs from a request for an edge to decide it exactly as its upstream
//! would, read once per rules from every condition, the early-access settings and the
//! cohorts the flag uses: the person properties it reads, the groups' properties, the
//! flags whose verdicts it takes on, and whether it is inconclusive whatever a request
//! carries. The evaluation stops at a flag's first matching condition, but a verdict
//! must consider them all (`inconclusive`); reading them here instead of on every
//! request leaves a request a few short lists to check against what it has, and a flag
//! that reads nothing an edge may lack (a plain rollout, a variant split) is not
//! visited at all.
//!
//! Built on an edge's first verdict for a set of rules, so plain serving never builds it.

use std::collections::HashMap;

use super::super::cohort::Tree;
use super::super::filter::{CohortRef, FlagRef, Leaf, Source};
use super::super::flag::{Aggregation, Condition, Logic};
use super::{ProjectRules, DISTINCT_ID};

/// The person keys a check tracks one bit each: the width of a `u64` mask, as the
/// evaluation's `Seen` (`flags::outcome`) records them.
pub(in crate::flags) const SLOTS: usize = u64::BITS as usize;

/// The needs of every flag of one set of rules.
#[derive(Debug, Default)]
pub(in crate::flags) struct Needs {
    /// One entry per flag, in definition order.
    pub(in crate::flags) flags: Vec<Reads>,
    /// The evaluated flags that read only person properties of the first
    /// [`SLOTS`] slots (most flags), each with those slots as a mask: a request
    /// that has every one of them passes them all at once.
    pub(in crate::flags) simple: Vec<(usize, u64)>,
    /// Every slot the simple flags read.
    pub(in crate::flags) union: u64,
    /// The other evaluated flags that read anything, in evaluation (dependency) order.
    pub(in crate::flags) complex: Vec<usize>,
    /// Flags another evaluated flag depends on (and so may take the verdict of).
    pub(in crate::flags) read: Vec<usize>,
    /// Flags left out as unsupported: inconclusive on every request.
    pub(in crate::flags) unsupported: Vec<usize>,
    /// The person key of each of the first [`SLOTS`] slots a check reads.
    pub(in crate::flags) keys: Vec<Box<str>>,
    /// How many person property keys the checks look up: the filters' slots, then the
    /// early-access keys no filter reads.
    pub(in crate::flags) slots: usize,
}

/// What one flag (or one group-aggregated condition of it) reads that an edge may lack.
#[derive(Debug, Default, Clone)]
pub(in crate::flags) struct Reads {
    /// Inconclusive whatever the request carries: experience continuity, a static or
    /// unusable cohort, a group type the mapping does not name, a dependency on a flag
    /// a cohort cannot evaluate.
    pub(in crate::flags) always: bool,
    /// Reads some person property, so the person's properties must be known at all.
    pub(in crate::flags) person: bool,
    /// The person properties that must be present, by slot (`distinct_id` is never
    /// missing once the properties are known, so it is not listed).
    pub(in crate::flags) keys: Vec<(usize, Box<str>)>,
    /// Group properties (group type name, key) that must be present when the request
    /// names the group.
    pub(in crate::flags) groups: Vec<(Box<str>, Box<str>)>,
    /// Flags whose verdicts this one takes on.
    pub(in crate::flags) verdicts: Vec<usize>,
    /// Conditions aggregated by a group, by its type name: they read anything only when
    /// the request names the group (without it upstream answers `no_group_type` too).
    pub(in crate::flags) gated: Vec<(Box<str>, Reads)>,
}

impl Reads {
    /// Nothing to check: the flag is conclusive on every request.
    fn is_empty(&self) -> bool {
        !self.always
            && !self.person
            && self.groups.is_empty()
            && self.verdicts.is_empty()
            && self.gated.is_empty()
    }

    /// The slots a flag that reads only the person's first [`SLOTS`] keys reads,
    /// as a mask; `None` for any other flag.
    fn mask(&self) -> Option<u64> {
        let simple = !self.always
            && self.groups.is_empty()
            && self.verdicts.is_empty()
            && self.gated.is_empty()
            && self.keys.iter().all(|(slot, _)| *slot < SLOTS);
        simple.then(|| self.keys.iter().fold(0, |mask, (slot, _)| mask | 1 << slot))
    }

    fn merge(&mut self, other: Reads) {
        self.always |= other.always;
        self.person |= other.person;
        for key in other.keys {
            if !self.keys.iter().any(|(slot, _)| *slot == key.0) {
                self.keys.push(key);
            }
        }
        for group in other.groups {
            if !self.groups.contains(&group) {
                self.groups.push(group);
            }
        }
        for flag in other.verdicts {
            if !self.verdicts.contains(&flag) {
                self.verdicts.push(flag);
            }
        }
        for (name, reads) in other.gated {
            self.gate(name, reads);
        }
    }

    fn gate(&mut self, name: Box<str>, reads: Reads) {
        match self.gated.iter_mut().find(|(n, _)| *n == name) {
            Some((_, known)) => known.merge(reads),
            None => self.gated.push((name, reads)),
        }
    }

    /// Once built, an inconclusive flag needs nothing else checked.
    fn settle(&mut self) {
        if self.always {
            *self = Reads {
                always: true,
                ..Reads::default()
            };
        }
        self.gated.retain(|(_, reads)| !reads.is_empty());
    }
}

impl Needs {
    pub(in crate::flags) fn of(rules: &ProjectRules) -> Needs {
        let mut builder = Builder {
            rules,
            slots: HashMap::new(),
            next: rules.property_keys,
            keys: Vec::new(),
            cohorts: (0..rules.cohorts.trees.len()).map(|_| None).collect(),
        };
        let flags: Vec<Reads> = rules
            .flags
            .iter()
            .map(|flag| match &flag.logic {
                Some(logic) => builder.flag(logic),
                None => Reads::default(),
            })
            .collect();
        let mut needs = Needs::default();
        for &i in &rules.order {
            match flags[i].mask() {
                _ if flags[i].is_empty() => {}
                Some(mask) => {
                    needs.simple.push((i, mask));
                    needs.union |= mask;
                }
                None => needs.complex.push(i),
            }
        }
        for &j in rules.order.iter().flat_map(|&i| &rules.flags[i].deps) {
            if !needs.read.contains(&j) {
                needs.read.push(j);
            }
        }
        needs.unsupported = (rules.flags.iter().enumerate())
            .filter(|(_, flag)| flag.unsupported)
            .map(|(i, _)| i)
            .collect();
        needs.flags = flags;
        needs.keys = builder.keys;
        needs.slots = builder.next;
        needs
    }
}

/// A cohort's reads while they are worked out: `Busy` guards against a cycle the
/// cohort compiler would already have marked unusable.
enum Cohort {
    Busy,
    Done(Reads),
}

struct Builder<'a> {
    rules: &'a ProjectRules,
    /// The slot of every person key seen, so an early-access key that a filter also
    /// reads is looked up once.
    slots: HashMap<Box<str>, usize>,
    /// The next slot for a key no filter reads.
    next: usize,
    /// The key of each of the first [`SLOTS`] slots seen.
    keys: Vec<Box<str>>,
    cohorts: Vec<Option<Cohort>>,
}

impl Builder<'_> {
    fn flag(&mut self, logic: &Logic) -> Reads {
        let mut reads = Reads::default();
        // Upstream buckets a continuity flag by the first-seen id it stores (and writes
        // it when the request carries `$anon_distinct_id`).
        if logic.continuity {
            reads.always = true;
            return reads;
        }
        if let Some(property) = &logic.enrollment {
            self.person_key(&mut reads, property);
        }
        if let Some(sup) = &logic.super_condition {
            for key in &sup.keys {
                self.person_key(&mut reads, key);
            }
            self.condition(&mut reads, &sup.condition);
        }
        for condition in &logic.conditions {
            self.condition(&mut reads, condition);
        }
        reads.settle();
        reads
    }

    fn condition(&mut self, reads: &mut Reads, condition: &Condition) {
        let aggregation = condition.aggregation.as_ref();
        let mut own = Reads::default();
        for leaf in &condition.filters {
            self.leaf(&mut own, leaf, aggregation);
        }
        match aggregation.map(|a| a.name.as_deref()) {
            None => reads.merge(own),
            // A group type the mapping does not name: the SDKs' "unknown group type
            // index".
            Some(None) => reads.always = true,
            Some(Some(name)) => reads.gate(name.into(), own),
        }
    }

    fn leaf(&mut self, reads: &mut Reads, leaf: &Leaf, aggregation: Option<&Aggregation>) {
        match leaf {
            Leaf::Property {
                key,
                slot,
                source: Source::Person,
                ..
            } => self.person_slot(reads, key, *slot),
            Leaf::Property {
                key,
                source: Source::Group(index),
                ..
            } => {
                let index = index.or(aggregation.map(|a| a.index));
                match index.and_then(|i| self.rules.group_type_mapping().get(&i)) {
                    Some(name) => {
                        let group = (name.as_str().into(), key.as_str().into());
                        if !reads.groups.contains(&group) {
                            reads.groups.push(group);
                        }
                    }
                    None => reads.always = true,
                }
            }
            Leaf::Cohort { cohort, .. } => self.cohort_ref(reads, *cohort),
            Leaf::Flag { flag, .. } => match flag {
                FlagRef::Missing(_) => reads.always = true,
                FlagRef::Index(j) if !reads.verdicts.contains(j) => reads.verdicts.push(*j),
                FlagRef::Index(_) => {}
            },
        }
    }

    fn cohort_ref(&mut self, reads: &mut Reads, cohort: CohortRef) {
        match cohort {
            // Static cohorts are left out of the feed: only upstream knows members.
            CohortRef::Missing(_) => reads.always = true,
            CohortRef::Index(i) => {
                let own = self.cohort(i);
                reads.merge(own);
            }
        }
    }

    /// What evaluating cohort `index` reads, worked out once and copied into each flag
    /// that uses it.
    fn cohort(&mut self, index: usize) -> Reads {
        let always = Reads {
            always: true,
            ..Reads::default()
        };
        let cohorts = &self.rules.cohorts;
        let tree = match (cohorts.trees.get(index), cohorts.usable.get(index)) {
            (Some(tree), Some(true)) => tree,
            _ => return always,
        };
        match self.cohorts.get(index) {
            Some(Some(Cohort::Done(reads))) => return reads.clone(),
            Some(Some(Cohort::Busy)) => return always,
            _ => {}
        }
        self.cohorts[index] = Some(Cohort::Busy);
        let mut reads = Reads::default();
        self.tree(&mut reads, tree);
        reads.settle();
        self.cohorts[index] = Some(Cohort::Done(reads.clone()));
        reads
    }

    fn tree(&mut self, reads: &mut Reads, tree: &Tree) {
        match tree {
            Tree::All(children) | Tree::Any(children) => {
                children.iter().for_each(|child| self.tree(reads, child))
            }
            // Cohort leaves read the person whatever their type says.
            Tree::Leaf(Leaf::Property { key, slot, .. }) => self.person_slot(reads, key, *slot),
            Tree::Leaf(Leaf::Cohort { cohort, .. }) => self.cohort_ref(reads, *cohort),
            Tree::Leaf(Leaf::Flag { .. }) => reads.always = true,
        }
    }

    fn person_slot(&mut self, reads: &mut Reads, key: &str, slot: usize) {
        self.slots.entry(key.into()).or_insert(slot);
        if slot < SLOTS {
            if self.keys.len() <= slot {
                self.keys.resize(slot + 1, Box::default());
            }
            self.keys[slot] = key.into();
        }
        reads.person = true;
        if key != DISTINCT_ID && !reads.keys.iter().any(|(s, _)| *s == slot) {
            reads.keys.push((slot, key.into()));
        }
    }

    /// A person key read outside any filter (early access), given a slot of its own
    /// unless a filter reads it too.
    fn person_key(&mut self, reads: &mut Reads, key: &str) {
        let slot = match self.slots.get(key) {
            Some(&slot) => slot,
            None => {
                let slot = self.next;
                self.next += 1;
                self.slots.insert(key.into(), slot);
                slot
            }
        };
        self.person_slot(reads, key, slot);
    }
}
