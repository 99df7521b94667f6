//! A table of many small values changed at random keys (persons, distinct ids): a
//! sled tree of recent changes over a sorted [`run::Run`] file of everything older.
//!
//! Why: sled 0.34 rewrites a leaf whole every few changes and cleans a segment of its
//! file only once at most half of it is live, so small values at random keys left its
//! file at about four times what they hold. In a run they take their size, LZ4'd.
//!
//! Writes (the compactor's, inside its chunk transaction) go to the tree, the *delta*,
//! as before; a removal is written as an empty value, a tombstone, since the run may
//! still hold the key. A read looks in the delta first, then in the run. Once the
//! bytes written to the delta pass an eighth of the run's (see [`FOLD_SHARE`]), and
//! when the compactor is idle or stops, [`Layered::fold`] merges the two into a new
//! run: sled flushed first (the run takes only durable changes), written beside the
//! old one, synced, renamed into place, the directory synced; then the old run is
//! deleted and the delta entries it took are removed (each only if unchanged). A crash
//! before the rename leaves a `.run.new` file, removed at the next start; after it,
//! delta entries that equal the run's, which read the same. Neither changes what a
//! read sees, so folds need no transaction with the compactor's chunks.
//!
//! Reads while a fold switches runs: a point read consults the delta before loading
//! the run, so a key already removed from the delta is found in the new run (the
//! switch comes before the removals). Iteration goes in pages with the same order:
//! a page of the delta, then the run's entries up to where that page ended.

pub mod cache;
mod fold;
mod iter;
pub mod run;
mod write;

use std::fs;
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use sled::transaction::{TransactionalTree, UnabortableTransactionError};
use sled::IVec;

use crate::support::syncs::Syncs;
use iter::successor;
pub use iter::Iter;
pub use run::Run;
pub use write::Writer;

/// The directory of the runs, inside the database's.
pub const DIR_NAME: &str = "tables";
/// A removal in the delta.
pub const TOMBSTONE: &[u8] = b"";
/// The delta is folded once the bytes written to it since the last fold pass the
/// run's bytes over this. The smaller the share, the less sled's file holds at its
/// largest and the more often a fold rewrites the run: each byte written to the delta
/// costs about this many bytes of fold. For the disk-at-rest workload a sixteenth left
/// 91 to 92 bytes an event, an eighth 102 to 107, a quarter 110 to 115
/// (`benches/HISTORY.md`); an eighth keeps the target with half the rewriting.
pub const FOLD_SHARE: u64 = 8;
/// ... and at least this many,
pub const MIN_FOLD_BYTES: u64 = 128 * 1024;
/// ... and at most this many, however large the run.
const MAX_FOLD_BYTES: u64 = 64 * 1024 * 1024;
/// Entries an iterator reads from each side at a time.
const PAGE: usize = 512;
/// What [`Syncs`] calls a fold's syncs: sled's flush of the delta before it is read,
/// the new run's file before its rename, the runs' directory after it (and after
/// making it, with the database's directory).
pub(crate) const DELTA_SYNC: &str = "delta";
pub(crate) const RUN_SYNC: &str = "run";
pub(crate) const DIR_SYNC: &str = "runs' directory";
pub(crate) const NEW_DIR_SYNC: &str = "database directory";
const RUN_SUFFIX: &str = ".run";
const MAKING_SUFFIX: &str = ".run.new";

/// One layered table; clones share it.
#[derive(Clone)]
pub struct Layered {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    dir: PathBuf,
    delta: sled::Tree,
    run: ArcSwapOption<Run>,
    generation: AtomicU64,
    /// Bytes (keys and values) written to the delta since the last fold, about.
    pending: AtomicU64,
    /// The most a fold takes of the delta ([`fold::TAKE_BYTES`]; less in tests).
    take_bytes: AtomicU64,
    /// Every sync a fold's next step rests on goes through it.
    syncs: Syncs,
}

/// What a fold did.
#[derive(Debug)]
pub struct Folded {
    /// Entries in the new run.
    pub entries: u64,
    /// Delta entries taken into it and removed from the delta.
    pub taken: u64,
    /// The new run's file, bytes.
    pub file_bytes: u64,
    pub took: Duration,
}

/// The value of `key`, given what the delta holds for it (`found`) and the run.
fn through(found: Option<IVec>, run: Option<&Run>, key: &[u8]) -> Option<IVec> {
    match found {
        // An empty value is a tombstone.
        Some(v) => (!v.is_empty()).then_some(v),
        None => run?.get(key).map(IVec::from),
    }
}

