//! One run of the event index: an immutable file holding, per key (a project's
//! distinct id, event name or property key), the ids of the blocks with its events, and per block
//! its project and newest time (what names the block in the `events` tree) and its
//! oldest (so a read before a time passes over it unread). Written once by a fold or a
//! merge, synced and renamed into place, then only read.
//!
//! Layout: pages of entries in key order, each LZ4'd with its CRC-32 in the page index;
//! the page index (each page's first key, offset, length, CRC); the block table; a
//! footer. An entry is its key (varint length, bytes: project big-endian, a kind byte,
//! then the distinct id or the name; see [`super::recent::key`]) and its block ids
//! ascending (varint count, varint deltas). The block table is LZ4'd: per block
//! ascending, the id's delta, the project, the newest time's zigzag delta and the
//! newest less the oldest, all varints. Version 1 (`FPEIDX01`) had distinct-id keys
//! only, without the kind, and no oldest times; version 2 (`FPEIDX02`) no property
//! keys: their index is built again. Opening
//! reads the page index and the block table (a few bytes a block); a lookup reads and
//! decodes one page.

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use super::names::{Names, Places};
pub use super::table::BlockRef;
use super::table::{decode_table, encode_table, get_varint, put_varint, ByNewest};

/// Uncompressed bytes a page holds (the last entry may pass it): a lookup decodes one.
const PAGE_BYTES: usize = 16 * 1024;
/// The footer's first bytes, and the format's version.
const MAGIC: &[u8; 8] = b"FPEIDX03";
/// magic, index offset and length, table offset and length, their CRCs, entries, blocks.
const FOOTER_LEN: usize = 8 + 8 + 4 + 8 + 4 + 4 + 4 + 8 + 8;
/// No section or page claims more: a larger length is damage, refused before allocating.
const MAX_SECTION: u64 = 1 << 32;

fn damaged(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("event index run: {what}"),
    )
}

/// Writes a run's entries, given in ascending key order, then its block table.
pub struct Writer {
    file: io::BufWriter<File>,
    written: u64,
    page: Vec<u8>,
    page_first: Vec<u8>,
    index: Vec<u8>,
    entries: u64,
}

impl Writer {
    pub fn create(path: &Path) -> io::Result<Writer> {
        Ok(Writer {
            file: io::BufWriter::new(File::create(path)?),
            written: 0,
            page: Vec::new(),
            page_first: Vec::new(),
            index: Vec::new(),
            entries: 0,
        })
    }

    /// One entry: `ids` ascending and without repeats.
    pub fn entry(&mut self, key: &[u8], ids: &[u64]) -> io::Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        if self.page.is_empty() {
            self.page_first = key.to_vec();
        }
        put_varint(&mut self.page, key.len() as u64);
        self.page.extend_from_slice(key);
        put_varint(&mut self.page, ids.len() as u64);
        let mut last = 0;
        for &id in ids {
            put_varint(&mut self.page, id - last);
            last = id;
        }
        self.entries += 1;
        if self.page.len() >= PAGE_BYTES {
            self.flush_page()?;
        }
        Ok(())
    }

    fn flush_page(&mut self) -> io::Result<()> {
        if self.page.is_empty() {
            return Ok(());
        }
        let packed = lz4_flex::compress_prepend_size(&self.page);
        self.file.write_all(&packed)?;
        put_varint(&mut self.index, self.page_first.len() as u64);
        self.index.extend_from_slice(&self.page_first);
        put_varint(&mut self.index, self.written);
        put_varint(&mut self.index, packed.len() as u64);
        put_varint(&mut self.index, u64::from(crc32fast::hash(&packed)));
        self.written += packed.len() as u64;
        self.page.clear();
        Ok(())
    }

    /// Write the page index, `blocks` (ascending by id) and the footer, and sync.
    pub fn finish(mut self, blocks: &[BlockRef]) -> io::Result<()> {
        self.flush_page()?;
        let index = lz4_flex::compress_prepend_size(&self.index);
        let table = lz4_flex::compress_prepend_size(&encode_table(blocks));
        let index_at = self.written;
        let table_at = index_at + index.len() as u64;
        self.file.write_all(&index)?;
        self.file.write_all(&table)?;
        let mut footer = Vec::with_capacity(FOOTER_LEN);
        footer.extend_from_slice(MAGIC);
        footer.extend_from_slice(&index_at.to_le_bytes());
        footer.extend_from_slice(&(index.len() as u32).to_le_bytes());
        footer.extend_from_slice(&table_at.to_le_bytes());
        footer.extend_from_slice(&(table.len() as u32).to_le_bytes());
        footer.extend_from_slice(&crc32fast::hash(&index).to_le_bytes());
        footer.extend_from_slice(&crc32fast::hash(&table).to_le_bytes());
        footer.extend_from_slice(&self.entries.to_le_bytes());
        footer.extend_from_slice(&(blocks.len() as u64).to_le_bytes());
        self.file.write_all(&footer)?;
        let file = self.file.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()
    }
}

