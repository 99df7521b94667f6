use std::time::{Duration, Instant};

use super::*;
use crate::log;

const SEGMENT: u64 = 256 * 1024;

fn start(dir: &std::path::Path, floor: u64) -> (Wal, Writer) {
    let (wal, writer, _) = start_with_hooks(dir, floor);
    (wal, writer)
}

/// [`start`], with the log's shared state for its test hooks (failing syncs).
fn start_with_hooks(dir: &std::path::Path, floor: u64) -> (Wal, Writer, Arc<log::Shared>) {
    let (appender, _, preparer) = log::open(dir, floor, None, SEGMENT).unwrap();
    let shared = appender.shared().clone();
    let (wal, writer) = Wal::start(appender, preparer, Box::new(|_| {})).unwrap();
    (wal, writer, shared)
}

/// Every entry in the log, with its number, read as the compactor reads.
fn read_all(dir: &std::path::Path) -> Vec<(u64, Vec<u8>)> {
    let (_, mut reader) = log::open_for_tests(dir, 0, None, SEGMENT);
    log::read_intact(&mut reader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_in_order_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, writer) = start(dir.path(), 1);
    let mut tasks = Vec::new();
    for i in 0..50u32 {
        let wal = wal.clone();
        tasks.push(tokio::spawn(async move {
            wal.append(vec![
                format!("{i}-a").into_bytes(),
                format!("{i}-b").into_bytes(),
            ])
            .await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(wal.stats().appended_records.load(Ordering::Relaxed), 100);
    tokio::task::spawn_blocking(move || writer.stop())
        .await
        .unwrap();
    assert_eq!(wal.append(vec![b"late".to_vec()]).await, Err(Error::Closed));

    let values: Vec<String> = read_all(dir.path())
        .iter()
        .flat_map(|(_, frame)| {
            crate::log::record::decode_frame(frame)
                .unwrap()
                .into_iter()
                .map(|r| String::from_utf8(r.to_vec()).unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(values.len(), 100);
    // Each request's records stay adjacent and in the order given.
    for pair in values.chunks(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(a.ends_with("-a") && b.ends_with("-b"));
        assert_eq!(a.trim_end_matches("-a"), b.trim_end_matches("-b"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_are_numbered_from_the_floor_up_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, writer) = start(dir.path(), 7_000);
    // Big enough records that a group spans several entries, and the log several
    // segments.
    let record = vec![b'r'; ENTRY_MAX_BYTES / 2];
    for _ in 0..20 {
        wal.append(vec![record.clone(); 5]).await.unwrap();
    }
    tokio::task::spawn_blocking(move || writer.stop())
        .await
        .unwrap();
    let segments = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension() == Some("log".as_ref()))
        .count();
    assert!(segments >= 3, "{segments} segments");
    let seqs: Vec<u64> = read_all(dir.path()).iter().map(|(s, _)| *s).collect();
    assert!(seqs.len() >= 60, "{seqs:?}");
    let expected: Vec<u64> = (7_000..7_000 + seqs.len() as u64).collect();
    assert_eq!(seqs, expected);
}

/// A failing disk is tried again after a pause that doubles, not by every group:
/// appends in the pause are refused without a write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failed_write_the_disk_is_tried_again_only_after_a_pause() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, writer, shared) = start_with_hooks(dir.path(), 1);
    let tried = || shared.commits_tried.load(Ordering::SeqCst);
    shared.failing_commits.store(2, Ordering::SeqCst);
    assert_eq!(wal.append(vec![b"a".to_vec()]).await, Err(Error::Storage));
    assert_eq!(tried(), 1);
    assert!(!wal.stats().writable.load(Ordering::SeqCst));
    // Within the pause: refused, the disk untouched.
    assert_eq!(wal.append(vec![b"b".to_vec()]).await, Err(Error::Storage));
    assert_eq!(tried(), 1);
    // After it: tried, failing again; the next pause is twice as long.
    std::thread::sleep(FIRST_BACKOFF + Duration::from_millis(50));
    assert_eq!(wal.append(vec![b"c".to_vec()]).await, Err(Error::Storage));
    assert_eq!(tried(), 2);
    std::thread::sleep(FIRST_BACKOFF + Duration::from_millis(50));
    assert_eq!(wal.append(vec![b"d".to_vec()]).await, Err(Error::Storage));
    assert_eq!(tried(), 2);
    // A probe in the pause does not touch the disk either.
    wal.probe();
    std::thread::sleep(FIRST_BACKOFF);
    assert_eq!(tried(), 2);
    // The disk works again: written, and the next append goes straight through.
    assert_eq!(wal.append(vec![b"e".to_vec()]).await, Ok(()));
    assert!(wal.stats().writable.load(Ordering::SeqCst));
    assert_eq!(wal.append(vec![b"f".to_vec()]).await, Ok(()));
    assert_eq!(tried(), 4);
    tokio::task::spawn_blocking(move || writer.stop())
        .await
        .unwrap();
    // Only what was acknowledged is in the log, and no segment was left behind
    // by the failed writes.
    let values: Vec<Vec<u8>> = read_all(dir.path())
        .iter()
        .flat_map(|(_, frame)| {
            let records = crate::log::record::decode_frame(frame).unwrap();
            records.into_iter().map(<[u8]>::to_vec).collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(values, [b"e".to_vec(), b"f".to_vec()]);
    let segments = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension() == Some("log".as_ref()))
        .count();
    assert_eq!(segments, 1);
}

/// With no event to try it, a probe finds the disk working again once the pause
/// after a failure is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_after_the_pause_finds_the_disk_working_again() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, writer, shared) = start_with_hooks(dir.path(), 1);
    let writable = || wal.stats().writable.load(Ordering::SeqCst);
    // Writable: a probe asks nothing.
    wal.probe();
    shared.failing_commits.store(1, Ordering::SeqCst);
    assert_eq!(wal.append(vec![b"a".to_vec()]).await, Err(Error::Storage));
    assert_eq!(shared.commits_tried.load(Ordering::SeqCst), 1);
    assert!(!writable());
    std::thread::sleep(FIRST_BACKOFF + Duration::from_millis(50));
    wal.probe();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !writable() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(writable());
    assert_eq!(shared.commits_tried.load(Ordering::SeqCst), 2);
    assert_eq!(wal.append(vec![b"b".to_vec()]).await, Ok(()));
    tokio::task::spawn_blocking(move || writer.stop())
        .await
        .unwrap();
}

/// Holds the sync of the group ending at `held` in flight until the test says whether
/// it succeeds; every sync (held or not) reports its group's end as it starts.
struct Gate {
    release: std::sync::mpsc::Sender<bool>,
    entered: std::sync::mpsc::Receiver<u64>,
}

impl Gate {
    fn hold(shared: &log::Shared, held: u64) -> Gate {
        let (release, release_rx) = std::sync::mpsc::channel::<bool>();
        let (entered_tx, entered) = std::sync::mpsc::channel::<u64>();
        let release_rx = std::sync::Mutex::new(release_rx);
        let entered_tx = std::sync::Mutex::new(entered_tx);
        let hook: log::syncer::Hook = Arc::new(move |end| {
            let _ = crate::support::sync::lock(&entered_tx).send(end);
            if end == held {
                let rx = crate::support::sync::lock(&release_rx);
                // Not released in time: the test has failed; fail the sync too.
                let fail = rx.recv_timeout(Duration::from_secs(20)).unwrap_or(true);
                if fail {
                    return Err(std::io::Error::other("injected failure of a held sync"));
                }
            }
            Ok(())
        });
        *crate::support::sync::lock(&shared.sync_hook) = Some(hook);
        Gate { release, entered }
    }

    /// Wait until the sync of the group ending at `end` has started.
    fn started(&self, end: u64) {
        loop {
            match self.entered.recv_timeout(Duration::from_secs(10)) {
                Ok(e) if e == end => return,
                Ok(_) => {}
                Err(e) => panic!("the sync of the group ending at {end} never started: {e}"),
            }
        }
    }
}

/// Append one record from a task of its own.
fn spawn_append(wal: &Wal, record: &[u8]) -> tokio::task::JoinHandle<Result<(), Error>> {
    let (wal, record) = (wal.clone(), record.to_vec());
    tokio::spawn(async move { wal.append(vec![record]).await })
}

/// Time for the syncs let through to finish and be reported to the writer.
const SETTLE: Duration = Duration::from_millis(200);

/// Groups written while an earlier group's sync is in flight are synced at once, but
/// answered, and made readable, only after the earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_groups_are_answered_only_after_the_earlier_sync() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, writer, shared) = start_with_hooks(dir.path(), 1);
    // One record a group, numbered from 1: the group of entry n ends at n + 1.
    let gate = Gate::hold(&shared, 2);
    let first = spawn_append(&wal, b"r1");
    gate.started(2);
    let mut later = Vec::new();
    for n in 2..=SYNC_FILES as u64 {
        later.push(spawn_append(&wal, format!("r{n}").as_bytes()));
        gate.started(n + 1);
    }
    assert!(!later.is_empty(), "the pipeline holds more than one group");
    std::thread::sleep(SETTLE);
    assert!(!first.is_finished());
    assert!(later.iter().all(|t| !t.is_finished()));
    assert_eq!(
        shared.durable_end(),
        1,
        "nothing is durable before the first sync"
    );
    gate.release.send(false).unwrap();
    assert_eq!(first.await.unwrap(), Ok(()));
    for t in later {
        assert_eq!(t.await.unwrap(), Ok(()));
    }
    assert_eq!(shared.durable_end(), SYNC_FILES as u64 + 1);
    assert_eq!(wal.stats().groups.load(Ordering::SeqCst), SYNC_FILES as u64);
    tokio::task::spawn_blocking(move || writer.stop())
        .await
        .unwrap();
    let seqs: Vec<u64> = read_all(dir.path()).iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (1..=SYNC_FILES as u64).collect::<Vec<_>>());
}

/// A failed sync fails its group and every later group in flight, even those whose
/// own syncs succeeded; none of them becomes durable, and the segment holding only
/// them is given up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_sync_fails_the_later_groups_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, writer, shared) = start_with_hooks(dir.path(), 1);
    let gate = Gate::hold(&shared, 2);
    let first = spawn_append(&wal, b"lost 1");
    gate.started(2);
    let mut later = Vec::new();
    for n in 2..=SYNC_FILES as u64 {
        later.push(spawn_append(&wal, format!("lost {n}").as_bytes()));
        gate.started(n + 1);
    }
    std::thread::sleep(SETTLE);
    assert_eq!(shared.durable_end(), 1);
    gate.release.send(true).unwrap();
    assert_eq!(first.await.unwrap(), Err(Error::Storage));
    for t in later {
        assert_eq!(t.await.unwrap(), Err(Error::Storage));
    }
    assert_eq!(shared.durable_end(), 1);
    assert!(!wal.stats().writable.load(Ordering::SeqCst));
    assert_eq!(wal.stats().groups.load(Ordering::SeqCst), 0);
    // After the pause the log writes again, in a new segment above the failed numbers.
    std::thread::sleep(FIRST_BACKOFF + Duration::from_millis(50));
    assert_eq!(wal.append(vec![b"kept".to_vec()]).await, Ok(()));
    let kept = SYNC_FILES as u64 + 1;
    assert_eq!(shared.durable_end(), kept + 1);
    tokio::task::spawn_blocking(move || writer.stop())
        .await
        .unwrap();
    let read = read_all(dir.path());
    let seqs: Vec<u64> = read.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, [kept]);
    let records = crate::log::record::decode_frame(&read[0].1).unwrap();
    assert_eq!(records, [b"kept".as_slice()]);
}

/// A failure in the middle of the pipeline: the groups before it stay acknowledged,
/// the durable end stops before the failed group and never passes it, and the
/// numbers of the failed groups are recorded as skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_durable_end_never_passes_a_failed_group() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, writer, shared) = start_with_hooks(dir.path(), 1);
    assert_eq!(wal.append(vec![b"one".to_vec()]).await, Ok(()));
    assert_eq!(shared.durable_end(), 2);
    let gate = Gate::hold(&shared, 3);
    let held = spawn_append(&wal, b"two");
    gate.started(3);
    let mut later = Vec::new();
    for n in 3..=SYNC_FILES as u64 + 1 {
        later.push(spawn_append(&wal, format!("later {n}").as_bytes()));
        gate.started(n + 1);
    }
    std::thread::sleep(SETTLE);
    assert_eq!(shared.durable_end(), 2);
    gate.release.send(true).unwrap();
    assert_eq!(held.await.unwrap(), Err(Error::Storage));
    for t in later {
        assert_eq!(t.await.unwrap(), Err(Error::Storage));
    }
    assert_eq!(shared.durable_end(), 2);
    std::thread::sleep(FIRST_BACKOFF + Duration::from_millis(50));
    assert_eq!(wal.append(vec![b"three".to_vec()]).await, Ok(()));
    let next = SYNC_FILES as u64 + 2;
    assert_eq!(shared.durable_end(), next + 1);
    assert_eq!(
        shared.losses.skipped.load(Ordering::SeqCst),
        SYNC_FILES as u64,
        "every failed group's number is skipped"
    );
    tokio::task::spawn_blocking(move || writer.stop())
        .await
        .unwrap();
    assert_eq!(
        crate::log::marks::read_clean(dir.path()).unwrap(),
        Some(next + 1)
    );
}

/// A clean stop while syncs are in flight waits for them: every group is answered
/// and the recorded end of the log covers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_drains_the_groups_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, writer, shared) = start_with_hooks(dir.path(), 1);
    let gate = Gate::hold(&shared, 2);
    let first = spawn_append(&wal, b"a");
    gate.started(2);
    let second = spawn_append(&wal, b"b");
    gate.started(3);
    let stopped = tokio::task::spawn_blocking(move || writer.stop());
    std::thread::sleep(SETTLE);
    assert!(!stopped.is_finished(), "the stop waits for the held sync");
    gate.release.send(false).unwrap();
    stopped.await.unwrap();
    assert_eq!(first.await.unwrap(), Ok(()));
    assert_eq!(second.await.unwrap(), Ok(()));
    assert_eq!(crate::log::marks::read_clean(dir.path()).unwrap(), Some(3));
    assert_eq!(wal.append(vec![b"late".to_vec()]).await, Err(Error::Closed));
}

/// Many concurrent appends over many segments: every one acknowledged, numbered
/// without a gap, each request's records whole and in the order given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_groups_roll_over_segments_without_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, writer) = start(dir.path(), 1);
    let record = |i: usize, part: u8| {
        let mut r = format!("{i:04}-{part}").into_bytes();
        r.resize(ENTRY_MAX_BYTES / 4, b'.');
        r
    };
    let mut tasks = Vec::new();
    for i in 0..200usize {
        let wal = wal.clone();
        let records = vec![record(i, 0), record(i, 1)];
        tasks.push(tokio::spawn(async move { wal.append(records).await }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), Ok(()));
    }
    assert_eq!(wal.stats().appended_records.load(Ordering::SeqCst), 400);
    tokio::task::spawn_blocking(move || writer.stop())
        .await
        .unwrap();
    let segments = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension() == Some("log".as_ref()))
        .count();
    assert!(segments >= 5, "{segments} segments");
    let read = read_all(dir.path());
    let seqs: Vec<u64> = read.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    let mut records: Vec<Vec<u8>> = read
        .iter()
        .flat_map(|(_, frame)| {
            let decoded = crate::log::record::decode_frame(frame).unwrap();
            decoded.into_iter().map(<[u8]>::to_vec).collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(records.len(), 400);
    for pair in records.chunks(2) {
        assert_eq!(
            pair[0][..5],
            pair[1][..5],
            "a request's records stay together"
        );
        assert_eq!((pair[0][5], pair[1][5]), (b'0', b'1'));
    }
    records.sort();
    records.dedup();
    assert_eq!(records.len(), 400);
}
