//! A scan of a key range that costs what reading its blocks costs: each entry is
//! given to the reader as the decompressed block holds it, with no copy and no page
//! of entries built ([`super::Iter`] makes an owned key and value of each, about 200
//! ns an entry, the most of a search of a million persons' values).

use std::ops::Bound;

use super::Layered;

impl Layered {
    /// Every entry from `from` on and below `to` (none: to the end), in key order, the
    /// delta's over the runs', given to `f` (tombstones are not). The delta's part of
    /// the range is read first, then the runs, as an iteration reads them (see the
    /// module docs of [`super`]).
    pub fn visit(&self, from: &[u8], to: Option<&[u8]>, mut f: impl FnMut(&[u8], &[u8])) {
        let upper = to.map_or(Bound::Unbounded, |t| Bound::Excluded(t.to_vec()));
        let delta = self
            .delta()
            .page(&(Bound::Included(from.to_vec()), upper), usize::MAX);
        let runs = self.inner.runs.load_full();
        let mut delta = delta.iter().peekable();
        let mut from_run = |k: &[u8], v: &[u8]| {
            while let Some((dk, dv)) = delta.next_if(|(dk, _)| &dk[..] <= k) {
                if !dv.is_empty() {
                    f(dk, dv);
                }
                if &dk[..] == k {
                    return;
                }
            }
            f(k, v);
        };
        let parts = runs.parts();
        for part in parts.iter().skip(runs.part_of(from)) {
            if to.is_some_and(|t| *part.lower >= *t) {
                break;
            }
            part.run.visit(from, to, &mut from_run);
        }
        for (dk, dv) in delta {
            if !dv.is_empty() {
                f(dk, dv);
            }
        }
    }
}

#[cfg(test)]
#[path = "tests/visit.rs"]
mod tests;
