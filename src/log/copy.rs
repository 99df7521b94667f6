//! Copying the log for a backup: the segments that may hold entries from a given number
//! on, and the marks a reader needs to tell a gap from a loss.
//!
//! From a running log, only what is durable is copied: each segment is cut after its
//! last intact entry below the durable end read at the start of the copy. Those
//! entries were synced before their requests were acknowledged and are never written
//! again (a segment is recycled only once the compactor has moved past it, and a
//! backup keeps the compactor paused), so the copy never holds a frame that was being
//! written, and never a torn one. The copy's `clean` mark records that end, so a
//! restored server reports anything missing below it as a loss, and its `skipped`
//! mark is written from the log's own list. From a stopped log, the files are copied
//! as they are: what a start would read, torn tail and marks included.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

use super::marks;
use super::segment::{next_intact, read_frame, segment_first, segment_path, Frame, HEADER};
use super::{Shared, DIR_NAME};
use crate::support::sync::lock;

/// What a copy wrote, as paths relative to the backup's directory, and the end it
/// was cut at (`None` when copied from a stopped log).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Copied {
    pub files: Vec<String>,
    pub end: Option<u64>,
}

/// Copy the running log's entries from `from` on into `<dest>/wal/`, up to its durable
/// end. The caller keeps the compactor paused, so no segment is recycled meanwhile.
pub fn copy_live(shared: &Shared, from: u64, dest: &Path) -> io::Result<Copied> {
    // The end first: a segment listed after it holds nothing below it that matters.
    let end = shared.durable_end();
    let segments: Vec<u64> = lock(&shared.segments).iter().copied().collect();
    let skipped = lock(&shared.skipped).clone();
    let out = dest.join(DIR_NAME);
    std::fs::create_dir_all(&out)?;
    let mut copied = Copied {
        files: Vec::new(),
        end: Some(end),
    };
    for first in wanted(&segments, from).filter(|&first| first < end) {
        let path = segment_path(&shared.dir, first);
        let cut = intact_below(&path, first, end)?;
        let mut source = io::Read::take(File::open(&path)?, cut);
        let target = segment_path(&out, first);
        let mut file = File::create(&target)?;
        io::copy(&mut source, &mut file)?;
        file.sync_all()?;
        copied.files.push(relative(&target));
    }
    let mut text = String::new();
    for (a, b) in skipped {
        text.push_str(&format!("{a} {b}\n"));
    }
    write_synced(&out.join("skipped"), text.as_bytes())?;
    copied.files.push(format!("{DIR_NAME}/skipped"));
    marks::write_clean(&out, end)?;
    copied.files.push(format!("{DIR_NAME}/clean"));
    super::segment::sync_dir(&out)?;
    Ok(copied)
}

/// Copy a stopped log's segments that may hold entries from `from` on, and its marks,
/// as they are, from `<db>/wal/` into `<dest>/wal/`. Nothing in `db` is changed.
pub fn copy_stopped(db: &Path, from: u64, dest: &Path) -> io::Result<Copied> {
    let dir = db.join(DIR_NAME);
    let out = dest.join(DIR_NAME);
    std::fs::create_dir_all(&out)?;
    let mut segments = Vec::new();
    let mut others = Vec::new();
    match std::fs::read_dir(&dir) {
        Ok(entries) => {
            for entry in entries {
                let name = entry?.file_name().to_string_lossy().into_owned();
                match segment_first(&name) {
                    Some(first) => segments.push(first),
                    None if name == "skipped" || name == "clean" => others.push(name),
                    None => {}
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    segments.sort_unstable();
    others.sort();
    let mut copied = Copied::default();
    let names = wanted(&segments, from)
        .map(|first| format!("{first:020}.log"))
        .collect::<Vec<_>>();
    for name in names.into_iter().chain(others) {
        let target = out.join(&name);
        std::fs::copy(dir.join(&name), &target)?;
        File::open(&target)?.sync_all()?;
        copied.files.push(format!("{DIR_NAME}/{name}"));
    }
    super::segment::sync_dir(&out)?;
    Ok(copied)
}

/// The segments (first numbers, sorted) that may hold an entry numbered `from` or
/// above: each one the next segment does not start at or below `from`.
fn wanted(segments: &[u64], from: u64) -> impl Iterator<Item = u64> + '_ {
    segments
        .iter()
        .enumerate()
        .filter(move |&(i, _)| segments.get(i + 1).is_none_or(|&next| next > from))
        .map(|(_, &first)| first)
}

/// How many bytes from the start of the segment at `path` hold its entries below
/// `end`: up to the end of the last intact one, read over damage as a reader does.
fn intact_below(path: &Path, first: u64, end: u64) -> io::Result<u64> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let (mut offset, mut seq, mut cut) = (0u64, first, 0u64);
    while seq < end {
        if let Frame::Entry(payload) = read_frame(&file, offset, len, seq)? {
            offset += (HEADER + payload.len()) as u64;
            seq += 1;
            cut = offset;
            continue;
        }
        match next_intact(&file, offset + 1, len, seq, end)? {
            Some((at, found)) => (offset, seq) = (at, found),
            None => break,
        }
    }
    Ok(cut)
}

fn relative(target: &Path) -> String {
    let name = target.file_name().unwrap_or_default().to_string_lossy();
    format!("{DIR_NAME}/{name}")
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_wanted_are_those_that_may_hold_the_number_or_later() {
        let firsts = [0, 10, 20, 30];
        let got = |from| wanted(&firsts, from).collect::<Vec<_>>();
        assert_eq!(got(0), [0, 10, 20, 30]);
        assert_eq!(got(9), [0, 10, 20, 30]);
        assert_eq!(got(10), [10, 20, 30]);
        assert_eq!(got(25), [20, 30]);
        assert_eq!(got(99), [30]);
        assert_eq!(wanted(&[], 5).count(), 0);
    }

    #[test]
    fn a_live_copy_holds_every_durable_entry_and_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join("db/wal");
        let (mut appender, _reader) = super::super::open_for_tests(&wal, 1, None, 512);
        for i in 0..100u32 {
            appender.push(format!("entry {i:04}").as_bytes()).unwrap();
            appender.commit().unwrap();
        }
        let shared = appender.shared().clone();
        assert_eq!(shared.durable_end(), 101);
        assert!(shared.segments() > 1, "several segments");
        let dest = dir.path().join("backup");
        // From entry 40 on: the segments before the one holding it are left out.
        let copied = copy_live(&shared, 40, &dest).unwrap();
        assert_eq!(copied.end, Some(101));
        assert!(copied.files.contains(&"wal/clean".to_string()));
        assert!(!copied.files.contains(&format!("wal/{:020}.log", 1)));
        let last = copied.files.iter().rfind(|f| f.ends_with(".log"));
        let size = std::fs::metadata(dest.join(last.unwrap())).unwrap().len();
        assert!(
            size < 512,
            "cut after its last entry, not the whole file: {size}"
        );
        // A log opened on the copy reads 40..=100 whole, and writes on at 101.
        let (appender, mut reader) =
            super::super::open_for_tests(&dest.join("wal"), 1, Some(39), 512);
        let entries = super::super::read_intact(&mut reader);
        let numbers: Vec<u64> = entries.iter().map(|e| e.0).collect();
        assert_eq!(numbers, (40..=100).collect::<Vec<_>>());
        assert_eq!(entries[0].1, b"entry 0039");
        assert_eq!(appender.shared().durable_end(), 101);
    }
}
