//! The values of the `recent_ids` tree: a chunk's uuids themselves (the earlier form)
//! or the runs of event block ids that hold them, and reading those blocks' uuids back
//! when the window loads.

use super::Id;
use crate::store::{block, keys};

/// The uuids of a chunk as one `recent_ids` value: per project (ascending), the
/// project (u64 LE), a count (u32 LE) and that many uuids (16 bytes), ascending.
pub fn encode(ids: &[Id]) -> Vec<u8> {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = Vec::with_capacity(16 * sorted.len() + 16);
    for run in sorted.chunk_by(|a, b| a.0 == b.0) {
        out.extend_from_slice(&run[0].0.to_le_bytes());
        out.extend_from_slice(&(run.len() as u32).to_le_bytes());
        for (_, id) in run {
            out.extend_from_slice(&id.to_be_bytes());
        }
    }
    out
}

/// A value naming blocks starts with this byte; it is 1 + 16 n bytes long, where the
/// uuids' encoding is 12 + 16 n: the lengths tell them apart as well.
const RANGES_TAG: u8 = 0xB2;

/// Runs of event block ids as one `recent_ids` value: the tag, then per run the first
/// id and the one after the last (u64 BE).
pub fn encode_ranges(ranges: &[(u64, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 16 * ranges.len());
    out.push(RANGES_TAG);
    for (first, end) in ranges {
        out.extend_from_slice(&first.to_be_bytes());
        out.extend_from_slice(&end.to_be_bytes());
    }
    out
}

/// The runs of block ids of a value [`encode_ranges`] wrote, or `None` for another.
pub fn decode_ranges(bytes: &[u8]) -> Option<Vec<(u64, u64)>> {
    if bytes.first() != Some(&RANGES_TAG) || bytes.len() % 16 != 1 {
        return None;
    }
    let u64_at = |b: &[u8]| b.try_into().ok().map(u64::from_be_bytes);
    bytes[1..]
        .chunks_exact(16)
        .map(|r| Some((u64_at(&r[..8])?, u64_at(&r[8..])?)))
        .collect()
}

/// The uuids of the stored event blocks whose ids fall in `ranges`, by block id: one
/// pass over the `events` tree's keys, each block in a range read and decoded. A block
/// that cannot be read is left out with a warning: its uuids leave the window early.
pub fn uuids_of_blocks(
    events: &sled::Tree,
    files: &block::Files,
    ranges: &[(u64, u64)],
) -> Result<std::collections::HashMap<u64, Vec<Id>>, sled::Error> {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    let wanted = |id: u64| {
        let i = sorted.partition_point(|&(first, _)| first <= id);
        i > 0 && id < sorted[i - 1].1
    };
    let mut out = std::collections::HashMap::new();
    for entry in events.iter() {
        let (key, value) = entry?;
        let id = keys::block_id(&key);
        let project = keys::split_block(&key).map(|(p, _)| p);
        let (Some(id), Some(project)) = (id, project) else {
            continue;
        };
        if !wanted(id) {
            continue;
        }
        match files.decode(&key, &value) {
            Some(block) => {
                let ids = block.heads().iter().map(|h| (project, h.uuid.as_u128()));
                out.insert(id, ids.collect());
            }
            None => tracing::warn!(block = id, "deduplication window: an event block of the last chunks cannot be read; its uuids are not in the window"),
        }
    }
    Ok(out)
}

pub fn decode(mut bytes: &[u8]) -> Option<Vec<Id>> {
    let mut out = Vec::with_capacity(bytes.len() / 16);
    while !bytes.is_empty() {
        let project = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
        let n = u32::from_le_bytes(bytes.get(8..12)?.try_into().ok()?) as usize;
        let ids = bytes.get(12..12 + n.checked_mul(16)?)?;
        for id in ids.chunks_exact(16) {
            out.push((project, u128::from_be_bytes(id.try_into().ok()?)));
        }
        bytes = &bytes[12 + 16 * n..];
    }
    Some(out)
}
