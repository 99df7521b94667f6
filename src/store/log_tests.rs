use super::*;

const SEGMENT: u64 = 1024;

fn open_at(dir: &Path, floor: u64, checkpoint: Option<u64>) -> (Appender, Reader) {
    let (appender, reader, preparer) = open(dir, floor, checkpoint, SEGMENT).unwrap();
    // Spares are made on demand, so each test controls what is on disk.
    preparer.stop();
    (appender, reader)
}

fn payload(i: u64) -> Vec<u8> {
    format!("entry {i} {}", "x".repeat((i % 7) as usize * 20)).into_bytes()
}

fn read_all(reader: &mut Reader) -> Vec<(u64, Vec<u8>)> {
    reader.next_entries(|_| false).unwrap()
}

fn segment_files(dir: &Path) -> Vec<u64> {
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
fn entries_become_readable_only_once_committed() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, mut reader) = open_at(dir.path(), 10, None);
    assert_eq!(log.push(b"a").unwrap(), 10);
    assert_eq!(log.push(b"b").unwrap(), 11);
    assert!(read_all(&mut reader).is_empty(), "not yet synced");
    log.commit().unwrap();
    assert_eq!(
        read_all(&mut reader),
        vec![(10, b"a".to_vec()), (11, b"b".to_vec())]
    );
    assert_eq!(reader.position(), 12);
    assert_eq!(reader.shared().depth(), 0);
}

#[test]
fn a_torn_write_at_the_tail_is_ignored_and_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let end = {
        let (mut log, _) = open_at(dir.path(), 1, None);
        for i in 1..=3 {
            log.push(&payload(i)).unwrap();
        }
        log.commit().unwrap();
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
    let seqs: Vec<u64> = read_all(&mut reader).iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, [1, 2, 3]);
    assert_eq!(log.next_seq(), 4);
    log.push(b"after").unwrap();
    log.commit().unwrap();
    drop((log, reader));
    let (_, mut reader) = open_at(dir.path(), 1, None);
    let all = read_all(&mut reader);
    assert_eq!(all.len(), 4);
    assert_eq!(all[3], (4, b"after".to_vec()));
}

#[test]
fn frames_left_in_a_recycled_segment_are_never_read() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, mut reader) = open_at(dir.path(), 1, None);
    // Long entries fill several segments.
    for i in 1..=40 {
        log.push(&payload(i)).unwrap();
    }
    log.commit().unwrap();
    assert_eq!(read_all(&mut reader).len(), 40);
    let before = segment_files(dir.path());
    assert!(before.len() >= 4, "{before:?}");
    assert!(reader.releasable());
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
    let read: Vec<u64> = read_all(&mut reader).iter().map(|(s, _)| *s).collect();
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
        read_all(&mut reader),
        vec![(1, b"one".to_vec()), (3, b"two".to_vec())]
    );
    drop((log, reader));
    let (log, mut reader) = open_at(dir.path(), 1, None);
    let seqs: Vec<u64> = read_all(&mut reader).iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, [1, 3]);
    assert_eq!(log.next_seq(), 4);
}

#[test]
fn an_entry_larger_than_a_segment_gets_a_segment_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, mut reader) = open_at(dir.path(), 1, None);
    let big = vec![7u8; 3 * SEGMENT as usize];
    log.push(b"small").unwrap();
    log.push(&big).unwrap();
    log.push(b"after").unwrap();
    log.commit().unwrap();
    let all = read_all(&mut reader);
    assert_eq!(all.len(), 3);
    assert_eq!(all[1].1, big);
    // Released, the outsized segment is deleted rather than kept as a spare.
    reader.release(3).unwrap();
    let spares = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with(SPARE_PREFIX)
        })
        .count();
    assert_eq!(spares, 1);
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
    let seqs: Vec<u64> = read_all(&mut reader).iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, [103, 104]);
    assert_eq!(log.push(b"next").unwrap(), 105);
    // A floor above the log's end (a checkpoint or an older log above it): the next
    // entry starts a new segment there, and the reader skips the gap.
    drop((log, reader));
    let (mut log, mut reader) = open_at(dir.path(), 1_000, Some(104));
    assert_eq!(reader.shared().depth(), 0);
    assert_eq!(log.push(b"far").unwrap(), 1_000);
    log.commit().unwrap();
    assert_eq!(read_all(&mut reader), vec![(1_000, b"far".to_vec())]);
}

#[test]
fn seeking_back_reads_a_chunk_again() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, mut reader) = open_at(dir.path(), 1, None);
    for i in 1..=30 {
        log.push(&payload(i)).unwrap();
    }
    log.commit().unwrap();
    let first = read_all(&mut reader);
    reader.seek(12).unwrap();
    let again = read_all(&mut reader);
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
fn damage_inside_an_older_segment_skips_only_the_rest_of_that_segment() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = open_at(dir.path(), 1, None);
    for i in 1..=40 {
        log.push(&payload(i)).unwrap();
    }
    log.commit().unwrap();
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
    let seqs: Vec<u64> = read_all(&mut reader).iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs[0], 1);
    assert_eq!(
        seqs[1], segments[1],
        "the rest of the first segment skipped"
    );
    assert_eq!(*seqs.last().unwrap(), 40);
    assert_eq!(seqs.len() as u64, 1 + 41 - segments[1]);
}
