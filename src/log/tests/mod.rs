use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

use super::segment::{checksum, segment_first, HEADER, SPARE_PREFIX};
use super::*;

const SEGMENT: u64 = 1024;

fn open_at(dir: &Path, floor: u64, checkpoint: Option<u64>) -> (Appender, Reader) {
    open_for_tests(dir, floor, checkpoint, SEGMENT)
}

/// A log holding `payload(1..=n)`, synced.
fn filled(dir: &Path, n: u64) -> (Appender, Reader) {
    let (mut log, reader) = open_at(dir, 1, None);
    for i in 1..=n {
        log.push(&payload(i)).unwrap();
    }
    log.commit().unwrap();
    (log, reader)
}

fn payload(i: u64) -> Vec<u8> {
    format!("entry {i} {}", "x".repeat((i % 7) as usize * 20)).into_bytes()
}

/// The first numbers of the segments in `dir`, in order.
pub(super) fn segment_files(dir: &Path) -> Vec<u64> {
    let mut firsts: Vec<u64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| segment_first(&e.unwrap().file_name().to_string_lossy()))
        .collect();
    firsts.sort_unstable();
    firsts
}

#[test]
fn segment_names_are_twenty_digits() {
    assert_eq!(segment_first("00000000000000000042.log"), Some(42));
    assert_eq!(segment_first("42.log"), None);
    assert_eq!(segment_first("0000000000000000004x.log"), None);
    assert_eq!(segment_first("spare-1.tmp"), None);
    let path = segment_path(Path::new("/x"), 7);
    assert_eq!(path, Path::new("/x/00000000000000000007.log"));
}

#[test]
fn a_new_log_has_nothing_to_read() {
    let dir = tempfile::tempdir().unwrap();
    // A new database: no checkpoint, the floor above zero.
    let (mut log, mut reader) = open_at(dir.path(), 1, None);
    assert_eq!(reader.shared().depth(), 0);
    assert!(read_intact(&mut reader).is_empty());
    assert_eq!(log.push(b"a").unwrap(), 1);
    log.commit().unwrap();
    assert_eq!(reader.shared().depth(), 1);
    assert_eq!(read_intact(&mut reader), vec![(1, b"a".to_vec())]);
    assert_eq!(reader.shared().depth(), 0);
}

#[test]
fn entries_become_readable_only_once_committed() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, mut reader) = open_at(dir.path(), 10, None);
    assert_eq!(log.push(b"a").unwrap(), 10);
    assert_eq!(log.push(b"b").unwrap(), 11);
    assert!(read_intact(&mut reader).is_empty(), "not yet synced");
    log.commit().unwrap();
    assert_eq!(
        read_intact(&mut reader),
        vec![(10, b"a".to_vec()), (11, b"b".to_vec())]
    );
    assert_eq!(reader.position(), 12);
    assert_eq!(reader.shared().depth(), 0);
}

#[test]
fn a_torn_write_at_the_tail_is_ignored_and_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let end = {
        let (log, _) = filled(dir.path(), 3);
        log.offset
    };
    // A crash in the middle of the next frame: its header and a few bytes made it.
    let path = segment_path(dir.path(), 1);
    let file = OpenOptions::new().write(true).open(&path).unwrap();
    let body = b"torn";
    let mut header = Vec::new();
    header.extend_from_slice(&100u32.to_le_bytes());
    header.extend_from_slice(&checksum(4, &[b'y'; 100]).to_le_bytes());
    header.extend_from_slice(&4u64.to_le_bytes());
    file.write_all_at(&header, end).unwrap();
    file.write_all_at(body, end + HEADER as u64).unwrap();
    drop(file);

    let (mut log, mut reader) = open_at(dir.path(), 1, None);
    let seqs: Vec<u64> = read_intact(&mut reader).iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, [1, 2, 3]);
    assert_eq!(log.next_seq(), 4);
    log.push(b"after").unwrap();
    log.commit().unwrap();
    // Writing went on in a new segment; the torn frame is left where it was.
    assert_eq!(segment_files(dir.path()), [1, 4]);
    assert_eq!(read_intact(&mut reader), vec![(4, b"after".to_vec())]);
    drop((log, reader));
    let (_, mut reader) = open_at(dir.path(), 1, None);
    let all = read_intact(&mut reader);
    assert_eq!(all.len(), 4);
    assert_eq!(all[3], (4, b"after".to_vec()));
}

