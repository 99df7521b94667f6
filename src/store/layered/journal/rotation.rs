//! How a fold rotates the journal while the compactor goes on appending (the module
//! docs of [`super`] say in what order, and why a crash between any two steps is safe).

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io;

use super::{
    create, create_with, journal_path, list, value, Guard, Journal, Kept, JOURNAL_RECORD_SYNC,
    JOURNAL_SYNC,
};
use crate::store::layered::delta::Map;
use crate::store::layered::records::{replay_file, tables_in_file, write_group, HEADER};

impl Guard<'_> {
    /// Where a fold freezes a table (module docs): the current journal cut to its
    /// committed bytes and synced, the journal two numbers on made current.
    pub(in crate::store::layered) fn split(&mut self) -> io::Result<Split> {
        if let Some(kept) = &self.writing.kept {
            return Err(kept.error());
        }
        let j = self.journal;
        let w = &mut *self.writing;
        if let Some(file) = &w.file {
            let cut = file.set_len(w.committed).and_then(|()| {
                j.syncs
                    .run_at(JOURNAL_SYNC, w.number, w.committed, || file.sync_data())
            });
            if let Err(e) = cut {
                w.kept = Some(Kept::of(&e));
                return Err(e);
            }
        }
        let next = w.number + 2;
        let file = create(j, next, &[])?;
        let end = HEADER.len() as u64;
        if let Err(e) = j.meta.insert(j.key(), &value(w.first, next, end)[..]) {
            let _ = fs::remove_file(journal_path(&j.dir, &j.name, next));
            return Err(io::Error::other(e));
        }
        let split = Split {
            first: w.first,
            upto: w.number,
        };
        w.number = next;
        w.committed = end;
        w.file = Some(file);
        w.appended = 0;
        w.kept = None;
        Ok(split)
    }

    /// The journal [`Journal::carry`] wrote for `split` becomes the first: recorded in
    /// `meta` (made durable by [`Journal::forget`]).
    pub(in crate::store::layered) fn carried(&mut self, split: &Split) -> io::Result<()> {
        if let Some(kept) = &self.writing.kept {
            return Err(kept.error());
        }
        let j = self.journal;
        let w = &mut *self.writing;
        let first = split.upto + 1;
        let recorded = j
            .meta
            .insert(j.key(), &value(first, w.number, w.committed)[..]);
        recorded.map_err(io::Error::other)?;
        w.first = first;
        Ok(())
    }
}

/// Where a fold split the journal: the journals from `first` to `upto` hold what the
/// frozen table's map holds and the other tables' changes until then.
pub(in crate::store::layered) struct Split {
    first: u64,
    upto: u64,
}

impl Journal {
    /// Write the journal between `split`'s and the current one: what the journals up
    /// to the split hold, `table`'s entries replaced by `left` (module docs). Holds
    /// nothing a chunk needs. The other tables are read back and written one at a
    /// time, in records of about a MiB, so what this holds at once is the largest
    /// table's changes, not every table's twice over and their record besides.
    pub(in crate::store::layered) fn carry(
        &self,
        split: &Split,
        table: &str,
        left: &Map,
    ) -> io::Result<()> {
        let paths: Vec<_> = list(&self.dir, &self.name)?
            .into_iter()
            .filter(|(n, _)| (split.first..=split.upto).contains(n))
            .map(|(_, path)| path)
            .collect();
        let mut others = BTreeSet::new();
        for path in &paths {
            tables_in_file(path, &mut others)?;
        }
        others.remove(table);
        create_with(self, split.upto + 1, |file, mut at| {
            let mut buf = Vec::new();
            for name in &others {
                let mut maps = HashMap::new();
                for path in &paths {
                    replay_file(path, |n| n == name, &mut maps)?;
                }
                if let Some(map) = maps.remove(name) {
                    let each = map.iter().map(|(k, v)| (&k[..], &v[..]));
                    at = write_group(file, at, name, each, &mut buf)?;
                }
            }
            let each = left.iter().map(|(k, v)| (&k[..], &v[..]));
            write_group(file, at, table, each, &mut buf)
        })
        .map(drop)
    }

    /// After [`Guard::carried`]: `meta` flushed, then the journals up to `split`
    /// removed.
    pub(in crate::store::layered) fn forget(&self, split: &Split) -> io::Result<()> {
        self.syncs.run(JOURNAL_RECORD_SYNC, || {
            self.meta.flush().map_err(io::Error::other)
        })?;
        for (n, path) in list(&self.dir, &self.name)? {
            if n <= split.upto {
                if let Err(e) = fs::remove_file(&path) {
                    tracing::warn!(path = %path.display(), error = %e, "a folded journal could not be removed; it is removed at the next start");
                }
            }
        }
        Ok(())
    }
}
