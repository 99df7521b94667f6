//! What one evaluation produces: each flag's [`Decision`], a small copyable value that
//! names its variant by index into the compiled rules, and [`Outcomes`], every flag's
//! state for one request. Evaluating therefore allocates nothing per flag; owned
//! [`Evaluation`]s are built from outcomes only when asked for.

use super::compile::ProjectRules;
use super::flag::{Flag, Logic, Payload};
use super::result::{Evaluation, FailureCause, FlagFailure, FlagResult, Reason, ReasonCode};

/// The value an enabled flag took besides `true`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pick {
    /// No variant: the value is the boolean.
    None,
    /// `logic.variants[i]`.
    Variant(usize),
    /// The holdout's variant.
    Holdout,
}

/// The outcome of one flag.
#[derive(Debug, Clone, Copy)]
pub(super) struct Decision {
    pub(super) enabled: bool,
    pub(super) pick: Pick,
    pub(super) code: ReasonCode,
    pub(super) condition_index: Option<usize>,
}

impl Decision {
    pub(super) fn off(code: ReasonCode, condition_index: Option<usize>) -> Decision {
        Decision {
            enabled: false,
            pick: Pick::None,
            code,
            condition_index,
        }
    }
}

/// A flag's state during one evaluation, as its dependents see it.
pub(super) enum Slot {
    /// Inactive: reads as disabled.
    Skipped,
    Done(Decision),
    Failed(FailureCause),
}

/// Every flag of a project evaluated for one request, borrowing the rules: what the
/// response writer reads without copying keys, variants or payloads.
pub struct Outcomes<'r> {
    pub(super) rules: &'r ProjectRules,
    /// One per flag of `rules.flags`, in definition order.
    pub(super) slots: Vec<Slot>,
    /// [`Outcomes::retain_keys`] was given a key the rules do not have.
    pub(super) unknown_named: bool,
    /// The person properties the evaluation looked up (noted at an edge only).
    pub(super) seen: Seen,
}

/// Which person properties an evaluation looked up and found, one bit a slot (the
/// filters' numbering of property keys) for the first [`Seen::SLOTS`] slots.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Seen {
    pub(super) looked: u64,
    pub(super) present: u64,
}

impl Seen {
    pub(super) const SLOTS: usize = super::compile::needs::SLOTS;
}

/// One computed flag of [`Outcomes`].
#[derive(Clone, Copy)]
pub(super) struct Outcome<'r> {
    pub(super) flag: &'r Flag,
    pub(super) logic: &'r Logic,
    pub(super) decision: Decision,
}

impl<'r> Outcome<'r> {
    /// The variant key, for enabled flags with one.
    pub(super) fn variant(&self) -> Option<&'r str> {
        variant_key(self.logic, self.decision.pick)
    }

    /// The variant key as a JSON string, for enabled flags with one.
    pub(super) fn quoted_variant(&self) -> Option<&'r str> {
        match self.decision.pick {
            Pick::None => None,
            Pick::Variant(i) => self.logic.variants.get(i).map(|v| &*v.quoted),
            Pick::Holdout => self.logic.holdout.as_ref().map(|h| &*h.quoted),
        }
    }

    /// `payloads[variant or "true"]` of an enabled flag.
    pub(super) fn payload(&self) -> Option<&'r Payload> {
        if !self.decision.enabled {
            return None;
        }
        let logic = self.logic;
        match self.decision.pick {
            Pick::None => logic.boolean_payload.as_ref(),
            Pick::Variant(i) => logic.variants.get(i)?.payload.as_ref(),
            Pick::Holdout => logic.holdout.as_ref()?.payload.as_ref(),
        }
    }

    fn to_result(self) -> FlagResult {
        let d = self.decision;
        FlagResult {
            key: self.flag.header.key.clone(),
            id: self.flag.header.id,
            version: self.flag.header.version,
            enabled: d.enabled,
            variant: self.variant().map(str::to_owned),
            reason: Reason::new(d.code, d.condition_index),
            payload: self.payload().map(|p| p.value.clone()),
        }
    }
}

impl<'r> Outcomes<'r> {
    /// Keep only the flags with these keys, as PostHog answers a request that names
    /// the flags it wants: every flag was evaluated (a kept flag may depend on any
    /// other), but the others are neither answered nor counted as errors.
    pub fn retain_keys(&mut self, keys: &[String]) {
        let mut named = vec![false; self.slots.len()];
        for key in keys {
            match self.rules.index_of(key) {
                Some(i) => named[i] = true,
                None => self.unknown_named = true,
            }
        }
        for (slot, named) in self.slots.iter_mut().zip(named) {
            if !named {
                *slot = Slot::Skipped;
            }
        }
    }

    /// Leave out the flags marked in `which` (one entry per flag, as
    /// [`ProjectRules::inconclusive`] gives): an edge answers them from upstream, or not
    /// at all with `errors` set.
    pub fn leave_out(&mut self, which: &[bool]) {
        for (slot, out) in self.slots.iter_mut().zip(which) {
            if *out && matches!(slot, Slot::Done(_) | Slot::Failed(_)) {
                *slot = Slot::Failed(FailureCause::Upstream);
            }
        }
    }

    /// Whether [`Outcomes::retain_keys`] was given a key the rules do not have (an edge
    /// asks upstream for it).
    pub fn names_unknown_keys(&self) -> bool {
        self.unknown_named
    }

    /// Some flag could not be computed; clients then merge instead of replacing.
    pub fn errors(&self) -> bool {
        self.slots.iter().any(|s| matches!(s, Slot::Failed(_)))
    }

    /// The computed flags in definition order; inactive and failed flags are absent.
    pub(super) fn computed(&self) -> impl Iterator<Item = Outcome<'r>> + Clone + '_ {
        self.rules
            .flags
            .iter()
            .zip(&self.slots)
            .filter_map(|(flag, slot)| match (slot, &flag.logic) {
                (Slot::Done(decision), Some(logic)) => Some(Outcome {
                    flag,
                    logic,
                    decision: *decision,
                }),
                _ => None,
            })
    }

    /// The same outcomes as owned results.
    pub fn to_evaluation(&self) -> Evaluation {
        let failed: Vec<FlagFailure> = self
            .rules
            .flags
            .iter()
            .zip(&self.slots)
            .filter_map(|(flag, slot)| match slot {
                Slot::Failed(cause) => Some(FlagFailure {
                    key: flag.header.key.clone(),
                    id: flag.header.id,
                    cause: cause.clone(),
                }),
                _ => None,
            })
            .collect();
        Evaluation {
            flags: self.computed().map(Outcome::to_result).collect(),
            errors: !failed.is_empty(),
            failed,
        }
    }
}

/// The key of a picked variant.
pub(super) fn variant_key(logic: &Logic, pick: Pick) -> Option<&str> {
    match pick {
        Pick::None => None,
        Pick::Variant(i) => logic.variants.get(i).map(|v| v.key.as_str()),
        Pick::Holdout => logic.holdout.as_ref().map(|h| h.variant.as_str()),
    }
}
