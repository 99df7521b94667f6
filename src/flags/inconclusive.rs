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
//! What each flag reads is worked out once per rules (`needs`); a request checks only
//! the flags that read something an edge may lack, each against a short list, and looks
//! a person property up once however many flags read it: this runs on every `/decide`
//! at an edge, beside the evaluation itself.

use std::cell::Cell;

use super::compile::needs::Reads;
use super::compile::ProjectRules;
use super::outcome::{Outcomes, Seen, Slot};
use super::props::find;
use super::result::Context;

impl ProjectRules {
    /// One entry per flag of the rules, in definition order: true when the flag, as
    /// `outcomes` computed it for `ctx`, may differ from upstream's answer. Flags that
    /// failed locally are inconclusive too: upstream may be able to compute them. A
    /// flag `outcomes` leaves unanswered (not named, or inactive) gets a verdict only
    /// when an answered flag depends on it; the others read false.
    pub fn inconclusive(&self, ctx: &Context<'_>, outcomes: &Outcomes<'_>) -> Vec<bool> {
        let needs = self.needs();
        let far = needs.slots.saturating_sub(Seen::SLOTS);
        let far: Vec<Cell<Option<bool>>> = vec![Cell::new(None); far];
        let have = Have {
            ctx,
            looked: Cell::new(outcomes.seen.looked),
            present: Cell::new(outcomes.seen.present),
            keys: &needs.keys,
            far: &far,
        };
        let slots = &outcomes.slots;
        let mut out: Vec<bool> = slots.iter().map(|s| matches!(s, Slot::Failed(_))).collect();
        for &i in &needs.unsupported {
            out[i] = true;
        }
        let skipped = |i: usize| matches!(slots[i], Slot::Skipped);
        // A flag the request leaves unanswered is checked only when an answered one
        // reads its verdict. Only complex flags read verdicts, and dependents come after
        // their dependencies: walking them backwards marks what each wanted flag reads
        // before it is reached.
        let mut read = Vec::new();
        if needs.read.iter().any(|&j| skipped(j)) {
            read = vec![false; self.flags.len()];
            for &i in needs.complex.iter().rev() {
                if !skipped(i) || read[i] {
                    for &j in &self.flags[i].deps {
                        read[j] = true;
                    }
                }
            }
        }
        let wanted = |i: usize| !skipped(i) || read.get(i).copied().unwrap_or(false);
        // Simple flags read no verdicts, so they go first; a request whose person has
        // every key they read (as the evaluation found) passes them all at once.
        let doubt = match ctx.person_properties {
            Some(_) => needs.union & !(have.looked.get() & have.present.get()),
            None => u64::MAX,
        };
        if doubt != 0 {
            for &(i, mask) in &needs.simple {
                if (mask & doubt != 0 || ctx.person_properties.is_none()) && wanted(i) {
                    out[i] = out[i] || have.lacks_any(mask);
                }
            }
        }
        // Dependency order, so a flag reads its dependencies' verdicts.
        for &i in &needs.complex {
            if wanted(i) {
                out[i] = out[i] || have.lacks(&needs.flags[i], &out);
            }
        }
        out
    }

    /// The keys of the rules' flags, in definition order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.flags.iter().map(|f| f.header.key.as_str())
    }
}

/// What one request has, checked against a flag's [`Reads`].
struct Have<'a, 'c> {
    ctx: &'a Context<'c>,
    /// Which of the person's first [`Seen::SLOTS`] keys were looked up (by the
    /// evaluation or here), and which of those were found.
    looked: Cell<u64>,
    present: Cell<u64>,
    /// The key of each of those slots.
    keys: &'a [Box<str>],
    /// Whether the person has each later key, once looked up.
    far: &'a [Cell<Option<bool>>],
}

impl Have<'_, '_> {
    /// Whether the request lacks something `reads` needs, given the verdicts so far.
    fn lacks(&self, reads: &Reads, verdicts: &[bool]) -> bool {
        if reads.always {
            return true;
        }
        if reads.person {
            if self.ctx.person_properties.is_none() {
                return true;
            }
            if reads
                .keys
                .iter()
                .any(|(slot, key)| !self.person(*slot, key))
            {
                return true;
            }
        }
        reads
            .verdicts
            .iter()
            .any(|&j| verdicts.get(j).copied().unwrap_or(true))
            || reads.groups.iter().any(|(name, key)| self.lacks_group(name, key))
            // Without the group in the request, upstream reads `no_group_type` too.
            || (reads.gated.iter())
                .any(|(name, gated)| self.names_group(name) && self.lacks(gated, verdicts))
    }

    /// [`Have::lacks`] for a simple flag (one that reads the person's properties only),
    /// given the slots it reads.
    fn lacks_any(&self, mask: u64) -> bool {
        if self.ctx.person_properties.is_none() {
            return true;
        }
        let mut rest = mask;
        while rest != 0 {
            let slot = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            let key = self.keys.get(slot).map_or("", |k| k);
            if !self.person(slot, key) {
                return true;
            }
        }
        false
    }

    fn names_group(&self, name: &str) -> bool {
        find(self.ctx.groups, name).is_some()
    }

    fn lacks_group(&self, name: &str, key: &str) -> bool {
        if !self.names_group(name) {
            return false;
        }
        match self.ctx.group_properties.get(name) {
            Some(Some(props)) => find(props, key).is_none(),
            // The group's lookup failed, or it has no properties here at all.
            _ => true,
        }
    }

    /// Whether the person (whose properties are known) has `key`, looked up once a
    /// request by its slot.
    fn person(&self, slot: usize, key: &str) -> bool {
        let Some(props) = self.ctx.person_properties else {
            return false;
        };
        if slot < Seen::SLOTS {
            let bit = 1 << slot;
            if self.looked.get() & bit != 0 {
                return self.present.get() & bit != 0;
            }
            let has = find(props, key).is_some();
            self.looked.set(self.looked.get() | bit);
            if has {
                self.present.set(self.present.get() | bit);
            }
            return has;
        }
        let Some(known) = self.far.get(slot - Seen::SLOTS) else {
            return find(props, key).is_some();
        };
        if let Some(has) = known.get() {
            return has;
        }
        let has = find(props, key).is_some();
        known.set(Some(has));
        has
    }
}
