//! A table of many small values changed at random keys (persons, distinct ids, first
//! seen): recent changes in memory over sorted [`run::Run`] files of everything
//! older, one a range of keys ([`runs`]), as an LSM keeps a memtable over its runs.
//!
//! Why not sled: sled 0.34 rewrites a leaf whole every few changes and never gives
//! back the space of the old copies, so changes rewritten at random keys on every
//! chunk and removed at each fold left its file at about 85 times what its trees
//! hold (173 bytes an event of 270, `BENCHMARKS.md`). In a run a value takes its
//! size, LZ4'd; recent changes take a journal's append.
//!
//! Writes (the compactor's, in its chunk transaction) go to the *delta*: an ordered
//! map in memory ([`delta`]) backed by an append-only [`journal`] shared by the
//! database's tables. A removal is written as an empty value, a tombstone, since the
//! run may still hold the key. A read looks in the delta first, then in the run.
//!
//! Atomicity with the compactor's chunk ([`chunk`]): the chunk's changes are
//! appended to the journal as one record and synced before its sled transaction
//! commits; the transaction records the journal's number and committed length in
//! `meta`. A start replays the journal up to that length and cuts it there: bytes
//! past it belong to a chunk sled never committed, which the compactor applies again
//! from the log. The transaction may run its closure again on a conflict: each
//! attempt writes its record at the committed length (replacing the last attempt's)
//! and puts back what the last attempt changed in the maps. The maps take the
//! changes after the journal's sync, just before the commit, so a reader that sees
//! a chunk committed (the sink, through the outbox) sees its persons too; a commit
//! that fails puts them back.
//!
//! Once the delta's active map holds more than an eighth of the runs' bytes (see
//! [`FOLD_SHARE`]; a key counts once however often it was rewritten), once the tables'
//! deltas together pass their memory budget ([`Layered::delta_memory`], the largest
//! first), and when the compactor is idle or stops, [`Layered::fold`] merges the two,
//! on a thread of its own beside the compactor (`compactor::fold`), one fold at a time.
//! Under the journal's lock, for a moment: the journal is split (the current one cut to
//! its committed bytes, later chunks going to a new one, [`journal`]) and the active
//! map frozen (reads see it until the new runs are in place; writes go to a new active
//! map over it). Then, holding nothing the compactor needs: sled is flushed (a run
//! takes only changes whose chunk is durable, and every chunk in the frozen map
//! committed before the freeze), the parts whose range the delta changed enough
//! ([`plan`]) are rewritten as new runs (a part grown past [`PART_BYTES`] is cut in two
//! or more), the others kept; the new runs are synced, then named by a new manifest
//! ([`runs`]: written beside, synced, renamed into place, the directory synced) and put
//! in place for reads. What the journals before the split hold is carried into one
//! journal (the folded table's entries replaced by what the runs did not take), synced
//! and renamed into place. Under the lock again, for a moment: that journal is recorded
//! as the first, and what the fold left goes back under the active map. Once sled is
//! flushed the older journals are removed. A crash before the manifest's rename leaves
//! runs nothing names, removed at the next start; after it, journals whose entries
//! equal the runs' or are newer, which read the same; a journal half carried is removed
//! at the next start. Chunks journaled during the fold are in the journal after the
//! split, which no fold rewrites: the start cuts it to its committed length as ever.
//!
//! Reads while a fold switches runs: a point read consults the delta before loading
//! the run, so a key already dropped from the frozen map is found in the new run (the
//! switch comes before the drop). Iteration goes in pages with the same order: a page
//! of the delta, then the run's entries up to where that page ended.

pub mod cache;
pub mod chunk;
pub mod delta;
mod files;
mod filter;
mod fold;
mod iter;
pub mod journal;
mod key;
mod migrate;
mod plan;
mod records;
pub mod run;
pub mod runs;
mod visit;
mod write;

use std::fs;
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use sled::IVec;

