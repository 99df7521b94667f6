//! The layered tables inside the compactor's chunk transaction: each table's writes
//! are gathered ([`Pending`]), then at the end of the transaction's closure
//! journaled, synced and put in the maps ([`Journaled::stage`]), the journal's length
//! recorded in the same transaction. See the module docs of [`super`] for why this
//! is atomic with the chunk; the journal is held from before the first attempt until
//! [`Journaled::finish`], so nothing else appends in between.

use std::cell::RefCell;
use std::io;
use std::sync::Arc;

use sled::IVec;

use super::delta::Undo;
use super::journal::{Guard, Journal};
use super::Layered;
use crate::support::heaps::{self, Heap};

/// One table's writes in a chunk's transaction, read through for the chunk's reads
/// of other keys. The chunk's own reads of keys it wrote go through its cache.
pub struct Pending {
    table: Layered,
    writes: RefCell<Vec<(IVec, IVec)>>,
    /// The heap of the active map the writes go to, from [`Journaled::begin`] (the
    /// journal held, no fold freezes it meanwhile): the values are made there.
    heap: RefCell<Option<Arc<Heap>>>,
}

impl Pending {
    pub fn new(table: &Layered) -> Pending {
        Pending {
            table: table.clone(),
            writes: RefCell::default(),
            heap: RefCell::default(),
        }
    }

    /// The table written.
    pub fn table(&self) -> &Layered {
        &self.table
    }

    /// The value of `key` as committed, delta then runs.
    pub fn get(&self, key: &[u8]) -> Option<IVec> {
        self.table.lookup(key)
    }

    /// Write `value` (a tombstone removes) when the chunk commits.
    pub fn insert(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        let k = IVec::from(key.as_ref());
        let v = match &*self.heap.borrow() {
            Some(heap) => heaps::within(heap, || IVec::from(value.as_ref())),
            None => IVec::from(value.as_ref()),
        };
        self.writes.borrow_mut().push((k, v));
    }
}

/// The journal held for one chunk, with what its attempts put in the maps.
pub struct Journaled<'a> {
    tables: &'a [Pending],
    journal: &'a Journal,
    guard: RefCell<Guard<'a>>,
    undo: RefCell<Vec<(usize, Undo)>>,
}

impl<'a> Journaled<'a> {
    /// Hold `journal`, the one the `tables` share, for a chunk.
    pub fn begin(journal: &'a Journal, tables: &'a [Pending]) -> Journaled<'a> {
        let guard = journal.lock();
        for t in tables {
            *t.heap.borrow_mut() = Some(t.table.delta().heap());
        }
        Journaled {
            tables,
            journal,
            guard: RefCell::new(guard),
            undo: RefCell::default(),
        }
    }

    /// At the start of each attempt: what the last one wrote is forgotten and put
    /// back in the maps.
    pub fn restart(&self) {
        self.put_back();
        for t in self.tables {
            t.writes.borrow_mut().clear();
        }
    }

    fn put_back(&self) {
        for (i, undo) in self.undo.borrow_mut().drain(..).rev() {
            if let Some(t) = self.tables.get(i) {
                t.table.delta_mut().unstage(undo);
            }
        }
    }

    /// Journal the attempt's writes (synced) and put them in the maps; the key and
    /// value to record in `meta` in the same transaction, or `None` when the chunk
    /// wrote nothing to these tables.
    pub fn stage(&self) -> io::Result<Option<(Vec<u8>, [u8; 24])>> {
        let writes: Vec<_> = self.tables.iter().map(|t| t.writes.borrow()).collect();
        let groups: Vec<_> = self
            .tables
            .iter()
            .zip(&writes)
            .map(|(t, w)| (t.table.name(), &w[..]))
            .collect();
        let mut guard = self.guard.borrow_mut();
        let Some(value) = guard.append(&groups)? else {
            return Ok(None);
        };
        let mut undo = self.undo.borrow_mut();
        for (i, (t, w)) in self.tables.iter().zip(&writes).enumerate() {
            if !w.is_empty() {
                undo.push((i, t.table.delta_mut().stage(w)));
            }
        }
        Ok(Some((self.journal.key(), value)))
    }

    /// The transaction returned: committed, or everything put back.
    pub fn finish(self, committed: bool) {
        match committed {
            true => self.guard.borrow_mut().committed(),
            false => self.put_back(),
        }
    }
}
