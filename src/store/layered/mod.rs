//! A table of many small values changed at random keys (persons, distinct ids): a
//! sled tree of recent changes over sorted [`run::Run`] files of everything older,
//! one a range of keys ([`runs`]).
//!
//! Why: sled 0.34 rewrites a leaf whole every few changes and cleans a segment of its
//! file only once at most half of it is live, so small values at random keys left its
//! file at about four times what they hold. In a run they take their size, LZ4'd.
//!
//! Writes (the compactor's, inside its chunk transaction) go to the tree, the *delta*,
//! as before; a removal is written as an empty value, a tombstone, since the run may
//! still hold the key. A read looks in the delta first, then in the run. Once the
//! bytes written to the delta pass an eighth of the runs' (see [`FOLD_SHARE`]), and
//! when the compactor is idle or stops, [`Layered::fold`] merges the two: the parts
//! whose range the delta changed enough ([`plan`]) are rewritten as new runs (a part
//! grown past [`PART_BYTES`] is cut in two or more), the others kept. sled is flushed
//! first (a run takes only durable changes); the new runs are synced, then named by
//! a new manifest ([`runs`]: written beside, synced, renamed into place, the directory
//! synced); then the replaced runs are deleted and the delta entries taken are removed
//! (each only if unchanged). A crash before the manifest's rename leaves runs nothing
//! names, removed at the next start; after it, delta entries that equal the runs',
//! which read the same. Neither changes what a read sees, so folds need no
//! transaction with the compactor's chunks.
//!
//! Reads while a fold switches runs: a point read consults the delta before loading
//! the run, so a key already removed from the delta is found in the new run (the
//! switch comes before the removals). Iteration goes in pages with the same order:
//! a page of the delta, then the run's entries up to where that page ended.

pub mod cache;
mod fold;
mod iter;
mod plan;
pub mod run;
pub mod runs;
mod write;

use std::fs;
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use sled::transaction::{TransactionalTree, UnabortableTransactionError};
use sled::IVec;

use crate::support::syncs::Syncs;
use iter::successor;
pub use iter::Iter;
pub use run::Run;
pub use runs::Runs;
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
/// What [`Syncs`] calls a fold's syncs: sled's flush of the delta before it is read,
/// the new run's file before its rename, the runs' directory after it (and after
/// making it, with the database's directory).
pub(crate) const DELTA_SYNC: &str = "delta";
pub(crate) const RUN_SYNC: &str = "run";
pub(crate) const DIR_SYNC: &str = "runs' directory";
pub(crate) const MANIFEST_SYNC: &str = "manifest";
pub(crate) const NEW_DIR_SYNC: &str = "database directory";
/// A run of a table without a manifest (format 5 and earlier), and one being made.
const RUN_SUFFIX: &str = ".run";
const MAKING_SUFFIX: &str = ".run.new";
/// A run a manifest names.
const PART_SUFFIX: &str = ".part";

/// One layered table; clones share it.
#[derive(Clone)]
pub struct Layered {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    dir: PathBuf,
    delta: sled::Tree,
    runs: ArcSwap<Runs>,
    /// The greatest file number in the runs' directory: new runs take the next.
    generation: AtomicU64,
    /// Bytes (keys and values) written to the delta since the last fold, about.
    pending: AtomicU64,
    /// The most a fold takes of the delta ([`fold::TAKE_BYTES`]; less in tests).
    take_bytes: AtomicU64,
    /// Bytes a run is cut at ([`PART_BYTES`]; less in tests).
    part_bytes: AtomicU64,
    /// Every sync a fold's next step rests on goes through it.
    syncs: Syncs,
}

/// What a fold did.
#[derive(Debug)]
pub struct Folded {
    /// Entries in the table's runs.
    pub entries: u64,
    /// Delta entries taken into them and removed from the delta.
    pub taken: u64,
    /// The runs' files, bytes.
    pub file_bytes: u64,
    /// Parts rewritten, of how many before.
    pub rewritten: usize,
    pub parts_before: usize,
    /// Bytes of the runs written.
    pub written_bytes: u64,
    pub took: Duration,
}