use crate::support::syncs::Syncs;
use delta::Delta;
use files::{list, Kind};
pub use iter::successor;
pub use iter::Iter;
pub use journal::Journal;
pub use plan::Take;
pub use run::{Noter, Run};
pub use runs::Runs;
pub use visit::{block_entries, Visitor};
pub use write::Writer;

/// The directory of the runs, inside the database's.
pub const DIR_NAME: &str = "tables";
/// The journal the database's tables share ([`open_all`]).
pub const JOURNAL: &str = "deltas";
/// A removal in the delta.
pub const TOMBSTONE: &[u8] = b"";
/// The delta is folded once the keys and values its active map holds pass the run's
/// bytes over this. The smaller the share, the less the delta holds at its largest
/// (in memory and in the journal) and the more often a fold rewrites the run: each
/// byte of the delta costs about this many bytes of fold. An eighth kept
/// the disk-at-rest target with half the rewriting of a sixteenth
/// (`benches/HISTORY.md`).
pub const FOLD_SHARE: u64 = 8;
/// ... and at least this many,
pub const MIN_FOLD_BYTES: u64 = 128 * 1024;
/// ... and at most this many, however large the run (the deltas' memory budget,
/// `compactor::fold`, usually folds a large table well before).
const MAX_FOLD_BYTES: u64 = 64 * 1024 * 1024;
/// While a fold runs beside the writes, the active map may grow to this many times
/// what makes it due before the writer waits for the fold: the delta then holds at
/// most about twice that (the frozen map and the active one).
pub const OUTRUN: u64 = 2;
/// A fold cuts a new run once it holds this many bytes of keys and values: small
/// enough that a fold of a few changed ranges writes a few MB however large the
/// table (a million persons are about 30 such parts), large enough that a table is a
/// few dozen files and a part's Bloom filter and index stay a small share of it.
pub const PART_BYTES: u64 = 8 * 1024 * 1024;
/// Replaces [`PART_BYTES`] when set, so tests (the crash tests of split folds) can
/// make many parts of a few keys.
const PART_BYTES_ENV: &str = "FLAGPOST_TABLE_PART_BYTES";
/// Entries an iterator reads from each side at a time.
const PAGE: usize = 512;
/// What [`Syncs`] calls a fold's syncs: sled's flush before the delta is read (the
/// chunks it holds are then durable), the new run's file before its rename, the
/// runs' directory after it (and after making it, with the database's directory).
pub(crate) const DELTA_SYNC: &str = "delta";
pub(crate) const RUN_SYNC: &str = "run";
pub(crate) const DIR_SYNC: &str = "runs' directory";
pub(crate) const MANIFEST_SYNC: &str = "manifest";
pub(crate) const NEW_DIR_SYNC: &str = "database directory";

/// One layered table; clones share it.
#[derive(Clone)]
pub struct Layered {
    inner: Arc<Inner>,
}

/// A journal and what its tables share.
pub(crate) struct Shared {
    journal: Journal,
    /// Held by a fold of any of the tables: one at a time.
    folding: Mutex<()>,
}

struct Inner {
    name: String,
    dir: PathBuf,
    shared: Arc<Shared>,
    delta: RwLock<Delta>,
    runs: ArcSwap<Runs>,
    /// The greatest file number in the runs' directory: new runs take the next.
    generation: AtomicU64,
    /// The most a fold takes of the delta ([`fold::TAKE_BYTES`]; less in tests).
    take_bytes: AtomicU64,
    /// Bytes a run is cut at ([`PART_BYTES`]; less in tests).
    part_bytes: AtomicU64,
    /// Every sync a fold's next step rests on goes through it.
    syncs: Syncs,
    /// How a fold notes each block it writes, for a table that asks.
    noter: Mutex<Option<Noter>>,
    /// Run by a fold once the delta is frozen, with nothing held: tests write and
    /// read there as the compactor would beside a fold.
    #[cfg(test)]
    during_fold: Mutex<Option<DuringFold>>,
}

