//! The bytes of a journal ([`super::journal`]): a header, then records, each
//! checked by its CRC so a start reads what was committed and nothing torn.
//!
//! ```text
//! header: "flagpost-journal 1\n"
//! record: len u32 LE, crc32 u32 LE of the payload, payload
//! payload, per table: name_len u8, name, entries u32 LE,
//!                     per entry: key_len u32 LE, value_len u32 LE, key, value
//! ```

use std::collections::HashMap;
use std::io;
use std::path::Path;

use sled::IVec;

use super::delta::Map;

pub(super) const HEADER: &[u8] = b"flagpost-journal 1\n";

/// One table's entries in a record.
pub type Group<'a> = (&'a str, &'a [(IVec, IVec)]);

pub(super) fn damaged(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{} is damaged: {what}", path.display()),
    )
}

pub(super) fn encode(groups: &[Group<'_>]) -> Vec<u8> {
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

pub(super) fn frame(payload: &[u8]) -> io::Result<Vec<u8>> {
    let len = u32::try_from(payload.len())
        .map_err(|_| io::Error::other("a journal record of 4 GiB or more"))?;
    let mut record = Vec::with_capacity(payload.len() + 8);
    record.extend_from_slice(&len.to_le_bytes());
    record.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    record.extend_from_slice(payload);
    Ok(record)
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
