//! A table's recent changes in memory, as an LSM keeps its memtable: the *active*
//! map, which writes go to, over the *frozen* one a fold is writing into the runs
//! (read until the new runs are in place). Both are ordered, so iteration pages
//! through them with the runs. What they hold is in the journal ([`super::journal`]),
//! from which a start fills them again.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use sled::IVec;

/// Keys to values; an empty value is a removal (the runs may hold the key).
pub type Map = BTreeMap<IVec, IVec>;

/// What a write replaced, to put back if its chunk does not commit.
pub type Undo = Vec<(IVec, Option<IVec>)>;

#[derive(Default)]
pub struct Delta {
    pub active: Map,
    pub frozen: Option<Arc<Map>>,
}

fn bounds(range: &(Bound<Vec<u8>>, Bound<Vec<u8>>)) -> (Bound<&[u8]>, Bound<&[u8]>) {
    (one(&range.0), one(&range.1))
}

fn one(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_slice()),
        Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

impl Delta {
    /// What the delta holds for `key` (an empty value is a removal).
    pub fn get(&self, key: &[u8]) -> Option<IVec> {
        match self.active.get(key) {
            Some(v) => Some(v.clone()),
            None => self.frozen.as_ref()?.get(key).cloned(),
        }
    }

    /// Up to `limit` entries within `range`, the active map's over the frozen's.
    pub fn page(
        &self,
        range: &(Bound<Vec<u8>>, Bound<Vec<u8>>),
        limit: usize,
    ) -> Vec<(IVec, IVec)> {
        let r = bounds(range);
        let mut active = self.active.range::<[u8], _>(r).peekable();
        let empty = Map::new();
        let frozen = self.frozen.as_deref().unwrap_or(&empty);
        let mut frozen = frozen.range::<[u8], _>(r).peekable();
        let mut out = Vec::new();
        while out.len() < limit {
            let next = match (active.peek(), frozen.peek()) {
                (None, None) => break,
                (Some(_), None) => active.next(),
                (None, Some(_)) => frozen.next(),
                (Some((a, _)), Some((f, _))) => match a.cmp(f) {
                    std::cmp::Ordering::Less => active.next(),
                    std::cmp::Ordering::Greater => frozen.next(),
                    std::cmp::Ordering::Equal => {
                        frozen.next();
                        active.next()
                    }
                },
            };
            if let Some((k, v)) = next {
                out.push((k.clone(), v.clone()));
            }
        }
        out
    }

    /// Write `entries` to the active map; what they replaced.
    pub fn stage(&mut self, entries: &[(IVec, IVec)]) -> Undo {
        entries
            .iter()
            .map(|(k, v)| (k.clone(), self.active.insert(k.clone(), v.clone())))
            .collect()
    }

    /// Put back what [`Delta::stage`] replaced, newest first.
    pub fn unstage(&mut self, undo: Undo) {
        for (k, old) in undo.into_iter().rev() {
            match old {
                Some(v) => self.active.insert(k, v),
                None => self.active.remove(&k),
            };
        }
    }

    /// The frozen map back under the active one (a fold that failed).
    pub fn thaw(&mut self) {
        if let Some(frozen) = self.frozen.take() {
            let frozen = Arc::try_unwrap(frozen).unwrap_or_else(|shared| (*shared).clone());
            let newer = std::mem::replace(&mut self.active, frozen);
            self.active.extend(newer);
        }
    }

    /// Whether both maps are empty.
    pub fn is_empty(&self) -> bool {
        self.active.is_empty() && self.frozen.as_ref().is_none_or(|f| f.is_empty())
    }

    /// Entries in both maps, counting a key once.
    pub fn len(&self) -> usize {
        self.page(&(Bound::Unbounded, Bound::Unbounded), usize::MAX)
            .len()
    }

    /// Bytes of keys and values in the active map.
    pub fn active_bytes(&self) -> u64 {
        self.active
            .iter()
            .map(|(k, v)| (k.len() + v.len()) as u64)
            .sum()
    }
}