/// A crash while a group was written back: entry 3 torn, entry 4 of the same group
/// whole. Intact entries after a bad one make it damage: entry 3 goes to the
/// quarantine, entry 4 is read, and writing goes on after it.
#[test]
fn whole_frames_after_a_torn_one_make_it_damage() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut log, _) = open_at(dir.path(), 1, None);
        log.push(b"one").unwrap();
        log.push(b"two").unwrap();
        log.push(b"three").unwrap();
        log.push(b"four, never acknowledged").unwrap();
        log.commit().unwrap();
    }
    let path = segment_path(dir.path(), 1);
    let file = OpenOptions::new().write(true).open(&path).unwrap();
    let third = 2 * HEADER as u64 + 6;
    file.write_all_at(b"X", third + HEADER as u64).unwrap();
    drop(file);
    let (mut log, mut reader) = open_at(dir.path(), 1, None);
    assert_eq!(log.next_seq(), 5);
    log.push(b"five").unwrap();
    log.commit().unwrap();
    let read = reader.next_entries(|_| false).unwrap();
    let seen: Vec<(u64, &[u8], bool)> = read
        .iter()
        .map(|e| (e.seq, e.bytes.as_slice(), e.intact))
        .collect();
    assert_eq!(
        seen,
        [
            (1, &b"one"[..], true),
            (2, b"two", true),
            (3, b"Xhree", false),
            (4, b"four, never acknowledged", true),
            (5, b"five", true),
        ]
    );
    let losses = &reader.shared().losses;
    assert_eq!(losses.quarantined.load(Ordering::Relaxed), 1);
    assert_eq!(losses.torn.load(Ordering::Relaxed), 0);
    assert_eq!(losses.missing.load(Ordering::Relaxed), 0);
}

#[test]
fn a_segment_left_empty_by_a_crash_is_passed_over_and_never_named_again() {
    let dir = tempfile::tempdir().unwrap();
    {
        let _ = filled(dir.path(), 3);
    }
    // A crash right after a roll made the next segment: empty, or zero-filled.
    std::fs::write(segment_path(dir.path(), 4), b"").unwrap();
    std::fs::write(segment_path(dir.path(), 5), vec![0u8; 4096]).unwrap();
    let (mut log, mut reader) = open_at(dir.path(), 1, None);
    assert_eq!(log.next_seq(), 4);
    let mut last = 0;
    for i in 4..=30 {
        last = log.push(&payload(i)).unwrap();
    }
    log.commit().unwrap();
    // The new segment is named above the empty ones: numbers 4 and 5 are skipped.
    assert_eq!(last, 32);
    let firsts = segment_files(dir.path());
    let unique: std::collections::BTreeSet<u64> = firsts.iter().copied().collect();
    assert_eq!(unique.len(), firsts.len(), "{firsts:?}");
    assert_eq!(read_intact(&mut reader).len(), 30);
    // Releasing what is applied keeps the segment still being written.
    reader.release(last - 1).unwrap();
    assert!(!segment_files(dir.path()).contains(&4));
    drop((log, reader));
    let (_, mut reader) = open_at(dir.path(), 1, Some(last - 1));
    assert_eq!(read_intact(&mut reader), vec![(last, payload(30))]);
}

#[test]
fn a_read_error_keeps_what_was_read_and_a_failed_seek_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    let (_log, mut reader) = filled(dir.path(), 30);
    let firsts = segment_files(dir.path());
    assert!(firsts.len() >= 3, "{firsts:?}");
    let second = segment_path(dir.path(), firsts[1]);
    let aside = dir.path().join("aside");
    std::fs::rename(&second, &aside).unwrap();
    // The second segment cannot be opened: the first one's entries are returned ...
    let first_part = reader.next_entries(|_| false).unwrap();
    assert_eq!(first_part.len() as u64, firsts[1] - 1);
    // ... and the error comes at the next read, which then resumes where it stopped.
    assert!(reader.next_entries(|_| false).is_err());
    std::fs::rename(&aside, &second).unwrap();
    let rest = read_intact(&mut reader);
    assert_eq!(rest.first().map(|(s, _)| *s), Some(firsts[1]));
    assert_eq!(rest.last().map(|(s, _)| *s), Some(30));
    // A seek that fails is tried again by the next read.
    std::fs::rename(&second, &aside).unwrap();
    assert!(reader.seek(firsts[1] + 1).is_err());
    assert_eq!(reader.position(), firsts[1] + 1);
    std::fs::rename(&aside, &second).unwrap();
    let again = read_intact(&mut reader);
    assert_eq!(again.first().map(|(s, _)| *s), Some(firsts[1] + 1));
    assert_eq!(again.len() as u64, 30 - firsts[1]);
}

