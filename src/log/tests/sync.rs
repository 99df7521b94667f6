//! The log's first promise seen through its sync hook: an entry is reported durable
//! (readable by the compactor, acknowledged to the client) only after an `fdatasync`
//! that covered it returned, and a sync failing after the write refuses the group.
//! The crash tests cannot see a missing sync (a `kill -9` keeps the page cache), so
//! these count the syncs themselves.

use std::sync::atomic::Ordering;

use super::*;

const SEGMENT: u64 = 1024;

fn syncs(shared: &Shared) -> u64 {
    shared.syncs.load(Ordering::SeqCst)
}

fn synced_end(shared: &Shared) -> u64 {
    shared.synced_end.load(Ordering::SeqCst)
}

/// Whether `needle` appears in any segment file of `dir`.
fn on_disk(dir: &Path, needle: &[u8]) -> bool {
    super::tests::segment_files(dir).iter().any(|&first| {
        let bytes = std::fs::read(segment_path(dir, first)).unwrap();
        bytes.windows(needle.len()).any(|w| w == needle)
    })
}

#[test]
fn a_commit_moves_the_durable_mark_only_after_its_sync() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, mut reader) = open_for_tests(dir.path(), 5, None, SEGMENT);
    let shared = log.shared().clone();
    for round in 0..3u64 {
        let before = syncs(&shared);
        let start = log.next_seq();
        log.push(format!("a{round}").as_bytes()).unwrap();
        log.push(format!("b{round}").as_bytes()).unwrap();
        // Pushed is not durable: no sync yet, and the mark has not moved.
        assert_eq!(syncs(&shared), before);
        assert_eq!(shared.durable_end(), start);
        assert!(read_intact(&mut reader).is_empty());
        log.commit().unwrap();
        assert_eq!(syncs(&shared), before + 1, "one sync per group");
        assert_eq!(synced_end(&shared), start + 2);
        assert_eq!(shared.durable_end(), start + 2);
        let read: Vec<u64> = read_intact(&mut reader).iter().map(|e| e.0).collect();
        assert_eq!(read, [start, start + 1]);
    }
}

#[test]
fn a_group_that_fills_its_segment_is_synced_before_the_next_segment_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, mut reader) = open_for_tests(dir.path(), 1, None, SEGMENT);
    let shared = log.shared().clone();
    // One group over three segments: each roll syncs what went before it.
    let entry = vec![b'e'; 300];
    for _ in 0..8 {
        log.push(&entry).unwrap();
    }
    let rolled = syncs(&shared);
    assert!(rolled >= 2, "{rolled} syncs at the rolls");
    assert!(synced_end(&shared) > 1);
    assert_eq!(shared.durable_end(), synced_end(&shared));
    log.commit().unwrap();
    assert_eq!(syncs(&shared), rolled + 1);
    assert_eq!(shared.durable_end(), 9);
    assert_eq!(read_intact(&mut reader).len(), 8);
    assert!(super::tests::segment_files(dir.path()).len() >= 3);
}

#[test]
fn a_sync_failing_after_the_write_refuses_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, mut reader) = open_for_tests(dir.path(), 1, None, SEGMENT);
    let shared = log.shared().clone();
    log.push(b"kept-1").unwrap();
    log.commit().unwrap();
    let synced = syncs(&shared);
    shared.failing_commits.store(1, Ordering::SeqCst);
    log.push(b"refused-2").unwrap();
    assert!(log.commit().is_err());
    // The frame reached the file; only its sync failed, and nothing moved.
    assert!(on_disk(dir.path(), b"refused-2"));
    assert_eq!(syncs(&shared), synced);
    assert_eq!(shared.durable_end(), 2);
    log.abandon();
    log.push(b"kept-3").unwrap();
    log.commit().unwrap();
    let read: Vec<Vec<u8>> = read_intact(&mut reader).into_iter().map(|e| e.1).collect();
    assert_eq!(read, [b"kept-1".to_vec(), b"kept-3".to_vec()]);
    drop((log, reader));
    // Nor does a start take the written but unsynced group for an entry.
    let (_, mut reader) = open_for_tests(dir.path(), 1, None, SEGMENT);
    let read: Vec<Vec<u8>> = read_intact(&mut reader).into_iter().map(|e| e.1).collect();
    assert_eq!(read, [b"kept-1".to_vec(), b"kept-3".to_vec()]);
}

/// Through the writer thread, as capture appends: every acknowledgement has a sync of
/// its own behind it (appends one at a time cannot share a group), and an append whose
/// sync failed is refused and never read back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledgement_follows_a_sync_and_a_failed_sync_refuses_the_append() {
    let dir = tempfile::tempdir().unwrap();
    let (appender, _, preparer) = open(dir.path(), 1, None, 256 * 1024).unwrap();
    let shared = appender.shared().clone();
    let (wal, writer) = Wal::start(appender, preparer, Box::new(|_| {})).unwrap();
    for i in 0..10u64 {
        let before = syncs(&shared);
        wal.append(vec![format!("ok-{i}").into_bytes()])
            .await
            .unwrap();
        assert!(
            syncs(&shared) > before,
            "append {i} acknowledged without a sync"
        );
        assert!(synced_end(&shared) >= shared.durable_end());
    }
    let durable = shared.durable_end();
    shared.failing_commits.store(1, Ordering::SeqCst);
    let refused = wal.append(vec![b"refused".to_vec()]).await;
    assert_eq!(refused, Err(writer::Error::Storage));
    assert_eq!(shared.durable_end(), durable);
    assert!(
        on_disk(dir.path(), b"refused"),
        "the write itself went through"
    );
    tokio::task::spawn_blocking(move || writer.stop())
        .await
        .unwrap();
    let (_, mut reader) = open_for_tests(dir.path(), 0, None, 256 * 1024);
    let records: Vec<Vec<u8>> = read_intact(&mut reader)
        .iter()
        .flat_map(|(_, frame)| {
            let records = record::decode_frame(frame).unwrap();
            records.into_iter().map(<[u8]>::to_vec).collect::<Vec<_>>()
        })
        .collect();
    let expected: Vec<Vec<u8>> = (0..10).map(|i| format!("ok-{i}").into_bytes()).collect();
    assert_eq!(records, expected);
}
