//! The layered tables' recent changes on disk: one append-only journal shared by the
//! tables of a database, so a chunk's changes to persons, distinct ids and first seen
//! cost one sync, not three. The tables' in-memory maps ([`super::delta`]) are what
//! reads consult; the journal is only read at the next start, to fill them again.
//!
//! Files, in the runs' directory: `<journal>.<number>.journal`, each a header then
//! records. `meta` (a sled tree) records, under `<journal>.journal`, the first journal
//! still needed, the current one and how many of its bytes are committed; the
//! compactor writes that record in its chunk's transaction, after the record's bytes
//! are synced ([`Guard::append`]). So at a start the journals from the first to the
//! current are read, the current one up to the recorded length and cut there: bytes
//! past it belong to a chunk sled never committed, which the compactor applies again
//! from the log. Journals below the first (folded) or above the current (a rotation
//! never recorded) are removed.
//!
//! A fold rotates the journal in three short moments, so the compactor goes on
//! appending while the fold writes its runs:
//! - [`Guard::split`], as the fold freezes its table: the current journal is cut to
//!   its committed bytes and synced (from then on it is read whole), and a new one
//!   two numbers on becomes current, recorded in `meta`. Every later chunk goes there.
//! - [`Journal::carry`], with nothing held: the journals up to the split are read
//!   back, the folded table's entries replaced by what its fold left, and written as
//!   the journal between, made under a temporary name, synced, renamed into place.
//!   Replayed after the older ones it changes nothing (it holds what they hold, less
//!   what the runs now hold with the same values), so a crash around it is harmless.
//! - [`Guard::carried`]: that journal recorded as the first; once sled is flushed
//!   ([`Journal::forget`]) the older ones are removed.
//!
//! A failure at any of them leaves journals that replay to what the tables hold.
//!
//! A record whose write or sync fails leaves the file in a state this process cannot
//! know (after a failed `fsync` the kernel may drop the dirty pages and a later one
//! succeed), so the journal keeps the error, as sled keeps its own, and returns it
//! from every write until the database is opened again and reads the file back. The
//! compactor then closes and reopens the database (`compactor::worker`), once
//! [`Journal::probe`] shows there is room again.
//!
//! The bytes of a journal are described in [`super::records`].

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

mod rotation;

use super::delta::Map;
pub use super::records::Group;
use super::records::{damaged, encode, frame, replay, HEADER};
use crate::support::reuse::{Reused, START_BYTES};
use crate::support::sync::lock;
use crate::support::sync_dir;
use crate::support::syncs::Syncs;
pub(super) use rotation::Split;

/// Bytes [`Journal::probe`] writes: room for a chunk's record of a few thousand
/// persons; written and synced once a reopen, so its cost does not matter.
const PROBE_BYTES: usize = 1024 * 1024;
/// The record buffer's capacity kept between chunks; a larger record's is freed.
const RECORD_KEPT: usize = 4 * 1024 * 1024;
const SUFFIX: &str = ".journal";
/// A journal being made: renamed to its name once synced.
const MAKING: &str = ".making";
/// What [`Syncs`] calls the journal's syncs: a record's bytes before the chunk's
/// transaction names them, the directory after a journal is made, and sled's flush
/// of the record naming a rotated journal before the older ones are removed.
pub(crate) const JOURNAL_SYNC: &str = "journal";
pub(crate) const JOURNAL_DIR_SYNC: &str = "journal's directory";
pub(crate) const JOURNAL_RECORD_SYNC: &str = "journal record";

/// The journal of a database's layered tables.
pub struct Journal {
    name: String,
    dir: PathBuf,
    meta: sled::Tree,
    writable: bool,
    writing: Mutex<Writing>,
    /// What the start read, per table, until the table takes it.
    replayed: Mutex<HashMap<String, Map>>,
    syncs: Syncs,
}

