//! What the log keeps beside its segments so a reader can tell an expected gap or short
//! segment from a loss: the numbers the writer skipped without acknowledging an entry
//! under them (`skipped`: after a failed write, or when a start numbers above the log's
//! end), and where the log ended at a clean stop (`clean`). Without them a segment
//! deleted by hand, or a tail cut off after a clean stop, would look like a skip or a
//! torn write and be passed over in silence.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

use super::segment::sync_dir;

/// One `from to` line per skip: numbers `from..to` were never acknowledged.
const SKIPPED: &str = "skipped";
/// The first number not written when the log stopped cleanly.
const CLEAN: &str = "clean";

/// Ranges of numbers no acknowledged entry has, merged and sorted. A line a crash cut
/// short is ignored: its skip is then reported as missing, never the other way round.
pub(super) fn load_skipped(dir: &Path) -> io::Result<Vec<(u64, u64)>> {
    let text = match std::fs::read_to_string(dir.join(SKIPPED)) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut ranges = Vec::new();
    for line in text.lines() {
        let mut words = line.split(' ').map(str::parse::<u64>);
        if let (Some(Ok(from)), Some(Ok(to)), None) = (words.next(), words.next(), words.next()) {
            add(&mut ranges, from, to);
        }
    }
    Ok(ranges)
}

/// Record that `from..to` will never be used, durably, before any entry above it is.
pub(super) fn append_skipped(dir: &Path, from: u64, to: u64) -> io::Result<()> {
    let path = dir.join(SKIPPED);
    let created = !path.exists();
    let mut file = OpenOptions::new().create(true).append(true).open(&path)?;
    file.write_all(format!("{from} {to}\n").as_bytes())?;
    file.sync_data()?;
    if created {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Add `from..to` to sorted, merged ranges.
pub(super) fn add(ranges: &mut Vec<(u64, u64)>, from: u64, to: u64) {
    if from >= to {
        return;
    }
    ranges.push((from, to));
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for &(a, b) in ranges.iter() {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    *ranges = merged;
}

/// The parts of `from..to` no range covers.
pub(super) fn uncovered(ranges: &[(u64, u64)], from: u64, to: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = from;
    for &(a, b) in ranges {
        if b <= at || a >= to {
            continue;
        }
        if a > at {
            out.push((at, a));
        }
        at = at.max(b);
    }
    if at < to {
        out.push((at, to));
    }
    out
}

/// The end of the range covering `seq`, if one does.
pub(super) fn covering(ranges: &[(u64, u64)], seq: u64) -> Option<u64> {
    ranges
        .iter()
        .find(|&&(a, b)| (a..b).contains(&seq))
        .map(|&(_, b)| b)
}

/// At a clean stop: every number below `end` was written whole and synced.
pub(super) fn write_clean(dir: &Path, end: u64) -> io::Result<()> {
    let tmp = dir.join("clean.tmp");
    let mut file = File::create(&tmp)?;
    file.write_all(format!("{end}\n").as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, dir.join(CLEAN))?;
    sync_dir(dir)
}

/// The end a clean stop recorded, if the last stop was clean.
pub(super) fn read_clean(dir: &Path) -> io::Result<Option<u64>> {
    match std::fs::read_to_string(dir.join(CLEAN)) {
        Ok(text) => Ok(text.trim().parse().ok()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Forget the clean stop once a start has taken it in: a crash later must not be
/// mistaken for one.
pub(super) fn remove_clean(dir: &Path) -> io::Result<()> {
    match std::fs::remove_file(dir.join(CLEAN)) {
        Ok(()) => sync_dir(dir),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_leave_the_uncovered_parts() {
        let mut r = Vec::new();
        add(&mut r, 10, 20);
        add(&mut r, 30, 40);
        add(&mut r, 15, 25);
        add(&mut r, 5, 5);
        assert_eq!(r, [(10, 25), (30, 40)]);
        assert_eq!(uncovered(&r, 0, 50), [(0, 10), (25, 30), (40, 50)]);
        assert_eq!(uncovered(&r, 12, 24), []);
        assert_eq!(uncovered(&r, 24, 31), [(25, 30)]);
        assert_eq!(covering(&r, 24), Some(25));
        assert_eq!(covering(&r, 25), None);
    }

    #[test]
    fn skips_and_clean_stops_persist() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load_skipped(dir.path()).unwrap(), []);
        append_skipped(dir.path(), 7, 9).unwrap();
        append_skipped(dir.path(), 9, 12).unwrap();
        // A line a crash cut short.
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join(SKIPPED))
            .unwrap()
            .write_all(b"40 4")
            .unwrap();
        assert_eq!(load_skipped(dir.path()).unwrap(), [(7, 12), (40, 4)][..1]);
        assert_eq!(read_clean(dir.path()).unwrap(), None);
        write_clean(dir.path(), 77).unwrap();
        assert_eq!(read_clean(dir.path()).unwrap(), Some(77));
        remove_clean(dir.path()).unwrap();
        assert_eq!(read_clean(dir.path()).unwrap(), None);
    }
}
