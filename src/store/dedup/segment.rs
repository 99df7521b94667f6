//! A frozen segment's uuids on disk: sorted by project then uuid in a file of their
//! own, with a sparse index in memory (the first uuid and a CRC-32 of every block of
//! [`BLOCK`] uuids, each project's range and its least and greatest uuid: about 20
//! bytes per 256 uuids). Only a fingerprint that matches reads the file, one block of
//! 4 KiB at a known offset (from the page cache, which is not the process's resident
//! set); the hot path, a uuid no fingerprint matches, never does.
//!
//! The file is scratch: the window is rebuilt from `recent_ids` and the event blocks
//! at every start. It is unlinked as soon as it is created, so a crash leaves nothing
//! behind, nothing else can remove it, and dropping the segment (closing the file)
//! frees its space. A block read short or not matching its checksum (the file damaged
//! behind the window's back) is an error, never an answer: the caller drops the window
//! and builds it again from the database.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Id;

/// Uuids a block: one 4 KiB read confirms a match.
const BLOCK: usize = 256;
const ENTRY: usize = std::mem::size_of::<u128>();
const BLOCK_BYTES: usize = BLOCK * ENTRY;
/// Blocks read at once when the whole segment is read (a prune, a merge, a rebuild).
const READ_BLOCKS: usize = 16;

/// Names files apart within the process (the process's id sets processes apart).
static NEXT_FILE: AtomicU64 = AtomicU64::new(0);

/// One project's uuids in the segment: entries `start..end`, from `lo` to `hi`.
struct Project {
    id: u64,
    start: usize,
    end: usize,
    lo: u128,
    hi: u128,
}

pub struct Segment {
    file: File,
    len: usize,
    projects: Vec<Project>,
    /// The first uuid of every block.
    firsts: Box<[u128]>,
    /// The CRC-32 of every block's bytes.
    sums: Box<[u32]>,
}

fn damaged(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

fn uuid_at(bytes: &[u8]) -> u128 {
    let mut b = [0; ENTRY];
    b.copy_from_slice(bytes);
    u128::from_be_bytes(b)
}

impl Segment {
    /// Write `ids`, sorted by project then uuid, to a new file in `dir`.
    pub fn write(dir: &Path, ids: &[Id]) -> io::Result<Segment> {
        let n = NEXT_FILE.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{}-{n}.seg", std::process::id()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        std::fs::remove_file(&path)?;
        let mut projects: Vec<Project> = Vec::new();
        let mut start = 0;
        for run in ids.chunk_by(|a, b| a.0 == b.0) {
            let (first, last) = (run[0], run[run.len() - 1]);
            let end = start + run.len();
            projects.push(Project {
                id: first.0,
                start,
                end,
                lo: first.1,
                hi: last.1,
            });
            start = end;
        }
        let mut out = BufWriter::with_capacity(READ_BLOCKS * BLOCK_BYTES, &file);
        let (mut firsts, mut sums) = (Vec::new(), Vec::new());
        let mut block = [0u8; BLOCK_BYTES];
        for chunk in ids.chunks(BLOCK) {
            let bytes = &mut block[..chunk.len() * ENTRY];
            for (to, &(_, id)) in bytes.chunks_exact_mut(ENTRY).zip(chunk) {
                to.copy_from_slice(&id.to_be_bytes());
            }
            out.write_all(bytes)?;
            firsts.push(chunk[0].1);
            sums.push(crc32fast::hash(bytes));
        }
        out.flush()?;
        drop(out);
        Ok(Segment {
            file,
            len: ids.len(),
            projects,
            firsts: firsts.into(),
            sums: sums.into(),
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes it holds in memory (its uuids are on disk).
    pub fn bytes(&self) -> usize {
        self.projects.capacity() * std::mem::size_of::<Project>()
            + self.firsts.len() * ENTRY
            + self.sums.len() * std::mem::size_of::<u32>()
    }

    /// Each project with its least and greatest uuid.
    pub fn bounds(&self) -> impl Iterator<Item = (u64, u128, u128)> + '_ {
        self.projects.iter().map(|p| (p.id, p.lo, p.hi))
    }

    /// Read `buf.len()` bytes from block `first` on and check each block's sum.
    fn read(&self, first: usize, buf: &mut [u8]) -> io::Result<()> {
        self.file
            .read_exact_at(buf, (first * BLOCK_BYTES) as u64)
            .map_err(|e| damaged(format!("deduplication segment, block {first}: {e}")))?;
        for (i, block) in buf.chunks(BLOCK_BYTES).enumerate() {
            let at = first + i;
            if self.sums.get(at) != Some(&crc32fast::hash(block)) {
                return Err(damaged(format!(
                    "deduplication segment, block {at}: checksum mismatch"
                )));
            }
        }
        Ok(())
    }

    /// Bytes of the blocks `first..first + blocks` (the last may be short).
    fn span(&self, first: usize, blocks: usize) -> usize {
        ((first + blocks) * BLOCK).min(self.len) * ENTRY - first * BLOCK_BYTES
    }

    /// Whether it holds `id`: no read unless the id is within its project's bounds,
    /// then one block.
    pub fn contains(&self, (project, id): Id) -> io::Result<bool> {
        let Some(p) = self.projects.iter().find(|p| p.id == project) else {
            return Ok(false);
        };
        // Time-ordered (v7) uuids of older segments fail the range check.
        if id < p.lo || p.hi < id {
            return Ok(false);
        }
        // The project's blocks after its first begin with one of its uuids: the one
        // to read is the last that begins at or below `id`.
        let (first, last) = (p.start / BLOCK, (p.end - 1) / BLOCK);
        let block = first + self.firsts[first + 1..=last].partition_point(|&f| f <= id);
        let mut buf = [0u8; BLOCK_BYTES];
        let bytes = &mut buf[..self.span(block, 1)];
        self.read(block, bytes)?;
        let offset = block * BLOCK;
        let (from, to) = (
            p.start.max(offset) - offset,
            p.end.min(offset + BLOCK) - offset,
        );
        // The block's part of the project, decoded, then searched.
        let mut ids = [0u128; BLOCK];
        let entries = bytes[from * ENTRY..to * ENTRY].chunks_exact(ENTRY);
        for (slot, entry) in ids.iter_mut().zip(entries) {
            *slot = uuid_at(entry);
        }
        Ok(ids[..to - from].binary_search(&id).is_ok())
    }

    /// Every (project, uuid) it holds, in order, read back from the file.
    pub fn for_each(&self, mut f: impl FnMut(Id)) -> io::Result<()> {
        let mut buf = vec![0u8; READ_BLOCKS * BLOCK_BYTES];
        let mut projects = self.projects.iter();
        let mut project = projects.next();
        let mut at = 0;
        for first in (0..self.sums.len()).step_by(READ_BLOCKS) {
            let bytes = &mut buf[..self.span(first, READ_BLOCKS)];
            self.read(first, bytes)?;
            for entry in bytes.chunks_exact(ENTRY) {
                while project.is_some_and(|p| p.end <= at) {
                    project = projects.next();
                }
                let Some(p) = project else {
                    return Err(damaged(
                        "deduplication segment: more uuids than its projects".into(),
                    ));
                };
                f((p.id, uuid_at(entry)));
                at += 1;
            }
        }
        Ok(())
    }

    /// Test hook: overwrite the file's bytes at `offset`, as damage would.
    #[cfg(test)]
    pub fn damage(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all_at(bytes, offset)
    }

    /// Test hook: cut the file short.
    #[cfg(test)]
    pub fn truncate(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
}
