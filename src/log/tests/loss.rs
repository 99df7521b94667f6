//! The log's faults on disk: damage in the newest segment, segments cut short or
//! deleted while the server was stopped, and torn tails; each loss counted exactly,
//! nothing intact passed over.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use super::segment::HEADER;
use super::tests::segment_files;
use super::*;

const SEGMENT: u64 = 1024;

fn payload(i: u64) -> Vec<u8> {
    format!("entry {i} {}", "y".repeat((i % 5) as usize * 30)).into_bytes()
}

/// A log holding `payload(1..=n)`, stopped cleanly or not.
fn written(dir: &Path, n: u64, clean: bool) {
    let (mut log, _) = open_for_tests(dir, 1, None, SEGMENT);
    for i in 1..=n {
        log.push(&payload(i)).unwrap();
    }
    log.commit().unwrap();
    if clean {
        log.mark_clean().unwrap();
    }
}

/// The offset of entry `seq` in the segment starting at `first`.
fn offset_of(first: u64, seq: u64) -> u64 {
    (first..seq)
        .map(|i| (HEADER + payload(i).len()) as u64)
        .sum()
}

fn flip(dir: &Path, first: u64, at: u64) {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(segment_path(dir, first))
        .unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at).unwrap();
    file.write_all_at(&[byte[0] ^ 0x5a], at).unwrap();
}

/// Reopen from `checkpoint`, read everything: (intact numbers, damaged numbers) and
/// the losses (torn, quarantined, missing).
fn reread(dir: &Path, checkpoint: Option<u64>) -> (Vec<u64>, Vec<u64>, [u64; 3]) {
    let (_, mut reader) = open_for_tests(dir, 1, checkpoint, SEGMENT);
    let entries = reader.next_entries(|_| false).unwrap();
    let pick = |intact: bool| {
        entries
            .iter()
            .filter(|e| e.intact == intact)
            .map(|e| e.seq)
            .collect()
    };
    let l = &reader.shared().losses;
    let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
    (
        pick(true),
        pick(false),
        [n(&l.torn), n(&l.quarantined), n(&l.missing)],
    )
}

fn all_but(range: std::ops::RangeInclusive<u64>, gone: &[u64]) -> Vec<u64> {
    range.filter(|s| !gone.contains(s)).collect()
}

/// The fault that lost hundreds of events: damage in the middle of the newest segment
/// takes exactly that entry, whether the stop was clean or not.
#[test]
fn damage_inside_the_newest_segment_takes_only_the_damaged_entry() {
    for clean in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        written(dir.path(), 40, clean);
        let newest = *segment_files(dir.path()).last().unwrap();
        assert!(newest + 3 <= 40, "{newest}");
        flip(
            dir.path(),
            newest,
            offset_of(newest, newest + 1) + HEADER as u64 + 2,
        );
        let (intact, damaged, losses) = reread(dir.path(), None);
        assert_eq!(intact, all_but(1..=40, &[newest + 1]), "clean {clean}");
        assert_eq!(damaged, [newest + 1]);
        assert_eq!(losses, [0, 1, 0]);
    }
}

/// A damaged length: the frame's extent is unknown, so what lies up to the next intact
/// entry is quarantined as one piece, and reading goes on from there.
#[test]
fn a_damaged_length_is_passed_over_to_the_next_intact_entry() {
    let dir = tempfile::tempdir().unwrap();
    written(dir.path(), 40, false);
    let newest = *segment_files(dir.path()).last().unwrap();
    flip(dir.path(), newest, offset_of(newest, newest + 1));
    let (intact, damaged, losses) = reread(dir.path(), None);
    assert_eq!(intact, all_but(1..=40, &[newest + 1]));
    assert_eq!(damaged, [newest + 1]);
    assert_eq!(losses, [0, 1, 0]);
}

/// The last entry damaged after a clean stop is damage (quarantined), not a torn
/// write; after a crash it is a torn tail, counted as such.
#[test]
fn a_bad_last_entry_is_torn_only_without_a_clean_stop() {
    for clean in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        written(dir.path(), 40, clean);
        let newest = *segment_files(dir.path()).last().unwrap();
        flip(
            dir.path(),
            newest,
            offset_of(newest, 40) + HEADER as u64 + 1,
        );
        let (intact, damaged, losses) = reread(dir.path(), None);
        assert_eq!(intact, (1..=39).collect::<Vec<_>>());
        if clean {
            assert_eq!(damaged, [40]);
            assert_eq!(losses, [0, 1, 0]);
        } else {
            assert_eq!(damaged, Vec::<u64>::new());
            assert_eq!(losses, [1, 0, 0]);
        }
    }
}