#[cfg(test)]
type DuringFold = Box<dyn Fn(&Layered) + Send + Sync>;

/// What a fold did.
#[derive(Debug)]
pub struct Folded {
    /// Entries in the table's runs.
    pub entries: u64,
    /// Delta entries taken into them and dropped from the delta.
    pub taken: u64,
    /// The runs' files, bytes.
    pub file_bytes: u64,
    /// Parts rewritten, of how many before.
    pub rewritten: usize,
    pub parts_before: usize,
    /// Bytes of the runs written.
    pub written_bytes: u64,
    pub took: Duration,
    /// Of which the journal was held, writes waiting: the freeze and the switch.
    pub held: Duration,
}

/// The value of `key`, given what the delta holds for it (`found`) and the run.
fn through(found: Option<IVec>, run: Option<&Runs>, key: &[u8]) -> Option<IVec> {
    match found {
        // An empty value is a tombstone.
        Some(v) => (!v.is_empty()).then_some(v),
        None => run?.get(key).map(IVec::from),
    }
}

/// The database's tables `names`, sharing the journal [`JOURNAL`]; written to only
/// when `writable` (the server), else read (`check`, `backup` of a stopped database).
pub fn open_all(
    db: &sled::Db,
    db_dir: &Path,
    names: &[&str],
    writable: bool,
) -> Result<Vec<Layered>, super::Error> {
    let shared = shared(db, db_dir, JOURNAL, writable)?;
    names
        .iter()
        .map(|name| Layered::open_in(&shared, db, db_dir, name))
        .collect()
}

fn shared(
    db: &sled::Db,
    db_dir: &Path,
    journal: &str,
    writable: bool,
) -> Result<Arc<Shared>, super::Error> {
    let meta = db.open_tree("meta")?;
    let dir = db_dir.join(DIR_NAME);
    let journal = Journal::open(&meta, &dir, journal, writable).map_err(super::Error::Tables)?;
    Ok(Arc::new(Shared {
        journal,
        folding: Mutex::new(()),
    }))
}

impl Layered {
    /// The table `name` alone, with a journal of its own (tests, benches).
    pub fn open(db: &sled::Db, db_dir: &Path, name: &str) -> Result<Layered, super::Error> {
        let shared = shared(db, db_dir, name, true)?;
        Layered::open_in(&shared, db, db_dir, name)
    }

    /// The table `name` of `db`, its runs in `db_dir`'s [`DIR_NAME`]: those its
    /// manifest names, or without one the newest `.run` there; its delta what the
    /// journal holds, over what a sled tree of its name holds (a database of format 6
    /// or earlier, until [`Layered::migrate_tree`] moves it). Nothing is removed (see
    /// [`Layered::remove_strays`]).
    fn open_in(
        shared: &Arc<Shared>,
        db: &sled::Db,
        db_dir: &Path,
        name: &str,
    ) -> Result<Layered, super::Error> {
        let tables = super::Error::Tables;
        if name.len() > usize::from(u8::MAX) {
            return Err(tables(io::Error::other("a table's name is too long")));
        }
        let dir = db_dir.join(DIR_NAME);
        let files = list(&dir, name).map_err(tables)?;
        let named = match runs::read(&dir, name).map_err(tables)? {
            Some(parts) => parts,
            None => files
                .iter()
                .filter(|f| f.kind == Kind::Run)
                .max_by_key(|f| f.generation)
                .map(|f| (Box::from(&b""[..]), f.file.clone()))
                .into_iter()
                .collect(),
        };
        let mut parts = Vec::with_capacity(named.len());
        for (lower, file) in named {
            let run = Run::open(&dir.join(&file)).map_err(tables)?;
            let run = Arc::new(run);
            parts.push(runs::Part { lower, file, run });
        }
        let mut active = delta::Map::new();
        if db.tree_names().iter().any(|t| t == name.as_bytes()) {
            for kv in db.open_tree(name)?.iter() {
                let (k, v) = kv?;
                active.insert(delta::Key::from(&k[..]), v);
            }
        }
        active.extend(shared.journal.take_replayed(name));
        let newest = files.iter().map(|f| f.generation).max();
        let inner = Arc::new(Inner {
            name: name.to_owned(),
            dir,
            shared: shared.clone(),
            delta: RwLock::new(Delta::new(active)),
            runs: ArcSwap::from_pointee(Runs::new(parts)),
            generation: AtomicU64::new(newest.unwrap_or(0)),
            take_bytes: AtomicU64::new(fold::TAKE_BYTES),
            part_bytes: AtomicU64::new(part_bytes()),
            syncs: Syncs::default(),
            noter: Mutex::default(),
            #[cfg(test)]
            during_fold: Mutex::default(),
        });
        Ok(Layered { inner })
    }

