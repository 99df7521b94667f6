//! Writing a [`super::Run`]: its format is described there.

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::filter::Filter;
use super::run::{put_note, Noter, BLOCK_BYTES, FOOTER_MAGIC, MAGIC};
use crate::support::reuse::{self, Reused, START_BYTES};

/// Bytes gathered before they are written to the file.
const FLUSH_BYTES: usize = 256 * 1024;

thread_local! {
    /// A thread's buffers for the runs it writes (the fold thread's, mostly), kept
    /// between runs: the file's bytes on their way out, and the keys' hashes (one a key,
    /// for the filter).
    static OUT: RefCell<Reused<u8>> = const { RefCell::new(Reused::new(START_BYTES, START_BYTES)) };
    static HASHES: RefCell<Reused<u64>> =
        const { RefCell::new(Reused::new(START_BYTES / 8, START_BYTES / 8)) };
}

/// The capacities this thread keeps for its next run: the output's bytes and the
/// hashes' count.
#[cfg(test)]
pub(super) fn kept_capacities() -> (usize, usize) {
    let out = OUT.with(|r| r.borrow().capacity());
    (out, HASHES.with(|r| r.borrow().capacity()))
}

/// Writes a run; keys must come in ascending order.
pub struct Writer {
    path: PathBuf,
    file: File,
    /// Bytes not yet written to `file`.
    out: Vec<u8>,
    written: u64,
    block: Vec<u8>,
    /// The first key of the block being filled.
    first_key: Vec<u8>,
    last_key: Option<Vec<u8>>,
    /// The blocks cut so far, as the index lists them.
    index: Vec<u8>,
    blocks: u32,
    hashes: Vec<u64>,
    entries: u64,
    raw_bytes: u64,
    /// The table's noter, and the notes of the blocks cut, by part, written after
    /// them (and a note on its way).
    noter: Option<Noter>,
    notes: Vec<Vec<u8>>,
    note: Vec<u8>,
}

impl Writer {
    /// A new run at `path` (replacing any file there).
    pub fn create(path: &Path) -> io::Result<Writer> {
        let file = File::create(path)?;
        let mut out = reuse::take(&OUT);
        out.extend_from_slice(MAGIC);
        Ok(Writer {
            path: path.to_path_buf(),
            file,
            out,
            written: MAGIC.len() as u64,
            block: Vec::with_capacity(BLOCK_BYTES * 2),
            first_key: Vec::new(),
            last_key: None,
            index: Vec::new(),
            blocks: 0,
            hashes: reuse::take(&HASHES),
            entries: 0,
            raw_bytes: 0,
            noter: None,
            notes: Vec::new(),
            note: Vec::new(),
        })
    }

    /// Note each block with `noter` (see [`super::run`]'s notes).
    pub fn noting(mut self, noter: Option<Noter>) -> Writer {
        self.notes = noter.map_or(Vec::new(), |n| vec![Vec::new(); n.parts.len()]);
        self.noter = noter;
        self
    }

    /// Bytes of the keys and values pushed.
    pub fn raw_bytes(&self) -> u64 {
        self.raw_bytes
    }

    pub fn push(&mut self, key: &[u8], value: &[u8]) -> io::Result<()> {
        if self.last_key.as_deref().is_some_and(|l| l >= key) {
            return Err(io::Error::other(format!(
                "{}: keys out of order",
                self.path.display()
            )));
        }
        let too_long = || io::Error::other("a key or value of 4 GiB or more");
        let k = u32::try_from(key.len()).map_err(|_| too_long())?;
        let v = u32::try_from(value.len()).map_err(|_| too_long())?;
        if self.block.is_empty() {
            self.first_key.clear();
            self.first_key.extend_from_slice(key);
        }
        self.block.extend_from_slice(&k.to_le_bytes());
        self.block.extend_from_slice(&v.to_le_bytes());
        self.block.extend_from_slice(key);
        self.block.extend_from_slice(value);
        self.hashes.push(Filter::hash(key));
        self.entries += 1;
        self.raw_bytes += (key.len() + value.len()) as u64;
        // Reused: one allocation for the run, not one a key.
        let last = self.last_key.get_or_insert_with(Vec::new);
        last.clear();
        last.extend_from_slice(key);
        if self.block.len() >= BLOCK_BYTES {
            self.cut()?;
        }
        Ok(())
    }

    fn cut(&mut self) -> io::Result<()> {
        if self.block.is_empty() {
            return Ok(());
        }
        if let Some(noter) = &self.noter {
            put_note(noter, &self.block, &mut self.note, &mut self.notes)?;
        }
        let stored = lz4_flex::block::compress(&self.block);
        let len = |n: usize| u32::try_from(n).map_err(io::Error::other);
        let index = &mut self.index;
        index.extend_from_slice(&self.written.to_le_bytes());
        index.extend_from_slice(&len(stored.len())?.to_le_bytes());
        index.extend_from_slice(&len(self.block.len())?.to_le_bytes());
        index.extend_from_slice(&crc32fast::hash(&stored).to_le_bytes());
        index.extend_from_slice(&len(self.first_key.len())?.to_le_bytes());
        index.extend_from_slice(&self.first_key);
        self.blocks = self
            .blocks
            .checked_add(1)
            .ok_or_else(|| io::Error::other("too many blocks"))?;
        self.out.extend_from_slice(&stored);
        self.written += stored.len() as u64;
        self.block.clear();
        if self.out.len() >= FLUSH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.write_all(&self.out)?;
        self.out.clear();
        Ok(())
    }

    /// Write the index and footer. The file is returned unsynced: whoever names it
    /// syncs it first (a fold does, through its counted sync, [`super::RUN_SYNC`]).
    pub fn finish(mut self) -> io::Result<File> {
        self.cut()?;
        let Writer {
            mut file,
            mut out,
            mut written,
            index: blocks_index,
            blocks,
            hashes,
            entries,
            raw_bytes,
            noter,
            notes,
            ..
        } = self;
        let notes_at = written;
        for part in &notes {
            out.extend_from_slice(part);
            written += part.len() as u64;
        }
        // The index is made in the buffer, after the blocks and notes not yet written.
        let start = out.len();
        let index = &mut out;
        index.extend_from_slice(&entries.to_le_bytes());
        index.extend_from_slice(&raw_bytes.to_le_bytes());
        index.extend_from_slice(&blocks.to_le_bytes());
        index.extend_from_slice(&blocks_index);
        let filter = Filter::build(&hashes);
        index.extend_from_slice(&filter.probes.to_le_bytes());
        let words = u32::try_from(filter.words.len()).map_err(io::Error::other)?;
        index.extend_from_slice(&words.to_le_bytes());
        for w in &filter.words {
            index.extend_from_slice(&w.to_le_bytes());
        }
        if let Some(noter) = noter {
            index.extend_from_slice(&notes_at.to_le_bytes());
            let parts = u32::try_from(noter.parts.len()).map_err(io::Error::other)?;
            index.extend_from_slice(&parts.to_le_bytes());
            for len in noter.parts {
                index.extend_from_slice(&len.to_le_bytes());
            }
        }
        let index_len = (index.len() - start) as u64;
        let crc = crc32fast::hash(&index[start..]);
        index.extend_from_slice(&written.to_le_bytes());
        index.extend_from_slice(&index_len.to_le_bytes());
        index.extend_from_slice(&crc.to_le_bytes());
        index.extend_from_slice(FOOTER_MAGIC);
        file.write_all(&out)?;
        // Kept for the thread's next run (a writer that fails frees them).
        reuse::give_back(&OUT, out);
        reuse::give_back(&HASHES, hashes);
        Ok(file)
    }
}
