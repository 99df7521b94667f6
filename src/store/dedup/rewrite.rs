//! What the window asks of the `recent_ids` tree.

use sled::IVec;

/// Changes the window asks of the `recent_ids` tree, in order: entries of dropped
/// segments to delete, small entries rewritten as one. Applying them late or twice is
/// harmless: the window in memory already reflects them.
#[derive(Debug, Default)]
pub struct Rewrite {
    pub(super) ops: Vec<(IVec, Option<Vec<u8>>)>,
}

impl Rewrite {
    pub(super) fn remove(&mut self, key: IVec) {
        self.ops.push((key, None));
    }

    pub(super) fn insert(&mut self, key: IVec, value: Vec<u8>) {
        self.ops.push((key, Some(value)));
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Deletions asked for (a rewrite deletes the entries it replaces).
    pub fn removals(&self) -> usize {
        self.ops.iter().filter(|(_, v)| v.is_none()).count()
    }

    /// Apply to the tree atomically.
    pub fn apply(self, tree: &sled::Tree) -> Result<(), sled::Error> {
        if self.ops.is_empty() {
            return Ok(());
        }
        let mut batch = sled::Batch::default();
        for (k, v) in self.ops {
            match v {
                Some(v) => batch.insert(k, v),
                None => batch.remove(k),
            }
        }
        tree.apply_batch(batch)
    }
}
