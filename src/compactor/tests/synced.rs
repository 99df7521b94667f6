//! The event blocks' durability seen through their syncs ([`crate::support::syncs`]):
//! a chunk's pointers are committed only after a sync that covered their bytes
//! returned and their file's name was synced into the directory, and a sync that
//! fails commits nothing of the chunk, which a retry then applies once. A `kill -9`
//! keeps the page cache, so the crash tests cannot see a missing sync; these can.

use std::collections::BTreeSet;

use super::*;
use crate::store::block::files::{Pointer, DIR_SYNC, FILE_SYNC};
use crate::store::block::Files;

/// Records whose blocks fill more than one block file (64 KiB under test): each holds
/// 256 random hex digits, which LZ4 cannot shrink.
fn large(n: usize) -> Vec<Record> {
    (0..n)
        .map(|i| {
            let noise: String = (0..8)
                .map(|_| Uuid::new_v4().simple().to_string())
                .collect();
            let e = json!({"event": "e", "distinct_id": format!("d{}", i % 7),
                           "properties": {"noise": noise}});
            record(1, i as i64, e)
        })
        .collect()
}

/// Whether syncs that returned covered the bytes `p` names and named its file.
fn durable(files: &Files, p: &Pointer) -> bool {
    let done = files.syncs().done();
    let file = u64::from(p.file);
    let named = done.iter().any(|d| d.what == DIR_SYNC && d.file == file);
    let end = p.offset + u64::from(p.len);
    let synced = done
        .iter()
        .any(|d| d.what == FILE_SYNC && d.file == file && d.end >= end);
    named && synced
}

/// The pointers committed in the `events` tree.
fn pointers(f: &Fixture) -> Vec<Pointer> {
    let values = f.trees.events.iter().map(|kv| kv.unwrap().1);
    values.map(|v| Pointer::decode(&v).unwrap()).collect()
}

/// A fixture holding `records` in its log, nothing compacted yet.
fn holding(records: &[Record]) -> Fixture {
    let mut f = fixture(Compaction::default());
    f.push(records);
    f
}

#[test]
fn a_chunk_commits_its_pointers_only_after_their_bytes_were_synced() {
    let mut f = holding(&large(600));
    assert!(!f.compactor.step().unwrap().is_idle());
    let committed = pointers(&f);
    let files: BTreeSet<u32> = committed.iter().map(|p| p.file).collect();
    // One chunk over several files: the file it left is synced as well as the last.
    assert!(committed.len() >= 4, "{} blocks", committed.len());
    assert!(files.len() >= 2, "files {files:?}");
    for p in &committed {
        assert!(durable(&f.trees.blocks, p), "{p:?} committed unsynced");
    }
    let syncs = f.trees.blocks.syncs();
    assert_eq!(syncs.count(FILE_SYNC), files.len());
    assert_eq!(syncs.count(DIR_SYNC), files.len());
}

/// Every sync the first chunk makes, failed in turn on a fresh database: the step
/// reports the block files' error, nothing of the chunk is committed (no pointer, no
/// event, no person, no checkpoint, no outbox entry, the log as deep), and a retry
/// stores everything once, all of it synced.
#[test]
fn a_failed_block_sync_commits_nothing_of_the_chunk() {
    let records = large(600);
    let mut clean = holding(&records);
    clean.compactor.step().unwrap();
    let syncs = clean.trees.blocks.syncs();
    let (file_syncs, dir_syncs) = (syncs.count(FILE_SYNC), syncs.count(DIR_SYNC));
    assert!(file_syncs >= 2 && dir_syncs >= 2, "{:?}", syncs.done());
    clean.drain();
    let expected = clean.state(1);
    assert_eq!(expected.len(), records.len());
    let failures = (0..file_syncs)
        .map(|n| (FILE_SYNC, n))
        .chain((0..dir_syncs).map(|n| (DIR_SYNC, n)));
    for (what, after) in failures {
        let mut f = holding(&records);
        let depth = f.log.shared().depth();
        f.trees.blocks.syncs().fail(what, after);
        let failed = f.compactor.step();
        assert!(
            matches!(failed, Err(Error::Blocks(_))),
            "{what} sync {after}: {failed:?}"
        );
        assert!(f.trees.events.is_empty(), "{what} sync {after}");
        assert!(f.trees.persons.is_empty().unwrap());
        assert_eq!(f.trees.meta.get(CHECKPOINT_KEY).unwrap(), None);
        assert!(f.trees.outbox.is_empty());
        assert_eq!(f.log.shared().depth(), depth);
        f.drain();
        assert!(f.log_empty());
        assert_eq!(f.state(1), expected, "{what} sync {after}");
        for p in &pointers(&f) {
            assert!(durable(&f.trees.blocks, p), "{p:?} committed unsynced");
        }
    }
}
