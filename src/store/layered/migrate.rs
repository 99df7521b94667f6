//! A database of format 6 or earlier kept a table's delta in a sled tree of its name:
//! [`Layered::migrate_tree`] moves it into the journal.

use super::Layered;

/// Bytes of a format-6 delta moved into the journal at a time.
const MIGRATE_PIECE: usize = 4 * 1024 * 1024;

impl Layered {
    /// Move what a sled tree of this table's name holds (a database of format 6 or
    /// earlier kept the delta there) into the journal, in pieces, then drop the tree.
    /// Returns the entries moved.
    pub fn migrate_tree(&self, db: &sled::Db) -> Result<u64, crate::store::Error> {
        let name = self.name();
        if !db.tree_names().iter().any(|t| t == name.as_bytes()) {
            return Ok(0);
        }
        let tree = db.open_tree(name)?;
        let mut moved = 0u64;
        loop {
            let mut piece = Vec::new();
            let mut bytes = 0usize;
            for kv in tree.iter() {
                let (k, v) = kv?;
                bytes += k.len() + v.len();
                piece.push((k, v));
                if bytes >= MIGRATE_PIECE {
                    break;
                }
            }
            if piece.is_empty() {
                break;
            }
            let journaled = self.journal().lock().write(&[(name, &piece)]);
            journaled.map_err(crate::store::Error::Tables)?;
            let mut batch = sled::Batch::default();
            for (k, _) in &piece {
                batch.remove(k);
            }
            tree.apply_batch(batch)?;
            moved += piece.len() as u64;
        }
        drop(tree);
        db.drop_tree(name)?;
        Ok(moved)
    }
}
