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
//! delta holds more than a quarter of the run's bytes (at least [`MIN_FOLD_BYTES`]),
//! and when the compactor is idle or stops, [`Layered::fold`] merges the two into a new
//! run: written beside the old one, synced, renamed into place, the directory synced;
//! then the delta entries it took are removed (each only if unchanged) and the old run
//! deleted. A crash before the rename leaves a `.run.new` file, removed at the next
//! start; after it, delta entries that equal the run's, which read the same. Neither
//! changes what a read sees, so folds need no transaction with the compactor's chunks.
//!
//! Reads while a fold switches runs: a point read consults the delta before loading
//! the run, so a key already removed from the delta is found in the new run (the
//! switch comes before the removals). Iteration goes in pages with the same order:
//! a page of the delta, then the run's entries up to where that page ended.

pub mod run;

use std::fs;
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use sled::transaction::{TransactionalTree, UnabortableTransactionError};
use sled::IVec;

pub use run::Run;

/// The directory of the runs, inside the database's.
pub const DIR_NAME: &str = "tables";
/// A removal in the delta.
pub const TOMBSTONE: &[u8] = b"";
/// The delta is folded once it holds more than a quarter of the run's bytes, and at
/// least this many.
pub const MIN_FOLD_BYTES: u64 = 256 * 1024;
/// ... and at most this many, however large the run.
const MAX_FOLD_BYTES: u64 = 64 * 1024 * 1024;
/// Entries an iterator reads from each side at a time.
const PAGE: usize = 512;
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

/// A read of a run failed: sled's error type, so callers handle both alike.
fn run_error(e: io::Error) -> sled::Error {
    sled::Error::Io(e)
}

fn not_tombstone(value: IVec) -> Option<IVec> {
    (!value.is_empty()).then_some(value)
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
        if let Some(v) = self.inner.delta.get(key)? {
            return Ok(not_tombstone(v));
        }
        match self.inner.run.load().as_deref() {
            Some(run) => Ok(run.get(key).map_err(run_error)?.map(IVec::from)),
            None => Ok(None),
        }
    }

    /// [`Layered::get`] inside a transaction on the delta, with the run as it was when
    /// the transaction began (only the compactor, between its chunks, folds).
    pub fn get_in(
        tx: &TransactionalTree,
        run: Option<&Run>,
        key: &[u8],
    ) -> Result<Option<IVec>, UnabortableTransactionError> {
        if let Some(v) = tx.get(key)? {
            return Ok(not_tombstone(v));
        }
        match run {
            Some(run) => Ok(run
                .get(key)
                .map_err(|e| UnabortableTransactionError::Storage(run_error(e)))?
                .map(IVec::from)),
            None => Ok(None),
        }
    }

    /// Entries in key order within `range`.
    pub fn range(&self, range: (Bound<Vec<u8>>, Bound<Vec<u8>>)) -> Iter {
        Iter {
            table: self.clone(),
            from: range.0,
            to: range.1,
            buffer: Vec::new().into_iter(),
            done: false,
        }
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

    /// Bytes written to the delta since the last fold, about.
    pub fn pending(&self) -> u64 {
        self.inner.pending.load(Ordering::Relaxed)
    }

    /// Whether the delta has grown enough to be folded.
    pub fn should_fold(&self) -> bool {
        let run = self.inner.run.load().as_ref().map_or(0, |r| r.raw_bytes());
        self.pending() > (run / 4).clamp(MIN_FOLD_BYTES, MAX_FOLD_BYTES)
    }

    /// Merge the delta into a new run (see the module docs). Only one fold at a time:
    /// the compactor's thread folds, between its chunks, and nothing else writes the
    /// delta meanwhile. A failure (a full disk) leaves the table as it was.
    pub fn fold(&self) -> Result<Folded, super::Error> {
        let started = Instant::now();
        let inner = &self.inner;
        fs::create_dir_all(&inner.dir).map_err(super::Error::Tables)?;
        let generation = inner.generation.load(Ordering::SeqCst) + 1;
        let making = run_path(&inner.dir, &inner.name, generation, true);
        let old = inner.run.load_full();
        let mut taken = Vec::new();
        let written = self.write_run(old.as_deref(), &making, &mut taken);
        if let Err(e) = written {
            let _ = fs::remove_file(&making);
            return Err(e);
        }
        let path = run_path(&inner.dir, &inner.name, generation, false);
        let placed = fs::rename(&making, &path)
            .and_then(|()| fs::File::open(&inner.dir)?.sync_all())
            .and_then(|()| Run::open(&path));
        let run = match placed {
            Ok(run) => Arc::new(run),
            Err(e) => {
                let _ = fs::remove_file(&making);
                let _ = fs::remove_file(&path);
                return Err(super::Error::Tables(e));
            }
        };
        let (entries, file_bytes) = (run.entries(), run.file_bytes());
        inner.run.store(Some(run));
        inner.generation.store(generation, Ordering::SeqCst);
        let mut kept = 0u64;
        for (k, v) in &taken {
            // Unchanged since it was taken: the run now holds it.
            let swapped = inner
                .delta
                .compare_and_swap(k, Some(v), None as Option<&[u8]>)?;
            if swapped.is_err() {
                kept += (k.len() + v.len()) as u64;
            }
        }
        // Nothing else writes the delta during a fold (see `fold`'s docs).
        inner.pending.store(kept, Ordering::Relaxed);
        if let Some(old) = old.as_ref().filter(|old| old.damage_seen()) {
            let aside = old.path().with_extension("run.damaged");
            tracing::error!(path = %old.path().display(), aside = %aside.display(), "the replaced run had damaged blocks, whose keys are not in the new one; it is kept aside");
            if let Err(e) = fs::rename(old.path(), &aside) {
                tracing::warn!(error = %e, "the damaged run could not be kept aside");
            }
        } else if let Some(old) = &old {
            if let Err(e) = fs::remove_file(old.path()) {
                tracing::warn!(path = %old.path().display(), error = %e, "a replaced run could not be removed; it is removed at the next start");
            }
        }
        Ok(Folded {
            entries,
            taken: taken.len() as u64,
            file_bytes,
            took: started.elapsed(),
        })
    }

    /// The run `old` and the delta, merged into a new run at `path`; the delta's
    /// entries read go to `taken`.
    fn write_run(
        &self,
        old: Option<&Run>,
        path: &Path,
        taken: &mut Vec<(IVec, IVec)>,
    ) -> Result<(), super::Error> {
        let tables = super::Error::Tables;
        let mut out = run::Writer::create(path).map_err(tables)?;
        let mut base = RunPages::new(old);
        let mut delta = self.inner.delta.iter().peekable();
        loop {
            let next_base = base.peek().map_err(tables)?;
            let next_delta = match delta.peek() {
                Some(Ok((k, _))) => Some(k.clone()),
                Some(Err(_)) => {
                    if let Some(Err(e)) = delta.next() {
                        return Err(e.into());
                    }
                    None
                }
                None => None,
            };
            match (next_base, next_delta) {
                (None, None) => break,
                (Some(b), Some(d)) if b.as_slice() < &d[..] => {
                    let (k, v) = base.take();
                    out.push(&k, &v).map_err(tables)?;
                }
                (Some(_), None) => {
                    let (k, v) = base.take();
                    out.push(&k, &v).map_err(tables)?;
                }
                (b, Some(d)) => {
                    if b.is_some_and(|b| b.as_slice() == &d[..]) {
                        base.take();
                    }
                    if let Some(Ok((k, v))) = delta.next() {
                        if !v.is_empty() {
                            out.push(&k, &v).map_err(tables)?;
                        }
                        taken.push((k, v));
                    }
                }
            }
        }
        out.finish().map_err(tables)
    }

    /// Read every block of the run: its entries, or the damage met.
    pub fn verify(&self) -> Option<io::Result<u64>> {
        self.run().map(|r| r.verify())
    }
}