/// The journal being appended to.
struct Writing {
    first: u64,
    number: u64,
    /// Bytes of the current journal a committed transaction named.
    committed: u64,
    file: Option<File>,
    /// Bytes of the record last appended, not yet committed.
    appended: u64,
    /// The error a record's write or sync met, kept until the journal is opened again.
    kept: Option<Kept>,
    /// The buffer chunks' records are made in, kept between them.
    record: Reused<u8>,
}

/// An I/O error kept to be returned again: its OS code when it has one (so a full disk
/// is still seen as one), else its kind and text.
struct Kept {
    code: Option<i32>,
    kind: io::ErrorKind,
    text: String,
}

impl Kept {
    fn of(e: &io::Error) -> Kept {
        Kept {
            code: e.raw_os_error(),
            kind: e.kind(),
            text: e.to_string(),
        }
    }

    fn error(&self) -> io::Error {
        match self.code {
            Some(code) => io::Error::from_raw_os_error(code),
            None => io::Error::new(self.kind, self.text.clone()),
        }
    }
}

/// The journal held for writing: a chunk's transaction, a fold, a direct write.
pub struct Guard<'a> {
    journal: &'a Journal,
    writing: MutexGuard<'a, Writing>,
}

fn be(v: &[u8], at: usize) -> u64 {
    v.get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_be_bytes)
}

impl Journal {
    /// The journal `name` of the tables in `dir`, read back: to write when
    /// `writable` (cut and cleaned as the module docs say), else only read.
    pub fn open(meta: &sled::Tree, dir: &Path, name: &str, writable: bool) -> io::Result<Journal> {
        let key = record_key(name);
        let recorded = meta.get(&key).map_err(io::Error::other)?;
        let (first, number, committed) = match &recorded {
            Some(v) if v.len() == 24 => (be(v, 0), be(v, 8), be(v, 16)),
            Some(_) => {
                return Err(io::Error::other(format!(
                    "meta's {name} journal record is damaged"
                )))
            }
            None => (1, 1, 0),
        };
        let mut replayed: HashMap<String, Map> = HashMap::new();
        let mut file = None;
        let mut seen_current = false;
        for (n, path) in list(dir, name)? {
            if recorded.is_none() || n < first || n > number {
                // Folded already, or never recorded: nothing reads it.
                if writable {
                    tracing::info!(path = %path.display(), "removing a journal no longer used");
                    fs::remove_file(&path)?;
                }
                continue;
            }
            let bytes = fs::read(&path)?;
            let end = match n == number {
                true => committed,
                false => bytes.len() as u64,
            };
            if (bytes.len() as u64) < end {
                return Err(damaged(&path, "it is shorter than the database records"));
            }
            let whole = usize::try_from(end).map_err(io::Error::other)?;
            replay(&path, &bytes[..whole], &mut replayed)?;
            if n == number {
                seen_current = true;
                if bytes.len() as u64 > end && writable {
                    tracing::info!(path = %path.display(), cut = bytes.len() as u64 - end, "the journal's tail was never committed: cut, to be applied again from the log");
                }
                if writable {
                    let f = fs::OpenOptions::new().write(true).open(&path)?;
                    f.set_len(end)?;
                    file = Some(f);
                }
            }
        }
        if writable {
            remove_making(dir, name)?;
        }
        if recorded.is_some() && !seen_current {
            return Err(damaged(&journal_path(dir, name, number), "it is missing"));
        }
        Ok(Journal {
            name: name.to_owned(),
            dir: dir.to_path_buf(),
            meta: meta.clone(),
            writable,
            writing: Mutex::new(Writing {
                first,
                number,
                committed,
                file,
                appended: 0,
                kept: None,
                record: Reused::new(START_BYTES, RECORD_KEPT),
            }),
            replayed: Mutex::new(replayed),
            syncs: Syncs::default(),
        })
    }

    /// What the start read of `table`, taken once.
    pub fn take_replayed(&self, table: &str) -> Map {
        lock(&self.replayed).remove(table).unwrap_or_default()
    }

    /// The capacity of the buffer kept for the next record.
    #[cfg(test)]
    pub(super) fn record_capacity(&self) -> usize {
        lock(&self.writing).record.capacity()
    }

