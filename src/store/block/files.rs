//! Where event blocks' bytes live: append-only files in the database directory's
//! `blocks/`, with sled's `event_blocks` tree holding, under each block's key, only
//! where its bytes are (a [`Pointer`], 25 bytes).
//!
//! Why not in sled: sled 0.34 is log-structured and rewrites a leaf whole, values and
//! all, every few changes; a segment of its file is cleaned only once at most half of
//! it is live. Blocks, written once and never changed, left sled's file at about twice
//! their size; in files of their own they take their size.
//!
//! Durability: the compactor appends a chunk's blocks, syncs the file
//! ([`Files::sync`]) and only then commits the transaction that records their pointers
//! and the checkpoint. sled may write that transaction out at any moment after the
//! commit, so a pointer never names bytes that are not yet on disk. A transaction that
//! is retried, aborted or lost in a crash leaves its appended bytes unreferenced: dead
//! space in a file, never read. A failed write or sync leaves the file's unsynced
//! pages in doubt, so the next append starts a new file; so does every start. A file
//! no pointer names any more (retention deleted its blocks) is removed by
//! [`Files::remove_unreferenced`].
//!
//! Cost: a sync per compactor chunk. A file that grows makes each `fdatasync` also
//! commit its new size to the filesystem's journal, which halved the compactor's rate,
//! so a file is written full of zeros before use (as the log's segments are) and a sync
//! then writes only data. The zeros past the last block are cut off when the file is
//! left: at the next file, at a clean stop ([`Files::finish`]) and, after a crash, at
//! the next start ([`Files::trim`]).
//!
//! Databases written before this layout hold blocks in the tree itself; a value is
//! either a block (its version byte, 1 or 2) or a pointer ([`TAG`]), and both read.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::cache::Cache;
use super::pointer::POINTER_LEN;
pub use super::pointer::{Pointer, TAG};
use super::{Block, Rows};
use crate::support::hex;
use crate::support::sync::lock;
use crate::support::syncs::Syncs;

/// The directory, inside the database's.
pub const DIR_NAME: &str = "blocks";
/// A file is made this size and takes appends up to it, then the next one is started.
/// A multiple of 4 KiB, so its zeros can be written directly (see [`crate::log::zero_fill`]).
const FILE_BYTES: u64 = if cfg!(test) {
    64 * 1024
} else {
    16 * 1024 * 1024
};
/// What [`Syncs`] calls a block file's sync, and the directory's once a file is named.
pub(crate) const FILE_SYNC: &str = "block file";
pub(crate) const DIR_SYNC: &str = "block directory";
/// A block is written with the zeros after it to the end of a page of this size: a
/// write that ends within a page the page cache does not hold (the file's zeros were
/// written past it, `O_DIRECT`) would first read that page from the disk.
const PAGE: u64 = 4096;
/// A file being made is named so until it is whole.
const MAKING_SUFFIX: &str = ".blk.new";
/// Open files kept for reading; all are closed when more are needed.
const READERS: usize = 256;
/// No block is larger: a pointer claiming more is damaged.
const MAX_BLOCK_BYTES: u32 = 64 * 1024 * 1024;

/// The name of file `n` in `blocks/`.
fn file_name(n: u32) -> String {
    format!("{n:010}.blk")
}

fn file_number(name: &str) -> Option<u32> {
    let digits = name.strip_suffix(".blk")?;
    if digits.len() != 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The file being appended to.
struct Writing {
    number: u32,
    file: File,
    end: u64,
    /// Appended since the last sync.
    dirty: bool,
    /// A block and the zeros after it to the end of its last page ([`PAGE`]).
    buffer: Vec<u8>,
}

struct Inner {
    dir: PathBuf,
    /// The file appends go to; `None` until the first append, and after a failure.
    writing: Mutex<Option<Writing>>,
    /// The next file number to create.
    next: Mutex<u32>,
    readers: Mutex<HashMap<u32, Arc<File>>>,
    /// Every sync a pointer's durability rests on goes through it.
    syncs: Syncs,
    /// Blocks decoded for reads, by pointer.
    cache: Cache,
}

/// The block files of one database; cheap to clone, shared by readers and the
/// compactor (the only writer).
#[derive(Clone)]
pub struct Files {
    inner: Arc<Inner>,
}

/// Why a block could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The value is neither a block nor a whole pointer.
    #[error("the pointer is damaged")]
    BadPointer,
    /// The file is gone: retention removed it after the pointer was read, or it was lost.
    #[error("block file {0} is missing")]
    Missing(String),
    #[error("cannot read block file {0}: {1}")]
    Io(String, io::Error),
    /// The bytes are not what was written (the file was cut short or changed).
    #[error("block file {0} does not hold the block's bytes at offset {1} (damaged or cut short)")]
    Damaged(String, u64),
}