/// Cutting the newest segment short after a clean stop loses entries the log knows it
/// had: reported missing, and reading gets past them.
#[test]
fn a_segment_cut_short_after_a_clean_stop_is_missing_entries() {
    let dir = tempfile::tempdir().unwrap();
    written(dir.path(), 40, true);
    let newest = *segment_files(dir.path()).last().unwrap();
    let file = OpenOptions::new()
        .write(true)
        .open(segment_path(dir.path(), newest))
        .unwrap();
    file.set_len(offset_of(newest, 38)).unwrap();
    drop(file);
    let (intact, damaged, losses) = reread(dir.path(), None);
    assert_eq!(intact, (1..=37).collect::<Vec<_>>());
    assert_eq!(damaged, Vec::<u64>::new());
    assert_eq!(losses, [0, 0, 3]);
    // The next start numbers on above the lost entries.
    let (mut log, _) = open_for_tests(dir.path(), 1, None, SEGMENT);
    assert_eq!(log.next_seq(), 41);
    log.push(b"after").unwrap();
    log.commit().unwrap();
    drop(log);
    // Still reported after a start that wrote on (the clean stop's record is gone).
    let (intact, _, losses) = reread(dir.path(), None);
    assert_eq!(intact, all_but(1..=41, &[38, 39, 40]));
    assert_eq!(losses, [0, 0, 3]);
}

/// A deleted segment, oldest (above the checkpoint), middle or newest (after a clean
/// stop): its numbers are reported missing, every other entry is read.
#[test]
fn a_deleted_segment_is_reported_with_its_numbers() {
    for which in ["oldest", "middle", "newest"] {
        let dir = tempfile::tempdir().unwrap();
        written(dir.path(), 40, true);
        let firsts = segment_files(dir.path());
        assert!(firsts.len() >= 4, "{firsts:?}");
        let (gone, checkpoint) = match which {
            "oldest" => (0, Some(0)),
            "middle" => (firsts.len() / 2, None),
            _ => (firsts.len() - 1, None),
        };
        let first = firsts[gone];
        let end = firsts.get(gone + 1).copied().unwrap_or(41);
        std::fs::remove_file(segment_path(dir.path(), first)).unwrap();
        let lost: Vec<u64> = (first..end).collect();
        let (intact, damaged, losses) = reread(dir.path(), checkpoint);
        assert_eq!(intact, all_but(1..=40, &lost), "{which}");
        assert_eq!(damaged, Vec::<u64>::new(), "{which}");
        assert_eq!(losses, [0, 0, end - first], "{which}");
    }
}

/// Numbers a start skips (a floor above the log's end) are recorded: after another
/// start the gap is not reported.
#[test]
fn numbers_a_start_skips_are_not_reported_lost() {
    let dir = tempfile::tempdir().unwrap();
    written(dir.path(), 5, true);
    {
        let (mut log, _) = open_for_tests(dir.path(), 1_000, None, SEGMENT);
        assert_eq!(log.push(b"far").unwrap(), 1_000);
        log.commit().unwrap();
    }
    let (intact, _, losses) = reread(dir.path(), None);
    assert_eq!(intact, [1, 2, 3, 4, 5, 1_000]);
    assert_eq!(losses, [0, 0, 0]);
}

fn spare_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy()
                .starts_with(super::segment::SPARE_PREFIX)
        })
        .count()
}

/// At a clean stop with everything applied, the log deletes its segments and spares,
/// and the next start and `check --db` see nothing missing: they count from above the
/// checkpoint, and new entries are numbered above the clean stop's end.
#[test]
fn a_clean_stop_with_everything_applied_leaves_no_segment() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, mut reader) = open_for_tests(dir.path(), 1, None, SEGMENT);
    for i in 1..=40 {
        log.push(&payload(i)).unwrap();
    }
    log.commit().unwrap();
    assert_eq!(reader.next_entries(|_| false).unwrap().len(), 40);
    // An older segment released while running becomes the spare.
    let oldest_kept = segment_files(dir.path())[1];
    assert_eq!(reader.release(oldest_kept - 1).unwrap(), 1);
    assert_eq!(spare_files(dir.path()), 1);
    let before = segment_files(dir.path());
    assert!(before.len() >= 3, "{before:?}");

    // While the writer runs, nothing is deleted at a stop.
    assert_eq!(reader.release_at_stop(Some(40)).unwrap(), 0);
    assert_eq!(
        (segment_files(dir.path()), spare_files(dir.path())),
        (before.clone(), 1)
    );

    log.mark_clean().unwrap();
    reader.shared().close();
    // Not everything applied: the spare goes, segments are released as usual.
    assert_eq!(reader.release_at_stop(Some(before[1])).unwrap(), 1);
    assert_eq!(spare_files(dir.path()), 0);
    assert_eq!(segment_files(dir.path()), before[1..]);
    // Everything applied: every segment goes.
    assert_eq!(reader.release_at_stop(Some(40)).unwrap(), before.len() - 1);
    assert_eq!(segment_files(dir.path()), Vec::<u64>::new());
    drop((log, reader));

    let report = check::check(dir.path(), Some(40)).unwrap();
    assert_eq!(report.problems, Vec::<String>::new());
    let (mut log, mut reader) = open_for_tests(dir.path(), 1, Some(40), SEGMENT);
    let l = &reader.shared().losses;
    let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
    assert_eq!([n(&l.torn), n(&l.quarantined), n(&l.missing)], [0, 0, 0]);
    assert_eq!(log.push(b"next").unwrap(), 41);
    log.commit().unwrap();
    assert_eq!(read_intact(&mut reader), vec![(41, b"next".to_vec())]);
    assert_eq!(n(&reader.shared().losses.missing), 0);
}
