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
//! A fold rotates the journal ([`Guard::rotate`]): the new one starts with what the
//! tables hold that is not in their runs (what the fold left, the other tables'
//! changes), is synced with its directory, then recorded as first and current (sled
//! flushed); only then are the older journals removed.
//!
//! ```text
//! header: "flagpost-journal 1\n"
//! record: len u32 LE, crc32 u32 LE of the payload, payload
//! payload, per table: name_len u8, name, entries u32 LE,
//!                     per entry: key_len u32 LE, value_len u32 LE, key, value
//! ```

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use sled::IVec;

use super::delta::Map;
use crate::support::sync::lock;
use crate::support::sync_dir;
use crate::support::syncs::Syncs;

const HEADER: &[u8] = b"flagpost-journal 1\n";
const SUFFIX: &str = ".journal";
/// What [`Syncs`] calls the journal's syncs: a record's bytes before the chunk's
/// transaction names them, the directory after a journal is made, and sled's flush
/// of the record naming a rotated journal before the older ones are removed.
pub(crate) const JOURNAL_SYNC: &str = "journal";
pub(crate) const JOURNAL_DIR_SYNC: &str = "journal's directory";
pub(crate) const JOURNAL_RECORD_SYNC: &str = "journal record";

/// One table's entries in a record.
pub type Group<'a> = (&'a str, &'a [(IVec, IVec)]);

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
}

/// The journal held for writing: a chunk's transaction, a fold, a direct write.
pub struct Guard<'a> {
    journal: &'a Journal,
    writing: MutexGuard<'a, Writing>,
}

fn damaged(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{} is damaged: {what}", path.display()),
    )
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
            }),
            replayed: Mutex::new(replayed),
            syncs: Syncs::default(),
        })
    }

    /// What the start read of `table`, taken once.
    pub fn take_replayed(&self, table: &str) -> Map {
        lock(&self.replayed).remove(table).unwrap_or_default()
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
        let payload = encode(groups);
        if payload.is_empty() {
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
        let record = frame(&payload)?;
        file.set_len(w.committed)?;
        file.write_all_at(&record, w.committed)?;
        let end = w.committed + record.len() as u64;
        j.syncs
            .run_at(JOURNAL_SYNC, w.number, end, || file.sync_data())?;
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

    /// Start a new journal holding `head` (what the tables hold outside their runs),
    /// record it as first and current, then remove the older ones (module docs). A
    /// failure before it is recorded leaves the old journal current.
    pub fn rotate(&mut self, head: &[Group<'_>]) -> io::Result<()> {
        let j = self.journal;
        let next = self.writing.number + 1;
        let payload = encode(head);
        let record = match payload.is_empty() {
            true => Vec::new(),
            false => frame(&payload)?,
        };
        let file = create(j, next, &record)?;
        let end = (HEADER.len() + record.len()) as u64;
        let v = value(next, next, end);
        if let Err(e) = j.meta.insert(j.key(), &v[..]) {
            let _ = fs::remove_file(journal_path(&j.dir, &j.name, next));
            return Err(io::Error::other(e));
        }
        let old = self.writing.number;
        *self.writing = Writing {
            first: next,
            number: next,
            committed: end,
            file: Some(file),
            appended: 0,
        };
        j.syncs.run(JOURNAL_RECORD_SYNC, || {
            j.meta.flush().map_err(io::Error::other)
        })?;
        for (n, path) in list(&j.dir, &j.name)? {
            if n <= old {
                if let Err(e) = fs::remove_file(&path) {
                    tracing::warn!(path = %path.display(), error = %e, "a folded journal could not be removed; it is removed at the next start");
                }
            }
        }
        Ok(())
    }
}

/// Make journal `number` holding `record` after its header, synced with its
/// directory; removed again if that fails.
fn create(j: &Journal, number: u64, record: &[u8]) -> io::Result<File> {
    let path = journal_path(&j.dir, &j.name, number);
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
            .open(&path)?;
        file.write_all_at(HEADER, 0)?;
        file.write_all_at(record, HEADER.len() as u64)?;
        let end = (HEADER.len() + record.len()) as u64;
        j.syncs
            .run_at(JOURNAL_SYNC, number, end, || file.sync_data())?;
        j.syncs.run(JOURNAL_DIR_SYNC, || sync_dir(&j.dir))?;
        Ok(file)
    })();
    if made.is_err() {
        let _ = fs::remove_file(&path);
        if new_dir {
            // Made but not durably: the next attempt makes and syncs it again.
            let _ = fs::remove_dir(&j.dir);
        }
    }
    made
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

fn encode(groups: &[Group<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for (table, entries) in groups.iter().filter(|(_, e)| !e.is_empty()) {
        out.push(table.len() as u8);
        out.extend_from_slice(table.as_bytes());
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for (k, v) in entries.iter() {
            out.extend_from_slice(&(k.len() as u32).to_le_bytes());
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(k);
            out.extend_from_slice(v);
        }
    }
    out
}

fn frame(payload: &[u8]) -> io::Result<Vec<u8>> {
    let len = u32::try_from(payload.len())
        .map_err(|_| io::Error::other("a journal record of 4 GiB or more"))?;
    let mut record = Vec::with_capacity(payload.len() + 8);
    record.extend_from_slice(&len.to_le_bytes());
    record.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    record.extend_from_slice(payload);
    Ok(record)
}

/// Apply the records of `bytes` (a journal up to where it is committed) to `maps`.
fn replay(path: &Path, bytes: &[u8], maps: &mut HashMap<String, Map>) -> io::Result<()> {
    let body = bytes
        .strip_prefix(HEADER)
        .ok_or_else(|| damaged(path, "it does not start as a journal"))?;
    let mut at = 0usize;
    let cut = || damaged(path, "a record is cut short or fails its CRC");
    while at < body.len() {
        let len = u32_at(body, at).ok_or_else(cut)? as usize;
        let crc = u32_at(body, at + 4).ok_or_else(cut)?;
        let payload = body.get(at + 8..at + 8 + len).ok_or_else(cut)?;
        if crc32fast::hash(payload) != crc {
            return Err(cut());
        }
        decode(payload, maps).ok_or_else(cut)?;
        at += 8 + len;
    }
    Ok(())
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn decode(payload: &[u8], maps: &mut HashMap<String, Map>) -> Option<()> {
    let mut at = 0usize;
    while at < payload.len() {
        let name_len = *payload.get(at)? as usize;
        let name = std::str::from_utf8(payload.get(at + 1..at + 1 + name_len)?).ok()?;
        at += 1 + name_len;
        let count = u32_at(payload, at)?;
        at += 4;
        let map = maps.entry(name.to_owned()).or_default();
        for _ in 0..count {
            let k = u32_at(payload, at)? as usize;
            let v = u32_at(payload, at + 4)? as usize;
            let key = payload.get(at + 8..at + 8 + k)?;
            let value = payload.get(at + 8 + k..at + 8 + k + v)?;
            map.insert(IVec::from(key), IVec::from(value));
            at += 8 + k + v;
        }
    }
    Some(())
}