#[test]
fn frames_left_in_a_recycled_segment_are_never_read() {
    let dir = tempfile::tempdir().unwrap();
    // Long entries fill several segments.
    let (mut log, mut reader) = filled(dir.path(), 40);
    assert_eq!(read_intact(&mut reader).len(), 40);
    let before = segment_files(dir.path());
    assert!(before.len() >= 4, "{before:?}");
    // Nothing while the first segment holds a record not yet applied.
    let first_of_second = before[1];
    assert!(!reader.releasable(first_of_second - 2));
    assert_eq!(reader.release(first_of_second - 2).unwrap(), 0);
    assert!(reader.releasable(first_of_second - 1));
    assert!(reader.releasable(40));
    assert_eq!(reader.release(40).unwrap(), before.len() - 1);
    assert_eq!(segment_files(dir.path()), [*before.last().unwrap()]);
    // Short entries: the next segment is the recycled one, still holding old frames
    // past where the new ones end.
    let mut seq = 41;
    while segment_files(dir.path()).len() < 2 {
        log.push(b"s").unwrap();
        seq += 1;
    }
    log.commit().unwrap();
    drop((log, reader));
    let (log, mut reader) = open_at(dir.path(), 1, Some(40));
    let read: Vec<u64> = read_intact(&mut reader).iter().map(|(s, _)| *s).collect();
    assert_eq!(read, (41..seq).collect::<Vec<_>>());
    assert_eq!(log.next_seq(), seq);
}

#[test]
fn a_failed_group_is_skipped_and_its_numbers_never_reused() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, mut reader) = open_at(dir.path(), 1, None);
    log.push(b"one").unwrap();
    log.commit().unwrap();
    log.push(b"lost").unwrap();
    log.abandon();
    log.push(b"two").unwrap();
    log.commit().unwrap();
    assert_eq!(
        read_intact(&mut reader),
        vec![(1, b"one".to_vec()), (3, b"two".to_vec())]
    );
    drop((log, reader));
    let (log, mut reader) = open_at(dir.path(), 1, None);
    let seqs: Vec<u64> = read_intact(&mut reader).iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, [1, 3]);
    assert_eq!(log.next_seq(), 4);
    // The skipped number is recorded as such: not reported lost after a restart.
    assert_eq!(reader.shared().losses.missing.load(Ordering::Relaxed), 0);
}

/// A disk that keeps failing: every group after the first failure starts a new
/// segment, and each such segment holds nothing durable, so it is retired with its
/// group instead of piling up.
#[test]
fn segments_holding_only_failed_groups_are_retired() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, mut reader) = open_at(dir.path(), 1, None);
    log.push(b"one").unwrap();
    log.commit().unwrap();
    // The failed group's segment holds a durable entry: it stays.
    log.push(b"lost").unwrap();
    log.abandon();
    for i in 0..50 {
        log.push(format!("lost {i}").as_bytes()).unwrap();
        log.abandon();
    }
    assert_eq!(segment_files(dir.path()), [1]);
    assert_eq!(reader.shared().segments(), 1);
    // Numbers were not reused: the next entry comes after every failed one.
    let next = log.push(b"two").unwrap();
    assert!(next > 52, "{next}");
    log.commit().unwrap();
    assert_eq!(segment_files(dir.path()), [1, next]);
    assert_eq!(
        read_intact(&mut reader),
        vec![(1, b"one".to_vec()), (next, b"two".to_vec())]
    );
    drop((log, reader));
    let (log, mut reader) = open_at(dir.path(), 1, None);
    let seqs: Vec<u64> = read_intact(&mut reader).iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, [1, next]);
    assert_eq!(log.next_seq(), next + 1);
}

/// A roll that fails after a segment was retired leaves the segments in use as they
/// were, and the numbers given up are recorded as skipped, never as lost.
#[test]
fn a_retired_segment_is_not_counted_as_lost_when_the_next_roll_fails() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _reader) = open_at(dir.path(), 1, None);
    log.push(b"one").unwrap();
    log.commit().unwrap();
    log.push(b"lost").unwrap();
    log.abandon();
    log.push(b"lost again").unwrap();
    log.abandon();
    let retired = log.first.unwrap();
    assert_eq!(segment_files(dir.path()), [1]);
    // A directory where the next segment's file goes: the roll fails.
    let next = segment_path(dir.path(), log.next_seq().max(retired + 1));
    std::fs::create_dir(&next).unwrap();
    std::fs::write(next.join("in the way"), b"").unwrap();
    assert!(log.push(b"fails").is_err());
    log.abandon();
    assert_eq!(*lock(&log.shared.segments), [1]);
    // With the way clear, the log goes on above every number it gave out.
    std::fs::remove_dir_all(&next).unwrap();
    let seq = log.push(b"two").unwrap();
    log.commit().unwrap();
    assert!(seq > retired, "{seq} {retired}");
}

