//! A decompressed block's entries: per entry, its key's and value's lengths (u32 LE
//! each), the key, the value (see [`super`]'s format).

use super::super::cache;
use super::{take, u32_at};

/// The entry of a decompressed block starting at `at`, which it moves past it; `None`
/// where the entries are cut.
pub(super) fn entry_at<'a>(raw: &'a [u8], at: &mut usize) -> Option<(&'a [u8], &'a [u8])> {
    let k = u32_at(raw, at)? as usize;
    let v = u32_at(raw, at)? as usize;
    let key = take(raw, at, k)?;
    let value = take(raw, at, v)?;
    Some((key, value))
}

/// The entries of a decompressed block; `None` where they are cut.
pub(in super::super) fn entries(raw: &[u8]) -> impl Iterator<Item = Option<(&[u8], &[u8])>> {
    let mut at = 0;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || at >= raw.len() {
            return None;
        }
        let entry = entry_at(raw, &mut at);
        failed = entry.is_none();
        Some(entry)
    })
}

/// A decompressed block as the cache keeps it: with where each whole entry starts.
pub(super) fn decoded(bytes: Vec<u8>) -> cache::Decoded {
    let mut starts = Vec::new();
    let mut at = 0;
    let mut cut = false;
    while at < bytes.len() {
        let start = at;
        // A block's raw length is a u32 in the index, so its offsets fit one.
        match (entry_at(&bytes, &mut at), u32::try_from(start)) {
            (Some(_), Ok(start)) => starts.push(start),
            _ => {
                cut = true;
                break;
            }
        }
    }
    cache::Decoded { bytes, starts, cut }
}