    /// Remove what a crash left: runs the table does not name (replaced, or being
    /// made), and a manifest being made.
    pub fn remove_strays(&self) -> io::Result<()> {
        let runs = self.inner.runs.load();
        let named = |file: &str| runs.parts().iter().any(|p| p.file == file);
        for f in list(&self.inner.dir, &self.inner.name)? {
            if !named(&f.file) {
                let path = self.inner.dir.join(&f.file);
                tracing::info!(path = %path.display(), "removing a run no longer used");
                fs::remove_file(&path)?;
            }
        }
        let making = runs::manifest_path(&self.inner.dir, &self.inner.name, true);
        match fs::remove_file(making) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The journal this table writes to.
    pub fn journal(&self) -> &Journal {
        &self.inner.shared.journal
    }

    /// The current runs, if there are any.
    pub fn run(&self) -> Option<Arc<Runs>> {
        Some(self.inner.runs.load_full()).filter(|r| !r.is_empty())
    }

    /// The value of `key`.
    pub fn get<K: AsRef<[u8]>>(&self, key: K) -> sled::Result<Option<IVec>> {
        Ok(self.lookup(key.as_ref()))
    }

    /// The delta's entry for `key` (an empty value is a removal), for a reader that
    /// keeps values read from the runs ([`Layered::run`], loaded after this).
    pub fn delta_get(&self, key: &[u8]) -> Option<IVec> {
        self.delta().get(key)
    }

    fn lookup(&self, key: &[u8]) -> Option<IVec> {
        // The delta first, then the run: see the module docs.
        let found = self.delta().get(key);
        through(found, Some(&self.inner.runs.load()), key)
    }

    fn delta(&self) -> std::sync::RwLockReadGuard<'_, Delta> {
        self.inner.delta.read().unwrap_or_else(|e| e.into_inner())
    }

    fn delta_mut(&self) -> std::sync::RwLockWriteGuard<'_, Delta> {
        self.inner.delta.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Entries in key order within `range`.
    pub fn range(&self, range: (Bound<Vec<u8>>, Bound<Vec<u8>>)) -> Iter {
        Iter::new(self.clone(), range)
    }

    /// Entries whose key starts with `prefix`, in key order.
    pub fn scan_prefix<P: AsRef<[u8]>>(&self, prefix: P) -> Iter {
        let prefix = prefix.as_ref().to_vec();
        let to = match successor(&prefix) {
            Some(s) => Bound::Excluded(s),
            None => Bound::Unbounded,
        };
        self.range((Bound::Included(prefix), to))
    }

    /// Whether the table holds nothing.
    pub fn is_empty(&self) -> sled::Result<bool> {
        Ok(self.iter().next().transpose()?.is_none())
    }

    /// Entries in key order.
    pub fn iter(&self) -> Iter {
        self.range((Bound::Unbounded, Bound::Unbounded))
    }