impl Layered {
    /// The table `name` of `db`, its runs in `db_dir`'s [`DIR_NAME`]: the newest run
    /// there is the table's. Nothing is removed (see [`Layered::remove_strays`]).
    pub fn open(db: &sled::Db, db_dir: &Path, name: &str) -> Result<Layered, super::Error> {
        let delta = db.open_tree(name)?;
        let dir = db_dir.join(DIR_NAME);
        let newest = list(&dir, name)
            .map_err(super::Error::Tables)?
            .into_iter()
            .filter(|(_, making)| !making)
            .map(|(generation, _)| generation)
            .max();
        let run = match newest {
            Some(g) => Some(Arc::new(
                Run::open(&run_path(&dir, name, g, false)).map_err(super::Error::Tables)?,
            )),
            None => None,
        };
        let mut pending = 0u64;
        for kv in delta.iter() {
            let (k, v) = kv?;
            pending += (k.len() + v.len()) as u64;
        }
        Ok(Layered {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                dir,
                delta,
                run: ArcSwapOption::new(run),
                generation: AtomicU64::new(newest.unwrap_or(0)),
                pending: AtomicU64::new(pending),
                take_bytes: AtomicU64::new(fold::TAKE_BYTES),
                syncs: Syncs::default(),
            }),
        })
    }

    /// Remove what a crash left: runs older than the table's, and runs being made.
    pub fn remove_strays(&self) -> io::Result<()> {
        let current = self.inner.generation.load(Ordering::SeqCst);
        for (generation, making) in list(&self.inner.dir, &self.inner.name)? {
            if making || generation < current {
                let path = run_path(&self.inner.dir, &self.inner.name, generation, making);
                tracing::info!(path = %path.display(), "removing a run no longer used");
                fs::remove_file(&path)?;
            }
        }
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The delta, for the compactor's transactions and the offline commands.
    pub fn delta(&self) -> &sled::Tree {
        &self.inner.delta
    }

    /// The current run, if any.
    pub fn run(&self) -> Option<Arc<Run>> {
        self.inner.run.load_full()
    }

    /// The value of `key`.
    pub fn get<K: AsRef<[u8]>>(&self, key: K) -> sled::Result<Option<IVec>> {
        let key = key.as_ref();
        // The delta first, then the run: see the module docs.
        let found = self.inner.delta.get(key)?;
        Ok(through(found, self.inner.run.load().as_deref(), key))
    }

    /// [`Layered::get`] inside a transaction on the delta, with the run as it was when
    /// the transaction began (only the compactor, between its chunks, folds).
    pub fn get_in(
        tx: &TransactionalTree,
        run: Option<&Run>,
        key: &[u8],
    ) -> Result<Option<IVec>, UnabortableTransactionError> {
        Ok(through(tx.get(key)?, run, key))
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

    /// Note `bytes` written to the delta (by a committed transaction).
    pub fn note_written(&self, bytes: u64) {
        self.inner.pending.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Make folds take at most `bytes` of the delta.
    #[cfg(test)]
    pub fn set_take_bytes(&self, bytes: u64) {
        self.inner.take_bytes.store(bytes, Ordering::Relaxed);
    }

    #[cfg(test)]
    pub(crate) fn syncs(&self) -> &Syncs {
        &self.inner.syncs
    }

    /// Bytes written to the delta since the last fold, about.
    pub fn pending(&self) -> u64 {
        self.inner.pending.load(Ordering::Relaxed)
    }

    /// Whether the delta has grown enough to be folded.
    pub fn should_fold(&self) -> bool {
        let run = self.inner.run.load().as_ref().map_or(0, |r| r.raw_bytes());
        self.pending() > (run / FOLD_SHARE).clamp(MIN_FOLD_BYTES, MAX_FOLD_BYTES)
    }

    /// Read every block of the run: its entries, or the damage met.
    pub fn verify(&self) -> Option<io::Result<u64>> {
        self.run().map(|r| r.verify())
    }
}

fn run_path(dir: &Path, name: &str, generation: u64, making: bool) -> PathBuf {
    let suffix = if making { MAKING_SUFFIX } else { RUN_SUFFIX };
    dir.join(format!("{name}.{generation:010}{suffix}"))
}

/// The runs of `name` in `dir`: (generation, being made).
fn list(dir: &Path, name: &str) -> io::Result<Vec<(u64, bool)>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let file = entry?.file_name();
        let Some(rest) = file
            .to_str()
            .and_then(|f| f.strip_prefix(name))
            .and_then(|f| f.strip_prefix('.'))
        else {
            continue;
        };
        let (digits, making) = match rest.strip_suffix(MAKING_SUFFIX) {
            Some(d) => (d, true),
            None => match rest.strip_suffix(RUN_SUFFIX) {
                Some(d) => (d, false),
                None => continue,
            },
        };
        if digits.len() == 10 && digits.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(generation) = digits.parse() {
                out.push((generation, making));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
#[path = "tests/table.rs"]
mod tests;

#[cfg(test)]
#[path = "tests/synced.rs"]
mod synced_tests;
