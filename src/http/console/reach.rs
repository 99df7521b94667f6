//! A flag's reach kept between openings of its page: counting it evaluates up to a
//! hundred thousand stored persons (about a second at a million persons), too long to
//! wait for each time the page opens, and the answer changes only as persons or the
//! rules do. An answer is kept per database, project and flag with the version of the
//! rules and the compactor's checkpoint it was counted at. It is served as it is while
//! neither moved; once persons changed it is served with its age and counted again in
//! the background (one count at a time per flag, and not before [`RECOUNT_AFTER_MS`]);
//! rules published since it was counted, or an answer older than [`MAX_AGE_MS`]
//! (relative dates move with the clock), are counted again before answering.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use serde_json::Value;

use crate::support::sync::lock;

/// An answer whose persons changed is served this long before a count in the
/// background replaces it: a page opened again and again while capture runs then
/// counts at most once in this time.
pub const RECOUNT_AFTER_MS: i64 = 30_000;
/// An answer older than this is counted again before answering, whatever changed:
/// a condition on a relative date ("in the last 7 days") moves with the clock.
pub const MAX_AGE_MS: i64 = 10 * 60_000;
/// Answers kept at most; past it all are dropped (each is a few kilobytes).
const MAX_KEPT: usize = 1024;

/// Which count an answer is: the database's directory, the project, the flag's key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Slot {
    pub dir: PathBuf,
    pub project: u64,
    pub key: String,
}

/// What the answer was counted from: the rules' version and the compactor's
/// checkpoint (the bytes `meta` holds, none before the first chunk).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Basis {
    pub rules: u64,
    pub applied: Option<Vec<u8>>,
}

struct Kept {
    answer: Value,
    basis: Basis,
    counted_ms: i64,
    recounting: bool,
}

/// What to do for a page being opened.
#[derive(Debug, Clone, PartialEq)]
pub enum Look {
    /// Serve this kept answer.
    Kept {
        answer: Value,
        counted_ms: i64,
        /// Whether a count is under way.
        recounting: bool,
        /// Whether the caller is to start it.
        start: bool,
    },
    /// Count now (and [`keep`] the answer).
    Count,
}

fn kept() -> &'static Mutex<HashMap<Slot, Kept>> {
    static KEPT: OnceLock<Mutex<HashMap<Slot, Kept>>> = OnceLock::new();
    KEPT.get_or_init(Mutex::default)
}

/// What the page of `slot` serves at `now_ms`, the data being at `basis`. A recount
/// it asks for is marked begun: the caller must [`keep`] or [`abandon`] it.
pub fn look(slot: &Slot, basis: &Basis, now_ms: i64) -> Look {
    let mut all = lock(kept());
    let Some(k) = all.get_mut(slot) else {
        return Look::Count;
    };
    let age = now_ms.saturating_sub(k.counted_ms);
    if k.basis.rules != basis.rules || !(0..MAX_AGE_MS).contains(&age) {
        return Look::Count;
    }
    let start = k.basis != *basis && age >= RECOUNT_AFTER_MS && !k.recounting;
    k.recounting |= start;
    Look::Kept {
        answer: k.answer.clone(),
        counted_ms: k.counted_ms,
        recounting: k.recounting,
        start,
    }
}

/// Keep `answer`, counted at `counted_ms` from `basis`, for `slot` (unless a newer
/// count is kept already).
pub fn keep(slot: Slot, basis: Basis, answer: Value, counted_ms: i64) {
    let mut all = lock(kept());
    if all.get(&slot).is_some_and(|k| k.counted_ms > counted_ms) {
        if let Some(k) = all.get_mut(&slot) {
            k.recounting = false;
        }
        return;
    }
    if all.len() >= MAX_KEPT && !all.contains_key(&slot) {
        all.clear();
    }
    let k = Kept {
        answer,
        basis,
        counted_ms,
        recounting: false,
    };
    all.insert(slot, k);
}

/// A recount that failed: the next opening may start another.
pub fn abandon(slot: &Slot) {
    if let Some(k) = lock(kept()).get_mut(slot) {
        k.recounting = false;
    }
}

#[cfg(test)]
#[path = "tests/reach.rs"]
mod tests;