/// The value of `key`, given what the delta holds for it (`found`) and the run.
fn through(found: Option<IVec>, run: Option<&Runs>, key: &[u8]) -> Option<IVec> {
    match found {
        // An empty value is a tombstone.
        Some(v) => (!v.is_empty()).then_some(v),
        None => run?.get(key).map(IVec::from),
    }
}

impl Layered {
    /// The table `name` of `db`, its runs in `db_dir`'s [`DIR_NAME`]: those its
    /// manifest names, or without one the newest `.run` there. Nothing is removed (see
    /// [`Layered::remove_strays`]).
    pub fn open(db: &sled::Db, db_dir: &Path, name: &str) -> Result<Layered, super::Error> {
        let tables = super::Error::Tables;
        let delta = db.open_tree(name)?;
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
        let mut pending = 0u64;
        for kv in delta.iter() {
            let (k, v) = kv?;
            pending += (k.len() + v.len()) as u64;
        }
        let newest = files.iter().map(|f| f.generation).max();
        Ok(Layered {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                dir,
                delta,
                runs: ArcSwap::from_pointee(Runs::new(parts)),
                generation: AtomicU64::new(newest.unwrap_or(0)),
                pending: AtomicU64::new(pending),
                take_bytes: AtomicU64::new(fold::TAKE_BYTES),
                part_bytes: AtomicU64::new(part_bytes()),
                syncs: Syncs::default(),
            }),
        })
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

    /// The delta, for the compactor's transactions and the offline commands.
    pub fn delta(&self) -> &sled::Tree {
        &self.inner.delta
    }

    /// The current runs, if there are any.
    pub fn run(&self) -> Option<Arc<Runs>> {
        Some(self.inner.runs.load_full()).filter(|r| !r.is_empty())
    }

    /// The value of `key`.
    pub fn get<K: AsRef<[u8]>>(&self, key: K) -> sled::Result<Option<IVec>> {
        let key = key.as_ref();
        // The delta first, then the run: see the module docs.
        let found = self.inner.delta.get(key)?;
        Ok(through(found, Some(&self.inner.runs.load()), key))
    }

    /// [`Layered::get`] inside a transaction on the delta, with the run as it was when
    /// the transaction began (only the compactor, between its chunks, folds).
    pub fn get_in(
        tx: &TransactionalTree,
        run: Option<&Runs>,
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

    /// Make folds cut runs at `bytes`.
    #[cfg(test)]
    pub fn set_part_bytes(&self, bytes: u64) {
        self.inner.part_bytes.store(bytes, Ordering::Relaxed);
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
        let run = self.inner.runs.load().raw_bytes();
        self.pending() > (run / FOLD_SHARE).clamp(MIN_FOLD_BYTES, MAX_FOLD_BYTES)
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

/// What a file of the runs' directory is to a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A run of a table without a manifest.
    Run,
    /// A run being made by a build before manifests.
    Making,
    /// A run a manifest may name.
    Part,
}

struct Listed {
    file: String,
    generation: u64,
    kind: Kind,
}

/// The name of a new run of `name`.
fn part_file(name: &str, generation: u64) -> String {
    format!("{name}.{generation:010}{PART_SUFFIX}")
}

/// The runs of `name` in `dir`, whatever their state.
fn list(dir: &Path, name: &str) -> io::Result<Vec<Listed>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let file = entry?.file_name();
        let Some(file) = file.to_str() else { continue };
        let Some(rest) = file.strip_prefix(name).and_then(|f| f.strip_prefix('.')) else {
            continue;
        };
        let kinds = [
            (MAKING_SUFFIX, Kind::Making),
            (RUN_SUFFIX, Kind::Run),
            (PART_SUFFIX, Kind::Part),
        ];
        let Some((digits, kind)) = kinds
            .iter()
            .find_map(|(suffix, kind)| Some((rest.strip_suffix(suffix)?, *kind)))
        else {
            continue;
        };
        if digits.len() == 10 && digits.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(generation) = digits.parse() {
                let file = file.to_owned();
                out.push(Listed {
                    file,
                    generation,
                    kind,
                });
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

#[cfg(test)]
#[path = "tests/parts.rs"]
mod parts_tests;