/// A page of the run: where it is and the first key it holds.
struct Page {
    first: Vec<u8>,
    offset: u64,
    len: u32,
    crc: u32,
}

/// An open run: its page index and block table in memory, its pages on disk.
pub struct Run {
    file: File,
    pages: Vec<Page>,
    /// Every block the run names, ascending by id.
    pub blocks: Vec<BlockRef>,
    pub entries: u64,
    pub bytes: u64,
    /// The blocks in read order, made by the first read that walks them (a run
    /// opened at a start is not sorted until a read needs it).
    by_newest: OnceLock<ByNewest>,
    /// The places of the event names read in this run.
    names: Names,
}

impl Run {
    /// Bytes it keeps in memory while open: its page index and block table, their
    /// read order once read, and the places of the names read.
    pub fn resident_bytes(&self) -> usize {
        let pages: usize = self.pages.iter().map(|p| p.first.capacity()).sum();
        self.pages.len() * std::mem::size_of::<Page>()
            + pages
            + self.blocks.capacity() * std::mem::size_of::<BlockRef>()
            + self.by_newest.get().map_or(0, ByNewest::bytes)
            + self.names.bytes()
    }
}

fn read_at(file: &File, offset: u64, len: u64) -> io::Result<Vec<u8>> {
    if len > MAX_SECTION {
        return Err(damaged("a section claims too many bytes"));
    }
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, offset)?;
    Ok(buf)
}

fn unpack(packed: &[u8], crc: u32) -> io::Result<Vec<u8>> {
    if crc32fast::hash(packed) != crc {
        return Err(damaged("a checksum does not match"));
    }
    let claimed = packed
        .get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    if claimed.is_none_or(|n| u64::from(n) > MAX_SECTION) {
        return Err(damaged("a section claims too many bytes"));
    }
    lz4_flex::decompress_size_prepended(packed).map_err(|_| damaged("a section does not decode"))
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

impl Run {
    pub fn open(path: &Path) -> io::Result<Run> {
        let file = File::open(path)?;
        let bytes = file.metadata()?.len();
        if bytes < FOOTER_LEN as u64 {
            return Err(damaged("shorter than its footer"));
        }
        let footer = read_at(&file, bytes - FOOTER_LEN as u64, FOOTER_LEN as u64)?;
        if &footer[..8] != MAGIC {
            return Err(damaged("not a run of this version"));
        }
        let (index_at, index_len) = (le_u64(&footer, 8), le_u32(&footer, 16));
        let (table_at, table_len) = (le_u64(&footer, 20), le_u32(&footer, 28));
        let (index_crc, table_crc) = (le_u32(&footer, 32), le_u32(&footer, 36));
        let entries = le_u64(&footer, 40);
        let index = unpack(&read_at(&file, index_at, index_len.into())?, index_crc)?;
        let table = unpack(&read_at(&file, table_at, table_len.into())?, table_crc)?;
        let blocks = decode_table(&table).ok_or_else(|| damaged("the block table"))?;
        let pages = decode_index(&index).ok_or_else(|| damaged("the page index"))?;
        Ok(Run {
            file,
            pages,
            names: Names::new(blocks.len()),
            blocks,
            entries,
            bytes,
            by_newest: OnceLock::new(),
        })
    }

    /// The blocks in read order ([`ByNewest`]).
    pub fn by_newest(&self) -> &ByNewest {
        self.by_newest.get_or_init(|| ByNewest::of(&self.blocks))
    }

    /// The places in read order of `ids` (ascending block ids).
    pub fn places(&self, ids: &[u64]) -> Places {
        Places::of(&self.blocks, self.by_newest(), ids)
    }

    /// The places in read order of `key`'s blocks, kept for the next read (a name the
    /// run does not have too, so asking again decodes no page); None when the run has
    /// none. For event names and property keys: a distinct id is rarely read twice.
    pub fn named(&self, key: &[u8]) -> io::Result<Option<Arc<Places>>> {
        let places = match self.names.get(key) {
            Some(held) => held,
            None => {
                let places = Arc::new(self.places(&self.get(key)?));
                self.names.put(key, places.clone());
                places
            }
        };
        Ok((!places.is_empty()).then_some(places))
    }

    /// The block ids of `key`, ascending; empty when the run has none.
    pub fn get(&self, key: &[u8]) -> io::Result<Vec<u64>> {
        let mut ids = Vec::new();
        self.each(key, |id| ids.push(id))?;
        Ok(ids)
    }

    /// Each block id of `key`, ascending; how many there were. The entries before it
    /// in its page are passed over without decoding their ids.
    pub fn each(&self, key: &[u8], mut f: impl FnMut(u64)) -> io::Result<u64> {
        // The last page whose first key is at or before `key`.
        let n = self.pages.partition_point(|p| p.first.as_slice() <= key);
        let Some(i) = n.checked_sub(1) else {
            return Ok(0);
        };
        let page = self.page(i)?;
        let mut at = 0;
        while at < page.len() {
            let (k, count) = entry_head(&page, &mut at).ok_or_else(|| damaged("an entry"))?;
            match k.cmp(key) {
                std::cmp::Ordering::Less => {
                    skip_varints(&page, &mut at, count).ok_or_else(|| damaged("an entry"))?
                }
                std::cmp::Ordering::Equal => {
                    let mut id = 0u64;
                    for _ in 0..count {
                        let delta = get_varint(&page, &mut at).ok_or_else(|| damaged("an id"))?;
                        id = id.checked_add(delta).ok_or_else(|| damaged("an id"))?;
                        f(id);
                    }
                    return Ok(count);
                }
                std::cmp::Ordering::Greater => break,
            }
        }
        Ok(0)
    }

    fn page(&self, i: usize) -> io::Result<Vec<u8>> {
        let p = &self.pages[i];
        unpack(&read_at(&self.file, p.offset, p.len.into())?, p.crc)
    }

    /// Every entry in key order, a page at a time (for a merge).
    pub fn entries(&self) -> Entries<'_> {
        Entries {
            run: self,
            next_page: 0,
            page: Vec::new(),
            at: 0,
        }
    }

    /// The place in read order of the block `id`, if the run names it.
    pub fn place_of(&self, id: u64) -> Option<usize> {
        let row = self.blocks.binary_search_by_key(&id, |b| b.id).ok()?;
        self.by_newest().rank.get(row).map(|&p| p as usize)
    }

    /// The block a run names by id.
    pub fn block(&self, id: u64) -> Option<BlockRef> {
        let i = self.blocks.binary_search_by_key(&id, |b| b.id).ok()?;
        Some(self.blocks[i])
    }
}

