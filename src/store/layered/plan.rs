//! Which parts of a table a fold rewrites ([`super::runs`]), chosen from the run set
//! and the delta's bytes in each part's range, before anything is written: a part is
//! due once its delta passes its share of the part ([`super::FOLD_SHARE`]), so a
//! fold rewrites the ranges changes went to, not the whole table. When none is due
//! (a fold when idle or at a stop) every part with changes is taken. A part chosen
//! that has shrunk under a quarter of `part_bytes` takes its neighbour along, so
//! parts left small by removals are merged rather than piling up. A fold for the
//! deltas' memory ([`Take::Every`]) takes every part with changes: what a fold leaves
//! stays in memory, its values in the pages of the map's heap, which they then keep
//! from being handed back.

use super::runs::Runs;
use super::FOLD_SHARE;

/// Which parts with changes a fold takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// Those due by their share, or every one if none is.
    Due,
    /// Every one: a fold to bring the deltas within their memory budget.
    Every,
}

/// What a fold does.
#[derive(Debug, PartialEq, Eq)]
pub struct Choice {
    /// The parts rewritten, ascending; with no runs yet, part 0 is the whole table.
    pub parts: Vec<usize>,
}

/// The parts to rewrite given `delta_bytes`, the delta's bytes in each part's range
/// (one entry when there are no runs), taking about `take_limit` bytes at most (at
/// least one part).
pub fn choose(
    runs: &Runs,
    delta_bytes: &[u64],
    take: Take,
    take_limit: u64,
    part_bytes: u64,
) -> Choice {
    let raw = |i: usize| runs.parts().get(i).map_or(0, |p| p.run.raw_bytes());
    let due = |i: usize| delta_bytes[i] > 0 && delta_bytes[i] * FOLD_SHARE >= raw(i);
    let mut chosen: Vec<usize> = match take {
        Take::Due => (0..delta_bytes.len()).filter(|&i| due(i)).collect(),
        Take::Every => Vec::new(),
    };
    if chosen.is_empty() {
        chosen = (0..delta_bytes.len())
            .filter(|&i| delta_bytes[i] > 0)
            .collect();
    }
    // The parts with the most change for their size first, until the limit.
    chosen.sort_by(|&a, &b| {
        let share = |i: usize| delta_bytes[i] as f64 / raw(i).max(1) as f64;
        share(b).total_cmp(&share(a))
    });
    let mut taken = 0u64;
    let mut within = 0;
    for &i in &chosen {
        if within > 0 && taken >= take_limit {
            break;
        }
        taken += delta_bytes[i];
        within += 1;
    }
    chosen.truncate(within);
    let parts = runs.parts().len();
    for i in chosen.clone() {
        if parts > 1 && raw(i) < part_bytes / 4 {
            chosen.push(if i + 1 < parts { i + 1 } else { i - 1 });
        }
    }
    chosen.sort_unstable();
    chosen.dedup();
    Choice { parts: chosen }
}

#[cfg(test)]
#[path = "tests/plan.rs"]
mod tests;