impl Files {
    /// The block files of the database in `db_dir`; nothing is created until the
    /// first append, so opening a database only to read it changes nothing.
    pub fn open(db_dir: &Path) -> io::Result<Files> {
        let dir = db_dir.join(DIR_NAME);
        let next = scan(&dir)?
            .files
            .last()
            .map_or(0, |&(n, _)| n.saturating_add(1));
        Ok(Files {
            inner: Arc::new(Inner {
                dir,
                writing: Mutex::new(None),
                next: Mutex::new(next),
                readers: Mutex::new(HashMap::new()),
                syncs: Syncs::default(),
                cache: Cache::new(super::cache::budget()),
            }),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Append a block's value (as [`super::build`] made it); returns the pointer to
    /// store in its place. Not durable until [`Files::sync`].
    pub fn append(&self, value: &[u8]) -> io::Result<[u8; POINTER_LEN]> {
        let count = super::count(value).ok_or_else(|| io::Error::other("not an event block"))?;
        let len = u32::try_from(value.len())
            .ok()
            .filter(|&n| n <= MAX_BLOCK_BYTES)
            .ok_or_else(|| io::Error::other("event block too large"))?;
        let mut writing = lock(&self.inner.writing);
        let full = |w: &Writing| w.end > 0 && w.end + u64::from(len) > FILE_BYTES;
        if writing.as_ref().is_none_or(full) {
            if let Some(old) = writing.take() {
                // Blocks of this chunk may be in it: [`Files::sync`] syncs only the
                // file appends go to, so this one is synced as it is left. A failure
                // gives it up like any other, and fails the chunk.
                let synced = match old.dirty {
                    true => self.sync_data(&old),
                    false => Ok(()),
                };
                leave(&old);
                synced?;
            }
            *writing = Some(self.create()?);
        }
        let Some(w) = writing.as_mut() else {
            return Err(io::Error::other("no block file open"));
        };
        // The file is zeros past `end`, and stays so past the block: only the read of
        // the page it ends in is saved. FILE_BYTES is whole pages.
        let padded = (w.end + u64::from(len)).next_multiple_of(PAGE) - w.end;
        w.buffer.clear();
        w.buffer.extend_from_slice(value);
        w.buffer.resize(padded as usize, 0);
        if let Err(e) = w.file.write_all_at(&w.buffer, w.end) {
            if let Some(old) = writing.take() {
                leave(&old);
            }
            return Err(e);
        }
        let pointer = Pointer {
            count,
            file: w.number,
            offset: w.end,
            len,
            crc: crc32fast::hash(value),
        };
        w.end += u64::from(len);
        w.dirty = true;
        Ok(pointer.encode())
    }

    /// Make every append so far durable. After a failure the file is given up: its
    /// unsynced pages may be lost, so the next append starts another.
    pub fn sync(&self) -> io::Result<()> {
        let mut writing = lock(&self.inner.writing);
        let Some(w) = writing.as_mut() else {
            return Ok(());
        };
        if !w.dirty {
            return Ok(());
        }
        match self.sync_data(w) {
            Ok(()) => {
                w.dirty = false;
                Ok(())
            }
            Err(e) => {
                if let Some(old) = writing.take() {
                    leave(&old);
                }
                Err(e)
            }
        }
    }

    /// Sync the data appended to `w` so far: the one call that makes blocks durable.
    fn sync_data(&self, w: &Writing) -> io::Result<()> {
        let syncs = &self.inner.syncs;
        syncs.run_at(FILE_SYNC, w.number.into(), w.end, || w.file.sync_data())
    }

    /// At a clean stop: the file being appended to loses the zeros past its last
    /// block, so a stopped database holds only what it stores.
    pub fn finish(&self) -> io::Result<()> {
        let Some(w) = lock(&self.inner.writing).take() else {
            return Ok(());
        };
        w.file.set_len(w.end)?;
        w.file.sync_all()
    }

    /// At a start, before any append: cut the zeros off a file a crash left whole
    /// (made to `FILE_BYTES` and never left), down to the end of the last block a
    /// pointer in `tree` names; and remove files a crash left half made. Only a file of
    /// exactly the made size needs the pointers read.
    pub fn trim(&self, tree: &sled::Tree) -> Result<(), super::super::Error> {
        let blocks = super::super::Error::Blocks;
        let found = scan(&self.inner.dir).map_err(blocks)?;
        for making in found.making {
            fs::remove_file(making).map_err(blocks)?;
        }
        let mut whole: HashMap<u32, u64> = found
            .files
            .iter()
            .filter(|&&(_, len)| len == FILE_BYTES)
            .map(|&(n, _)| (n, 0))
            .collect();
        if whole.is_empty() {
            return Ok(());
        }
        for item in tree.iter() {
            let (_, value) = item?;
            if let Some(p) = Pointer::decode(&value) {
                if let Some(end) = whole.get_mut(&p.file) {
                    *end = (*end).max(p.offset + u64::from(p.len));
                }
            }
        }
        for (n, end) in whole {
            let path = self.inner.dir.join(file_name(n));
            let file = OpenOptions::new().write(true).open(&path).map_err(blocks)?;
            file.set_len(end)
                .and_then(|()| file.sync_all())
                .map_err(blocks)?;
            tracing::info!(file = %path.display(), bytes = end, "block file left whole by a crash cut to its blocks");
        }
        Ok(())
    }

    /// Start the next file: written whole with zeros and synced under a temporary
    /// name, then renamed, the directory synced before any pointer to it can be
    /// committed.
    fn create(&self) -> io::Result<Writing> {
        fs::create_dir_all(&self.inner.dir)?;
        let mut next = lock(&self.inner.next);
        let number = *next;
        let path = self.inner.dir.join(file_name(number));
        let making = self.inner.dir.join(format!("{number:010}{MAKING_SUFFIX}"));
        if let Err(e) = crate::log::zero_fill(&making, FILE_BYTES) {
            let _ = fs::remove_file(&making);
            return Err(e);
        }
        *next = number
            .checked_add(1)
            .ok_or_else(|| io::Error::other("block file numbers exhausted"))?;
        fs::rename(&making, &path)?;
        let syncs = &self.inner.syncs;
        syncs.run_at(DIR_SYNC, number.into(), 0, || {
            crate::support::sync_dir(&self.inner.dir)
        })?;
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        Ok(Writing {
            number,
            file,
            end: 0,
            dirty: false,
            buffer: Vec::new(),
        })
    }

    /// A tree value's block bytes: the value itself when it holds the block, else
    /// the bytes its pointer names, checked against the pointer's CRC.
    pub fn resolve<'a>(&self, value: &'a [u8]) -> Result<Cow<'a, [u8]>, ReadError> {
        if value.first() != Some(&TAG) {
            return Ok(Cow::Borrowed(value));
        }
        let p = Pointer::decode(value).ok_or(ReadError::BadPointer)?;
        if p.len > MAX_BLOCK_BYTES {
            return Err(ReadError::BadPointer);
        }
        let name = file_name(p.file);
        let file = self.reader(p.file).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => ReadError::Missing(name.clone()),
            _ => ReadError::Io(name.clone(), e),
        })?;
        let mut bytes = vec![0u8; p.len as usize];
        match file.read_exact_at(&mut bytes, p.offset) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(ReadError::Damaged(name, p.offset))
            }
            Err(e) => return Err(ReadError::Io(name, e)),
        }
        if crc32fast::hash(&bytes) != p.crc {
            return Err(ReadError::Damaged(name, p.offset));
        }
        Ok(Cow::Owned(bytes))
    }

    /// The block a tree value holds or points at; `None` (logged) when it cannot be
    /// read or does not decode, so one bad block never breaks a whole read.
    pub fn decode(&self, key: &[u8], value: &[u8]) -> Option<Block> {
        Block::decode(&self.read(key, value)?)
    }

    /// [`Files::decode`], each event's properties made only when asked for; kept in
    /// the [cache](super::cache) for the reads that come back to it.
    pub fn rows(&self, key: &[u8], value: &[u8]) -> Option<Arc<Rows>> {
        let pointer = Pointer::decode(value);
        if let Some(hit) = pointer.and_then(|p| self.inner.cache.get(p)) {
            return Some(hit);
        }
        let rows = Arc::new(Rows::decode(&self.read(key, value)?)?);
        if let Some(p) = pointer {
            self.inner.cache.insert(p, rows.clone());
        }
        Some(rows)
    }

    /// [`Files::rows`] past the cache, for a read of every block once (the event
    /// index's build) that would only push out the blocks reads come back to.
    pub fn rows_uncached(&self, key: &[u8], value: &[u8]) -> Option<Rows> {
        Rows::decode(&self.read(key, value)?)
    }

    /// Decoded bytes the cache holds.
    pub fn cached_bytes(&self) -> usize {
        self.inner.cache.bytes()
    }

    fn read<'a>(&self, key: &[u8], value: &'a [u8]) -> Option<Cow<'a, [u8]>> {
        self.resolve(value)
            .inspect_err(|e| tracing::warn!(error = %e, key = %hex(key), "event block skipped"))
            .ok()
    }

    fn reader(&self, number: u32) -> io::Result<Arc<File>> {
        let mut readers = lock(&self.inner.readers);
        if let Some(file) = readers.get(&number) {
            return Ok(file.clone());
        }
        if readers.len() >= READERS {
            readers.clear();
        }
        let file = Arc::new(File::open(self.inner.dir.join(file_name(number)))?);
        readers.insert(number, file.clone());
        Ok(file)
    }

    /// Remove the files no pointer in `tree` names, but the one being appended to;
    /// returns how many. Run by the compactor's thread (the only writer) after
    /// retention deleted blocks, never during a step.
    pub fn remove_unreferenced(&self, tree: &sled::Tree) -> Result<usize, sled::Error> {
        let mut named = HashSet::new();
        for item in tree.iter() {
            let (_, value) = item?;
            if let Some(p) = Pointer::decode(&value) {
                named.insert(p.file);
            }
        }
        let writing = lock(&self.inner.writing).as_ref().map(|w| w.number);
        let mut removed = 0;
        for (n, _) in scan(&self.inner.dir)?.files {
            if named.contains(&n) || Some(n) == writing {
                continue;
            }
            lock(&self.inner.readers).remove(&n);
            let path = self.inner.dir.join(file_name(n));
            match fs::remove_file(&path) {
                Ok(()) => removed += 1,
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "cannot remove an unused block file")
                }
            }
        }
        Ok(removed)
    }

    #[cfg(test)]
    pub(crate) fn syncs(&self) -> &Syncs {
        &self.inner.syncs
    }

    /// Every block file and its size, oldest first.
    #[cfg(test)]
    pub fn list(&self) -> io::Result<Vec<(u32, u64)>> {
        Ok(scan(&self.inner.dir)?.files)
    }
}

/// What the block files' directory holds.
struct Scan {
    /// Each block file's number and size, oldest first.
    files: Vec<(u32, u64)>,
    /// Files a crash left half made.
    making: Vec<PathBuf>,
}

/// The directory's files; none when it does not exist yet (nothing appended).
fn scan(dir: &Path) -> io::Result<Scan> {
    let mut found = Scan {
        files: Vec::new(),
        making: Vec::new(),
    };
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.ends_with(MAKING_SUFFIX) {
            found.making.push(entry.path());
        } else if let Some(n) = file_number(&name) {
            found.files.push((n, entry.metadata()?.len()));
        }
    }
    found.files.sort_unstable();
    Ok(found)
}

/// A file appends no longer go to loses the zeros past its last block. Only space is
/// at stake (the blocks are synced, the zeros never read), so a failure is logged.
fn leave(w: &Writing) {
    if let Err(e) = w.file.set_len(w.end) {
        tracing::warn!(file = w.number, error = %e, "cannot cut the unused end off a block file");
    }
}

#[cfg(test)]
#[path = "tests/files.rs"]
mod tests;