/// A run read in pages, front to back.
struct RunPages<'a> {
    run: Option<&'a Run>,
    page: std::collections::VecDeque<run::Entry>,
    after: Option<Vec<u8>>,
    done: bool,
}

impl<'a> RunPages<'a> {
    fn new(run: Option<&'a Run>) -> RunPages<'a> {
        RunPages {
            run,
            page: Default::default(),
            after: None,
            done: run.is_none(),
        }
    }

    /// The next key, reading a page when needed.
    fn peek(&mut self) -> io::Result<Option<Vec<u8>>> {
        if self.page.is_empty() && !self.done {
            if let Some(run) = self.run {
                let from = match &self.after {
                    Some(k) => Bound::Excluded(k.as_slice()),
                    None => Bound::Unbounded,
                };
                let page = run.scan(from, Bound::Unbounded, PAGE * 8)?;
                self.done = page.len() < PAGE * 8;
                self.after = page.last().map(|(k, _)| k.clone());
                self.page.extend(page);
            }
        }
        Ok(self.page.front().map(|(k, _)| k.clone()))
    }

    fn take(&mut self) -> run::Entry {
        self.page.pop_front().unwrap_or_default()
    }
}

/// The keys after every key starting with `prefix`, or none when there are none.
fn successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut s = prefix.to_vec();
    while let Some(last) = s.pop() {
        if last < u8::MAX {
            s.push(last + 1);
            return Some(s);
        }
    }
    None
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

/// The entries of a [`Layered`] table in key order, read in pages.
pub struct Iter {
    table: Layered,
    from: Bound<Vec<u8>>,
    to: Bound<Vec<u8>>,
    buffer: std::vec::IntoIter<(IVec, IVec)>,
    done: bool,
}

impl Iter {
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
        let mut delta = Vec::new();
        for kv in inner.delta.range((self.from.clone(), self.to.clone())) {
            delta.push(kv?);
            if delta.len() >= PAGE {
                break;
            }
        }
        // Loaded after the delta's page was read: see the module docs.
        let base = match inner.run.load_full() {
            Some(run) => run
                .scan(as_slice(&self.from), as_slice(&self.to), PAGE)
                .map_err(run_error)?,
            None => Vec::new(),
        };
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

#[cfg(test)]
mod tests;
