//! The bytes of a journal ([`super::journal`]): a header, then records, each
//! checked by its CRC so a start reads what was committed and nothing torn.
//!
//! ```text
//! header: "flagpost-journal 1\n"
//! record: len u32 LE, crc32 u32 LE of the payload, payload
//! payload, per table: name_len u8, name, entries u32 LE,
//!                     per entry: key_len u32 LE, value_len u32 LE, key, value
//! ```

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;

use sled::IVec;

use super::delta::{Key, Map};

pub(super) const HEADER: &[u8] = b"flagpost-journal 1\n";

/// One table's entries in a record.
pub type Group<'a> = (&'a str, &'a [(IVec, IVec)]);

pub(super) fn damaged(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{} is damaged: {what}", path.display()),
    )
}

/// Bytes before a record's payload: its length and CRC, filled in by [`frame`].
const RECORD_HEADER: usize = 8;
/// A record [`write_group`] makes ends once it passes this many bytes.
const RECORD_BYTES: usize = 1 << 20;

/// `groups` into `out` (cleared first) as a record whose header [`frame`] fills in, or
/// nothing when every group is empty. Sized exactly first, so a large chunk's record
/// is not grown by doubling.
pub(super) fn encode(groups: &[Group<'_>], out: &mut Vec<u8>) {
    let groups = || groups.iter().filter(|(_, e)| !e.is_empty());
    let entry = |(k, v): &(IVec, IVec)| 8 + k.len() + v.len();
    let size: usize = groups()
        .map(|(table, entries)| 1 + table.len() + 4 + entries.iter().map(entry).sum::<usize>())
        .sum();
    out.clear();
    if size == 0 {
        return;
    }
    out.reserve(RECORD_HEADER + size);
    out.resize(RECORD_HEADER, 0);
    for (table, entries) in groups() {
        put_group_head(out, table.len() as u8, table, entries.len() as u32);
        for (k, v) in entries.iter() {
            put_entry(out, k.len() as u32, v.len() as u32, k, v);
        }
    }
}

/// A group's head: its table's name (`len` bytes) and its count of entries.
fn put_group_head(out: &mut Vec<u8>, len: u8, table: &str, count: u32) {
    out.push(len);
    out.extend_from_slice(table.as_bytes());
    out.extend_from_slice(&count.to_le_bytes());
}

/// One entry of a group: its key's and value's lengths, then the two.
fn put_entry(out: &mut Vec<u8>, k_len: u32, v_len: u32, k: &[u8], v: &[u8]) {
    out.extend_from_slice(&k_len.to_le_bytes());
    out.extend_from_slice(&v_len.to_le_bytes());
    out.extend_from_slice(k);
    out.extend_from_slice(v);
}

/// Fill in the header of a record [`encode`] made.
pub(super) fn frame(record: &mut [u8]) -> io::Result<()> {
    let Some(payload) = record.get(RECORD_HEADER..) else {
        return Err(io::Error::other(
            "a journal record without room for its header",
        ));
    };
    let len = u32::try_from(payload.len())
        .map_err(|_| io::Error::other("a journal record of 4 GiB or more"))?;
    let crc = crc32fast::hash(payload);
    record[..4].copy_from_slice(&len.to_le_bytes());
    record[4..RECORD_HEADER].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Apply the records of `bytes` (a journal up to where it is committed) to `maps`.
pub(super) fn replay(path: &Path, bytes: &[u8], maps: &mut HashMap<String, Map>) -> io::Result<()> {
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
        decode(payload, &mut |_| true, maps).ok_or_else(cut)?;
        at += 8 + len;
    }
    Ok(())
}

/// [`replay`] of the whole file at `path`, read a record at a time: a journal that is
/// no longer appended to, read back beside the compactor by a fold. Only the tables
/// `keep` names are filled.
pub(super) fn replay_file(
    path: &Path,
    mut keep: impl FnMut(&str) -> bool,
    maps: &mut HashMap<String, Map>,
) -> io::Result<()> {
    each_record(path, |payload| decode(payload, &mut keep, maps))
}

/// The names of the tables in the journal at `path`, added to `names`.
pub(super) fn tables_in_file(path: &Path, names: &mut BTreeSet<String>) -> io::Result<()> {
    let mut none = HashMap::new();
    let mut note = |name: &str| {
        if !names.contains(name) {
            names.insert(name.to_owned());
        }
        false
    };
    each_record(path, |payload| decode(payload, &mut note, &mut none))
}

/// Call `each` with the payload of every record of the journal at `path`, read one at
/// a time; a payload it cannot read (`None`) makes the file damaged.
fn each_record(path: &Path, mut each: impl FnMut(&[u8]) -> Option<()>) -> io::Result<()> {
    let mut file = io::BufReader::new(std::fs::File::open(path)?);
    let mut header = vec![0u8; HEADER.len()];
    file.read_exact(&mut header)
        .map_err(|_| damaged(path, "it does not start as a journal"))?;
    if header != HEADER {
        return Err(damaged(path, "it does not start as a journal"));
    }
    let cut = || damaged(path, "a record is cut short or fails its CRC");
    let mut head = [0u8; RECORD_HEADER];
    let mut payload = Vec::new();
    loop {
        match file.read(&mut head[..1])? {
            0 => return Ok(()),
            _ => file.read_exact(&mut head[1..]).map_err(|_| cut())?,
        }
        let len = u32_at(&head, 0).ok_or_else(cut)? as usize;
        let crc = u32_at(&head, 4).ok_or_else(cut)?;
        payload.clear();
        // Read as far as the file goes, not sized by a length that may be damaged.
        let read = (&mut file).take(len as u64).read_to_end(&mut payload)?;
        if read != len || crc32fast::hash(&payload) != crc {
            return Err(cut());
        }
        each(&payload).ok_or_else(cut)?;
    }
}

/// Write `entries` of `table` to `file` from byte `at` on, as records of about
/// [`RECORD_BYTES`] (one group each) made in `buf`; returns where they end. A fold's
/// rotation writes every table's delta this way: one record of them all was tens of
/// MB at a million persons, held whole to be framed, and read back whole.
pub(super) fn write_group<'a>(
    file: &File,
    mut at: u64,
    table: &str,
    entries: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    buf: &mut Vec<u8>,
) -> io::Result<u64> {
    let name_len = u8::try_from(table.len())
        .map_err(|_| io::Error::other("a table's name of 256 bytes or more"))?;
    let count_at = RECORD_HEADER + 1 + table.len();
    let start = |buf: &mut Vec<u8>| {
        buf.clear();
        buf.resize(RECORD_HEADER, 0);
        // The count is filled in by `finish`.
        put_group_head(buf, name_len, table, 0);
    };
    let mut finish = |buf: &mut Vec<u8>, count: u32| -> io::Result<()> {
        buf[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
        frame(buf)?;
        file.write_all_at(buf, at)?;
        at += buf.len() as u64;
        Ok(())
    };
    start(buf);
    let mut count = 0u32;
    for (k, v) in entries {
        let (k_len, v_len) = (u32::try_from(k.len()), u32::try_from(v.len()));
        let (Ok(k_len), Ok(v_len)) = (k_len, v_len) else {
            return Err(io::Error::other("a journal entry of 4 GiB or more"));
        };
        put_entry(buf, k_len, v_len, k, v);
        count += 1;
        if buf.len() >= RECORD_BYTES {
            finish(buf, count)?;
            start(buf);
            count = 0;
        }
    }
    if count > 0 {
        finish(buf, count)?;
    }
    Ok(at)
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Apply a record's payload to `maps`, the tables `keep` says yes to (each group's
/// name is shown to it).
fn decode(
    payload: &[u8],
    keep: &mut impl FnMut(&str) -> bool,
    maps: &mut HashMap<String, Map>,
) -> Option<()> {
    let mut at = 0usize;
    while at < payload.len() {
        let name_len = *payload.get(at)? as usize;
        let name = std::str::from_utf8(payload.get(at + 1..at + 1 + name_len)?).ok()?;
        at += 1 + name_len;
        let count = u32_at(payload, at)?;
        at += 4;
        let mut map = keep(name).then(|| maps.entry(name.to_owned()).or_default());
        for _ in 0..count {
            let k = u32_at(payload, at)? as usize;
            let v = u32_at(payload, at + 4)? as usize;
            let key = payload.get(at + 8..at + 8 + k)?;
            let value = payload.get(at + 8 + k..at + 8 + k + v)?;
            if let Some(map) = &mut map {
                map.insert(Key::from(key), IVec::from(value));
            }
            at += 8 + k + v;
        }
    }
    Some(())
}