    /// Hold the journal for writing: appends and rotations happen one at a time.
    pub fn lock(&self) -> Guard<'_> {
        Guard {
            journal: self,
            writing: lock(&self.writing),
        }
    }

    pub fn syncs(&self) -> &Syncs {
        &self.syncs
    }

    /// The key of the journal's record in `meta`.
    pub fn key(&self) -> Vec<u8> {
        record_key(&self.name)
    }

    /// The journals' files and their bytes.
    pub fn file_bytes(&self) -> u64 {
        list(&self.dir, &self.name)
            .unwrap_or_default()
            .iter()
            .filter_map(|(_, p)| p.metadata().ok())
            .map(|m| m.len())
            .sum()
    }

    /// The error a record's write met, kept until the journal is opened again (see the
    /// module docs); `Ok` while it writes.
    pub fn kept_error(&self) -> io::Result<()> {
        match &lock(&self.writing).kept {
            Some(kept) => Err(kept.error()),
            None => Ok(()),
        }
    }

    /// Show that the journal can take a record again: [`PROBE_BYTES`] written past its
    /// committed bytes and synced, then cut off. A reopen after a failed write calls
    /// it, so a disk still full is waited out before the compactor writes.
    pub fn probe(&self) -> io::Result<()> {
        if !self.writable {
            return Ok(());
        }
        let mut w = lock(&self.writing);
        if let Some(kept) = &w.kept {
            return Err(kept.error());
        }
        if w.file.is_none() {
            let file = create(self, w.number, &[])?;
            w.committed = HEADER.len() as u64;
            w.file = Some(file);
        }
        let Some(file) = &w.file else {
            return Err(io::Error::other("the journal has no file"));
        };
        let zeros = vec![0u8; PROBE_BYTES];
        let tried = file
            .write_all_at(&zeros, w.committed)
            .and_then(|()| file.sync_data());
        let cut = file.set_len(w.committed);
        tried.and(cut)
    }

    /// `meta`, where a direct write records the journal's length.
    pub(super) fn meta(&self) -> &sled::Tree {
        &self.meta
    }
}

