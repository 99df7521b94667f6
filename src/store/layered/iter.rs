//! Iteration over a [`Layered`] table: its delta's maps and its runs merged, in pages.

use std::ops::Bound;

use sled::IVec;

use super::{Layered, PAGE};

/// The entries of a [`Layered`] table in key order, read in pages.
pub struct Iter {
    table: Layered,
    from: Bound<Vec<u8>>,
    to: Bound<Vec<u8>>,
    buffer: std::vec::IntoIter<(IVec, IVec)>,
    done: bool,
}

impl Iter {
    pub(super) fn new(table: Layered, range: (Bound<Vec<u8>>, Bound<Vec<u8>>)) -> Iter {
        Iter {
            table,
            from: range.0,
            to: range.1,
            buffer: Vec::new().into_iter(),
            done: false,
        }
    }

    /// Whether nothing can lie between `from` and `to`.
    fn exhausted(&self) -> bool {
        let start = match &self.from {
            Bound::Included(k) | Bound::Excluded(k) => k,
            Bound::Unbounded => return false,
        };
        match &self.to {
            Bound::Unbounded => false,
            Bound::Excluded(end) => start >= end,
            Bound::Included(end) => match &self.from {
                Bound::Excluded(_) => start >= end,
                _ => start > end,
            },
        }
    }

    fn fill(&mut self) -> sled::Result<()> {
        if self.exhausted() {
            self.done = true;
            return Ok(());
        }
        let inner = &self.table.inner;
        let range = (self.from.clone(), self.to.clone());
        let delta = self.table.delta().page(&range, PAGE);
        // Loaded after the delta's page was read: see the module docs.
        let base = inner
            .runs
            .load()
            .scan(as_slice(&self.from), as_slice(&self.to), PAGE);
        let delta_cut = (delta.len() >= PAGE).then(|| delta.last().map(|(k, _)| k.to_vec()));
        let base_cut = (base.len() >= PAGE).then(|| base.last().map(|(k, _)| k.clone()));
        let cut = [delta_cut.flatten(), base_cut.flatten()]
            .into_iter()
            .flatten()
            .min();
        let within = |k: &[u8]| cut.as_deref().is_none_or(|c| k <= c);
        let mut merged = Vec::with_capacity(delta.len() + base.len());
        let mut base = base.into_iter().peekable();
        for (k, v) in delta.into_iter().filter(|(k, _)| within(k)) {
            while let Some((bk, _)) = base.peek() {
                if bk.as_slice() >= &k[..] {
                    break;
                }
                if let Some((bk, bv)) = base.next() {
                    if within(&bk) {
                        merged.push((IVec::from(bk), IVec::from(bv)));
                    }
                }
            }
            if base.peek().is_some_and(|(bk, _)| bk.as_slice() == &k[..]) {
                base.next();
            }
            if !v.is_empty() {
                merged.push((k, v));
            }
        }
        merged.extend(
            base.filter(|(k, _)| within(k))
                .map(|(k, v)| (IVec::from(k), IVec::from(v))),
        );
        match cut {
            Some(c) => self.from = Bound::Excluded(c),
            None => self.done = true,
        }
        self.buffer = merged.into_iter();
        Ok(())
    }
}

fn as_slice(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_slice()),
        Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

impl Iterator for Iter {
    type Item = sled::Result<(IVec, IVec)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(kv) = self.buffer.next() {
                return Some(Ok(kv));
            }
            if self.done {
                return None;
            }
            if let Err(e) = self.fill() {
                self.done = true;
                return Some(Err(e));
            }
        }
    }
}

/// The keys after every key starting with `prefix`, or none when there are none.
pub fn successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut s = prefix.to_vec();
    while let Some(last) = s.pop() {
        if last < u8::MAX {
            s.push(last + 1);
            return Some(s);
        }
    }
    None
}