#[test]
fn an_entry_larger_than_a_segment_gets_a_segment_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, mut reader) = open_at(dir.path(), 1, None);
    let big = vec![7u8; 3 * SEGMENT as usize];
    log.push(&big).unwrap();
    log.push(b"after").unwrap();
    log.commit().unwrap();
    let all = read_intact(&mut reader);
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].1, big);
    assert_eq!(segment_files(dir.path()), [1, 2]);
    // Released, the outsized segment is deleted rather than kept as a spare.
    assert_eq!(reader.release(1).unwrap(), 1);
    assert_eq!(segment_files(dir.path()), [2]);
    let spares = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with(SPARE_PREFIX)
        })
        .count();
    assert_eq!(spares, 0);
}

#[test]
fn a_reopened_log_continues_numbering_and_reads_from_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut log, _) = open_at(dir.path(), 100, None);
        for i in 0..5 {
            log.push(&payload(i)).unwrap();
        }
        log.commit().unwrap();
    }
    let (mut log, mut reader) = open_at(dir.path(), 1, Some(102));
    assert_eq!(reader.position(), 103);
    assert_eq!(reader.shared().depth(), 2);
    let seqs: Vec<u64> = read_intact(&mut reader).iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, [103, 104]);
    assert_eq!(log.push(b"next").unwrap(), 105);
    // A floor above the log's end (a checkpoint or an older log above it): the next
    // entry starts a new segment there, and the reader skips the gap.
    drop((log, reader));
    let (mut log, mut reader) = open_at(dir.path(), 1_000, Some(104));
    assert_eq!(reader.shared().depth(), 0);
    assert_eq!(log.push(b"far").unwrap(), 1_000);
    log.commit().unwrap();
    assert_eq!(read_intact(&mut reader), vec![(1_000, b"far".to_vec())]);
}

#[test]
fn seeking_back_reads_a_chunk_again() {
    let dir = tempfile::tempdir().unwrap();
    let (_log, mut reader) = filled(dir.path(), 30);
    let first = read_intact(&mut reader);
    reader.seek(12).unwrap();
    let again = read_intact(&mut reader);
    assert_eq!(again[..], first[11..]);
}

#[test]
fn spares_left_by_an_earlier_run_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("spare-9.tmp"), b"half made").unwrap();
    let (_, reader) = open_at(dir.path(), 1, None);
    assert!(!dir.path().join("spare-9.tmp").exists());
    assert_eq!(reader.shared().dir(), dir.path());
}

#[test]
fn a_damaged_entry_is_returned_marked_and_the_rest_read() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = filled(dir.path(), 40);
    drop(log);
    let segments = segment_files(dir.path());
    assert!(segments.len() >= 3, "{segments:?}");
    // Flip a byte of the second entry of the first segment.
    let path = segment_path(dir.path(), segments[0]);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let second = (HEADER + payload(1).len()) as u64;
    let at = second + HEADER as u64 + 3;
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at).unwrap();
    file.write_all_at(&[byte[0] ^ 0xff], at).unwrap();
    drop(file);
    let (_, mut reader) = open_at(dir.path(), 1, None);
    let entries = reader.next_entries(|_| false).unwrap();
    let seqs: Vec<u64> = entries.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (1..=40).collect::<Vec<_>>(),
        "only the damaged entry is marked"
    );
    let damaged: Vec<u64> = entries
        .iter()
        .filter(|e| !e.intact)
        .map(|e| e.seq)
        .collect();
    assert_eq!(damaged, [2]);
    assert_eq!(entries[1].bytes.len(), payload(2).len());
}

/// Spare segments are zero-filled (directly where the filesystem allows, through the
/// page cache otherwise), whole, whatever their size.
#[test]
fn spare_segments_are_zero_filled_to_their_size() {
    let dir = tempfile::tempdir().unwrap();
    // 1 MiB + 4 KiB takes direct writes on most disks; the odd size cannot.
    for len in [1024 * 1024 + 4096, 3 * 4096 + 7] {
        let path = dir.path().join(format!("spare-{len}"));
        std::fs::write(&path, vec![0xAB; 100]).unwrap();
        super::segment::zero_fill(&path, len).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, len);
        assert!(bytes.iter().all(|&b| b == 0), "{len}");
    }
}