fn decode_index(bytes: &[u8]) -> Option<Vec<Page>> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < bytes.len() {
        let n = get_varint(bytes, &mut at)? as usize;
        let first = bytes.get(at..at.checked_add(n)?)?.to_vec();
        at += n;
        let offset = get_varint(bytes, &mut at)?;
        let len = u32::try_from(get_varint(bytes, &mut at)?).ok()?;
        let crc = u32::try_from(get_varint(bytes, &mut at)?).ok()?;
        out.push(Page {
            first,
            offset,
            len,
            crc,
        });
    }
    Some(out)
}

/// An entry's key and how many ids follow it, moving past both.
fn entry_head<'p>(page: &'p [u8], at: &mut usize) -> Option<(&'p [u8], u64)> {
    let n = get_varint(page, at)? as usize;
    let key = page.get(*at..at.checked_add(n)?)?;
    *at += n;
    let count = get_varint(page, at)?;
    // Each id takes at least a byte: a count claiming more is damage.
    if count > (page.len() - *at) as u64 {
        return None;
    }
    Some((key, count))
}

/// Move past `count` varints.
fn skip_varints(page: &[u8], at: &mut usize, count: u64) -> Option<()> {
    let mut left = count;
    while left > 0 {
        left -= u64::from(*page.get(*at)? < 0x80);
        *at += 1;
    }
    Some(())
}

fn read_entry(page: &[u8], at: &mut usize) -> Option<(Vec<u8>, Vec<u64>)> {
    let (key, count) = entry_head(page, at)?;
    let mut ids = Vec::with_capacity(count as usize);
    let mut id = 0u64;
    for _ in 0..count {
        id = id.checked_add(get_varint(page, at)?)?;
        ids.push(id);
    }
    Some((key.to_vec(), ids))
}

/// A run's entries in key order.
pub struct Entries<'a> {
    run: &'a Run,
    next_page: usize,
    page: Vec<u8>,
    at: usize,
}

impl Iterator for Entries<'_> {
    type Item = io::Result<(Vec<u8>, Vec<u64>)>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.at >= self.page.len() {
            if self.next_page >= self.run.pages.len() {
                return None;
            }
            self.page = match self.run.page(self.next_page) {
                Ok(p) => p,
                Err(e) => return Some(Err(e)),
            };
            self.next_page += 1;
            self.at = 0;
        }
        Some(read_entry(&self.page, &mut self.at).ok_or_else(|| damaged("an entry")))
    }
}

/// Remove a run's file; one already gone is fine.
pub fn remove(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
#[path = "tests/run.rs"]
mod tests;
