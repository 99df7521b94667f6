//! A fold's syncs, seen through [`Syncs`]: sled's delta flushed before a run takes
//! it, the new runs synced before a manifest names them, the manifest synced before
//! its rename, the runs' directory synced before the old runs and the delta entries
//! the new ones took are removed. Each sync
//! failing in turn leaves what a read sees, the delta and the files as they were,
//! and the next fold does it all again; so removing any of them fails a test here.

use std::collections::BTreeMap;

use super::journal::{JOURNAL_DIR_SYNC, JOURNAL_SYNC};
use super::run::tests::{key, value};
use super::*;

const KEYS: u32 = 200;

/// A table whose run holds `KEYS` keys, with changes over it in the delta: new
/// values, removals and new keys.
fn table() -> (tempfile::TempDir, sled::Db, Layered) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path().join("db")).unwrap();
    let t = Layered::open(&db, dir.path(), "persons").unwrap();
    t.write(
        (0..KEYS)
            .map(|i| (key(i).into(), IVec::from(value(i, 1))))
            .collect(),
    )
    .unwrap();
    t.fold().unwrap();
    t.write(
        ((0..KEYS).step_by(9))
            .map(|i| (key(i).into(), IVec::from(value(i, 2))))
            .collect(),
    )
    .unwrap();
    t.write(
        ((1..KEYS).step_by(13))
            .map(|i| (key(i).into(), IVec::from(TOMBSTONE)))
            .collect(),
    )
    .unwrap();
    t.write(
        (KEYS..KEYS + 20)
            .map(|i| (key(i).into(), IVec::from(value(i, 1))))
            .collect(),
    )
    .unwrap();
    (dir, db, t)
}

/// What the table shows: every key's value, the delta, the run in use and the files.
#[derive(Debug, PartialEq)]
struct Seen {
    values: BTreeMap<u32, Option<Vec<u8>>>,
    delta: Vec<(Vec<u8>, Vec<u8>)>,
    runs: Vec<String>,
    files: Vec<String>,
}

fn seen(dir: &std::path::Path, t: &Layered) -> Seen {
    let values = (0..KEYS + 20)
        .map(|i| (i, t.get(key(i)).unwrap().map(|v| v.to_vec())))
        .collect();
    let delta = t
        .delta_entries()
        .into_iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()));
    let mut files: Vec<String> = std::fs::read_dir(dir.join(DIR_NAME))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|f| !f.ends_with(".journal"))
        .collect();
    files.sort();
    Seen {
        values,
        delta: delta.collect(),
        runs: t
            .run()
            .unwrap()
            .parts()
            .iter()
            .map(|p| p.file.clone())
            .collect(),
        files,
    }
}

fn whats(t: &Layered, from: usize) -> Vec<&'static str> {
    t.syncs().done()[from..].iter().map(|d| d.what).collect()
}

#[test]
fn a_fold_syncs_the_delta_then_the_run_then_the_directory() {
    let (dir, _db, t) = table();
    // The journal made the runs' directory, synced into the database's.
    assert_eq!(
        whats(&t, 0),
        [DELTA_SYNC, RUN_SYNC, MANIFEST_SYNC, DIR_SYNC]
    );
    let journal: Vec<_> = t.journal().syncs().done().iter().map(|d| d.what).collect();
    assert_eq!(
        &journal[..3],
        [JOURNAL_DIR_SYNC, JOURNAL_SYNC, JOURNAL_DIR_SYNC]
    );
    let before = seen(dir.path(), &t);
    let from = t.syncs().done().len();
    t.fold().unwrap();
    assert_eq!(
        whats(&t, from),
        [DELTA_SYNC, RUN_SYNC, MANIFEST_SYNC, DIR_SYNC]
    );
    let after = seen(dir.path(), &t);
    assert_eq!(after.values, before.values);
    assert!(after.delta.is_empty());
    assert_eq!(after.files, ["persons.0000000002.part", "persons.manifest"]);
}

#[test]
fn a_failed_sync_leaves_the_table_as_it_was_and_the_next_fold_does_it_again() {
    for what in [DELTA_SYNC, RUN_SYNC, MANIFEST_SYNC, DIR_SYNC] {
        let (dir, db, t) = table();
        let before = seen(dir.path(), &t);
        assert_eq!(
            before.files,
            ["persons.0000000001.part", "persons.manifest"]
        );
        assert!(!before.delta.is_empty());
        let pending = t.pending();
        t.syncs().fail(what, 0);
        let failed = t.fold();
        assert!(failed.is_err(), "{what}: {failed:?}");
        assert_eq!(seen(dir.path(), &t), before, "{what}");
        assert_eq!(t.pending(), pending, "{what}");
        // As a start would find it, too.
        let reopened = Layered::open(&db, dir.path(), "persons").unwrap();
        assert_eq!(seen(dir.path(), &reopened), before, "{what}");
        drop(reopened);

        let from = t.syncs().done().len();
        t.fold().unwrap();
        let done = [DELTA_SYNC, RUN_SYNC, MANIFEST_SYNC, DIR_SYNC];
        assert_eq!(whats(&t, from), done, "{what}");
        let after = seen(dir.path(), &t);
        assert_eq!(after.values, before.values, "{what}");
        assert!(after.delta.is_empty(), "{what}");
    }
}

/// The runs' directory made by the journal's first write, its entry's sync failing:
/// the write fails and leaves nothing, and the next one makes the entry durable
/// before writing a record in it.
#[test]
fn a_new_directory_whose_sync_failed_is_synced_by_the_next_write() {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path().join("db")).unwrap();
    let t = Layered::open(&db, dir.path(), "persons").unwrap();
    t.journal().syncs().fail(JOURNAL_DIR_SYNC, 0);
    assert!(t.insert(key(1), value(1, 1)).is_err());
    assert_eq!(t.delta_len(), 0);
    assert!(!dir.path().join(DIR_NAME).exists());
    t.insert(key(1), value(1, 1)).unwrap();
    let journal: Vec<_> = t.journal().syncs().done().iter().map(|d| d.what).collect();
    assert_eq!(
        journal,
        [
            JOURNAL_DIR_SYNC,
            JOURNAL_SYNC,
            JOURNAL_DIR_SYNC,
            JOURNAL_SYNC
        ]
    );
    drop(t);
    let reopened = Layered::open(&db, dir.path(), "persons").unwrap();
    assert_eq!(reopened.get(key(1)).unwrap().unwrap().to_vec(), value(1, 1));
}