    /// Write `entries` (a tombstone removes) outside a chunk: a build in the
    /// background, a migration, tests. Journaled and synced before it returns.
    pub fn write(&self, entries: Vec<(IVec, IVec)>) -> io::Result<()> {
        self.write_made(|| entries)
    }

    /// [`Layered::write`] of the entries `make` returns, made while the journal is
    /// held: no chunk commits between what `make` reads and the write (a build of an
    /// index reads the persons again there, so a change the compactor made since the
    /// build first read them is not undone).
    pub fn write_made(&self, make: impl FnOnce() -> Vec<(IVec, IVec)>) -> io::Result<()> {
        let mut guard = self.journal().lock();
        let entries = make();
        guard.write(&[(self.name(), &entries)])?;
        self.delta_mut().stage(&entries);
        Ok(())
    }

    /// [`Layered::write`] of one entry.
    pub fn insert(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> io::Result<()> {
        let (k, v) = (IVec::from(key.as_ref()), IVec::from(value.as_ref()));
        self.write(vec![(k, v)])
    }

    /// Entries in the delta (a key in both maps counted once).
    pub fn delta_len(&self) -> usize {
        self.delta().len()
    }

    /// The delta's entries in key order, tombstones included.
    pub fn delta_entries(&self) -> Vec<(IVec, IVec)> {
        self.delta()
            .page(&(Bound::Unbounded, Bound::Unbounded), usize::MAX)
    }

    /// Bytes of keys and values the delta's active map holds: what is not yet folded
    /// (a key rewritten since the last fold counted once).
    pub fn pending(&self) -> u64 {
        self.delta().active_bytes()
    }

    /// About the bytes the table holds in memory: the delta's maps, the runs' indexes
    /// and filters.
    pub fn memory_bytes(&self) -> (u64, u64) {
        let runs = self.inner.runs.load().resident_bytes();
        (self.delta().footprint(), runs)
    }

    /// About the memory the delta's maps take, by map: what the deltas' budget weighs
    /// (`compactor::fold`).
    pub fn delta_memory(&self) -> delta::Memory {
        self.delta().memory()
    }

    /// Bytes committed in the delta's maps' own heaps (measurements).
    pub fn delta_heap_bytes(&self) -> u64 {
        self.delta().heap_bytes()
    }

    /// Whether the delta has grown enough to be folded.
    pub fn should_fold(&self) -> bool {
        self.pending() > self.fold_threshold()
    }

    /// Whether the active map holds more than [`OUTRUN`] times what makes a fold due:
    /// a writer then waits for the fold under way (`compactor::fold`).
    pub fn outran(&self) -> bool {
        self.pending() > OUTRUN * self.fold_threshold()
    }

    /// Bytes of the active map past which it is folded.
    fn fold_threshold(&self) -> u64 {
        let run = self.inner.runs.load().raw_bytes();
        (run / FOLD_SHARE).clamp(MIN_FOLD_BYTES, MAX_FOLD_BYTES)
    }

    /// Read every block of the runs: their entries, or the damage met.
    pub fn verify(&self) -> Option<io::Result<u64>> {
        self.run().map(|r| r.verify())
    }
}

fn part_bytes() -> u64 {
    std::env::var(PART_BYTES_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&b| b > 0)
        .unwrap_or(PART_BYTES)
}

#[cfg(test)]
#[path = "tests/hooks.rs"]
mod hooks;

#[cfg(test)]
#[path = "tests/table.rs"]
mod tests;

#[cfg(test)]
#[path = "tests/synced.rs"]
mod synced_tests;

#[cfg(test)]
#[path = "tests/parts.rs"]
mod parts_tests;

#[cfg(test)]
#[path = "tests/journal.rs"]
mod journal_tests;

#[cfg(test)]
#[path = "tests/delta.rs"]
mod delta_tests;

#[cfg(test)]
#[path = "tests/beside.rs"]
mod beside_tests;