impl Guard<'_> {
    /// Write `groups` as one record after the committed bytes (replacing whatever an
    /// earlier attempt left there) and sync it; the value to record under
    /// [`Journal::key`] in the same transaction that commits it, or `None` when there
    /// is nothing to write. Until [`Guard::committed`], the record is not counted.
    pub fn append(&mut self, groups: &[Group<'_>]) -> io::Result<Option<[u8; 24]>> {
        self.writing.appended = 0;
        if let Some(kept) = &self.writing.kept {
            return Err(kept.error());
        }
        let mut record = self.writing.record.take();
        encode(groups, &mut record);
        let appended = self.append_record(&mut record);
        self.writing.record.give_back(record);
        appended
    }

    /// [`Guard::append`] of a record [`encode`] made (nothing when it is empty).
    fn append_record(&mut self, record: &mut [u8]) -> io::Result<Option<[u8; 24]>> {
        if record.is_empty() {
            return Ok(None);
        }
        let j = self.journal;
        if !j.writable {
            return Err(io::Error::other("the journal was opened only to read"));
        }
        let w = &mut *self.writing;
        if w.file.is_none() {
            let file = create(j, w.number, &[])?;
            w.committed = HEADER.len() as u64;
            w.file = Some(file);
        }
        let Some(file) = &w.file else {
            return Err(io::Error::other("the journal has no file"));
        };
        frame(record)?;
        let end = w.committed + record.len() as u64;
        let written = file
            .set_len(w.committed)
            .and_then(|()| file.write_all_at(record, w.committed))
            .and_then(|()| {
                j.syncs
                    .run_at(JOURNAL_SYNC, w.number, end, || file.sync_data())
            });
        if let Err(e) = written {
            w.kept = Some(Kept::of(&e));
            return Err(e);
        }
        w.appended = record.len() as u64;
        Ok(Some(value(w.first, w.number, end)))
    }

    /// The record last appended was committed.
    pub fn committed(&mut self) {
        self.writing.committed += std::mem::take(&mut self.writing.appended);
    }

    /// [`Guard::append`] outside a chunk: the record committed through `meta` alone
    /// (a background build, a migration, tests).
    pub fn write(&mut self, groups: &[Group<'_>]) -> io::Result<()> {
        if let Some(v) = self.append(groups)? {
            let key = self.journal.key();
            self.journal
                .meta
                .insert(key, &v[..])
                .map_err(io::Error::other)?;
            self.committed();
        }
        Ok(())
    }
}

/// Make journal `number` holding `record` after its header ([`create_with`]).
fn create(j: &Journal, number: u64, record: &[u8]) -> io::Result<File> {
    create_with(j, number, |file, at| {
        file.write_all_at(record, at)?;
        Ok(at + record.len() as u64)
    })
}

/// Make journal `number`: its header, then what `fill` writes from the offset it is
/// given on (returning where that ends), under a temporary name, synced, renamed into
/// place, its directory synced; removed again if that fails.
fn create_with(
    j: &Journal,
    number: u64,
    fill: impl FnOnce(&File, u64) -> io::Result<u64>,
) -> io::Result<File> {
    let path = journal_path(&j.dir, &j.name, number);
    let making = making_path(&path);
    let new_dir = !j.dir.exists();
    let made = (|| {
        if new_dir {
            fs::create_dir_all(&j.dir)?;
            if let Some(parent) = j.dir.parent() {
                j.syncs.run(JOURNAL_DIR_SYNC, || sync_dir(parent))?;
            }
        }
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .read(true)
            .open(&making)?;
        file.write_all_at(HEADER, 0)?;
        let end = fill(&file, HEADER.len() as u64)?;
        j.syncs
            .run_at(JOURNAL_SYNC, number, end, || file.sync_data())?;
        fs::rename(&making, &path)?;
        j.syncs.run(JOURNAL_DIR_SYNC, || sync_dir(&j.dir))?;
        Ok(file)
    })();
    if made.is_err() {
        let _ = fs::remove_file(&making);
        let _ = fs::remove_file(&path);
        if new_dir {
            // Made but not durably: the next attempt makes and syncs it again.
            let _ = fs::remove_dir(&j.dir);
        }
    }
    made
}

fn making_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(MAKING);
    PathBuf::from(name)
}

/// Remove the journals a crash left half made.
fn remove_making(dir: &Path, name: &str) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let suffix = format!("{SUFFIX}{MAKING}");
    for entry in entries {
        let entry = entry?;
        let file = entry.file_name();
        let file = file.to_string_lossy();
        if file.starts_with(&format!("{name}.")) && file.ends_with(&suffix) {
            tracing::info!(path = %entry.path().display(), "removing a journal a crash left half made");
            fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

fn record_key(name: &str) -> Vec<u8> {
    format!("{name}{SUFFIX}").into_bytes()
}

fn value(first: u64, number: u64, end: u64) -> [u8; 24] {
    let mut v = [0u8; 24];
    v[..8].copy_from_slice(&first.to_be_bytes());
    v[8..16].copy_from_slice(&number.to_be_bytes());
    v[16..].copy_from_slice(&end.to_be_bytes());
    v
}

pub(super) fn journal_path(dir: &Path, name: &str, number: u64) -> PathBuf {
    dir.join(format!("{name}.{number:010}{SUFFIX}"))
}

/// The journals of `name` in `dir`, by number.
fn list(dir: &Path, name: &str) -> io::Result<Vec<(u64, PathBuf)>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry?;
        let file = entry.file_name();
        let Some(digits) = file
            .to_str()
            .and_then(|f| f.strip_prefix(name))
            .and_then(|f| f.strip_prefix('.'))
            .and_then(|f| f.strip_suffix(SUFFIX))
        else {
            continue;
        };
        if digits.len() == 10 && digits.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(n) = digits.parse() {
                out.push((n, entry.path()));
            }
        }
    }
    out.sort();
    Ok(out)
}
