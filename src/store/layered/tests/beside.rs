//! Folds beside writes: what is written and read while a fold runs (between its freeze
//! and its switch) is kept, read the same during the fold, after it and after a start,
//! whether the fold succeeds or fails at any of its syncs; a chunk that does not
//! commit during a fold leaves nothing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::chunk::{Journaled, Pending};
use super::journal::{JOURNAL_DIR_SYNC, JOURNAL_RECORD_SYNC, JOURNAL_SYNC};
use super::run::tests::{key, value};
use super::*;

type Model = Arc<Mutex<BTreeMap<Vec<u8>, Vec<u8>>>>;

const KEYS: u32 = 2_000;

fn table() -> (tempfile::TempDir, sled::Db, Layered, Model) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path().join("db")).unwrap();
    let t = Layered::open(&db, dir.path(), "persons").unwrap();
    t.set_part_bytes(32 * 1024);
    let model: BTreeMap<_, _> = (0..KEYS).map(|i| (key(i), value(i, 1))).collect();
    let entries = model
        .iter()
        .map(|(k, v)| (IVec::from(&k[..]), IVec::from(&v[..])));
    t.write(entries.collect()).unwrap();
    t.fold().unwrap();
    // Changes over the runs for the next fold to take: new values, removals.
    let model = Model::new(Mutex::new(model));
    write(&t, &model, (0..KEYS).step_by(2), 2);
    (dir, db, t, model)
}

/// `keys` written at `version` (a multiple of 5 removed instead), in the model too.
fn write(t: &Layered, model: &Model, keys: impl Iterator<Item = u32>, version: u32) {
    let mut m = model.lock().unwrap();
    let mut entries = Vec::new();
    for i in keys {
        let v = match i % 5 {
            0 => Vec::new(),
            _ => value(i, version),
        };
        match v.is_empty() {
            true => m.remove(&key(i)),
            false => m.insert(key(i), v.clone()),
        };
        entries.push((IVec::from(key(i)), IVec::from(v)));
    }
    t.write(entries).unwrap();
}

/// The table reads as the model: point reads and iteration.
fn check(t: &Layered, model: &Model, what: &str) {
    let m = model.lock().unwrap();
    for i in 0..KEYS + 200 {
        let found = t.get(key(i)).unwrap().map(|v| v.to_vec());
        assert_eq!(found.as_ref(), m.get(&key(i)), "{what}: key {i}");
    }
    let all: Vec<_> = t
        .iter()
        .map(|kv| {
            let (k, v) = kv.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .collect();
    let expected: Vec<_> = m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert_eq!(all, expected, "{what}");
}

/// What a start finds: the table opened again from the disk.
fn check_reopened(dir: &tempfile::TempDir, db: &sled::Db, model: &Model, what: &str) {
    let reopened = Layered::open(db, dir.path(), "persons").unwrap();
    check(&reopened, model, what);
}

/// Writes during the fold, a chunk that does not commit, and reads (in memory and as
/// a start would find the disk) at that moment.
fn writes_beside(dir: &tempfile::TempDir, db: &sled::Db, t: &Layered, model: &Model, round: u32) {
    let (dir, db, model) = (dir.path().to_owned(), db.clone(), model.clone());
    t.set_during_fold(Some(Box::new(move |t: &Layered| {
        check(t, &model, "frozen, before the writes");
        // Keys the frozen map holds, keys only the runs hold, new keys.
        let keys = (0..KEYS).step_by(3).chain(KEYS..KEYS + 100 + round);
        write(t, &model, keys, 10 + round);
        // A chunk journaled and staged whose transaction never commits.
        let pending = Pending::new(t);
        pending.insert(key(1), value(1, 99));
        pending.insert(key(KEYS + 150), value(KEYS + 150, 99));
        let chunk = Journaled::begin(t.journal(), std::slice::from_ref(&pending));
        assert!(chunk.stage().unwrap().is_some());
        chunk.finish(false);
        check(t, &model, "during the fold");
        // A crash here.
        let reopened = Layered::open(&db, &dir, "persons").unwrap();
        check(&reopened, &model, "reopened during the fold");
    })));
}

fn journals(dir: &tempfile::TempDir) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(dir.path().join(DIR_NAME))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|f| f.contains(".journal"))
        .collect();
    files.sort();
    files
}

#[test]
fn writes_and_reads_during_a_fold_are_kept_and_read_the_same_after_a_start() {
    let (dir, db, t, model) = table();
    for round in 0..3 {
        writes_beside(&dir, &db, &t, &model, round);
        let folded = t.fold().unwrap();
        assert!(folded.taken > 0);
        check(&t, &model, "after the fold");
        // The delta holds what was written during the fold and nothing else.
        assert_eq!(
            t.delta_len(),
            (KEYS as usize).div_ceil(3) + 100 + round as usize
        );
        check_reopened(&dir, &db, &model, "reopened after the fold");
        // The journal carried over and the one written during the fold; none older,
        // none half made.
        assert_eq!(journals(&dir).len(), 2, "{:?}", journals(&dir));
    }
    t.set_during_fold(None);
    t.fold().unwrap();
    assert_eq!(t.delta_len(), 0);
    check(&t, &model, "after a fold of the rest");
    check_reopened(&dir, &db, &model, "reopened after a fold of the rest");
}

#[test]
fn a_fold_failing_at_any_sync_beside_writes_loses_nothing() {
    let table_syncs = [DELTA_SYNC, RUN_SYNC, MANIFEST_SYNC, DIR_SYNC];
    let journal_syncs = [JOURNAL_SYNC, JOURNAL_DIR_SYNC, JOURNAL_RECORD_SYNC];
    let failures = table_syncs
        .iter()
        .map(|w| (*w, true))
        .chain(journal_syncs.iter().map(|w| (*w, false)));
    for (what, of_table) in failures {
        let (dir, db, t, model) = table();
        writes_beside(&dir, &db, &t, &model, 0);
        // The failure armed once the writes beside the fold are made, so it hits the
        // fold's own sync (the journal's: the journal carried over, its directory, the
        // record naming it).
        let hook = Mutex::new(t.inner.during_fold.lock().unwrap().take());
        t.set_during_fold(Some(Box::new(move |t: &Layered| {
            if let Some(h) = &*hook.lock().unwrap() {
                h(t);
            }
            match of_table {
                true => t.syncs().fail(what, 0),
                false => t.journal().syncs().fail(what, 0),
            }
        })));
        let failed = t.fold();
        assert!(failed.is_err(), "{what}: {failed:?}");
        check(&t, &model, what);
        check_reopened(&dir, &db, &model, what);
        assert!(journals(&dir).iter().all(|f| f.ends_with(".journal")));
        // Writes after the failure, and a fold that goes through.
        t.set_during_fold(None);
        write(&t, &model, (0..KEYS).step_by(7), 50);
        t.fold().unwrap();
        assert_eq!(t.delta_len(), 0, "{what}");
        check(&t, &model, what);
        check_reopened(&dir, &db, &model, what);
    }
}

/// A fold on one thread while another writes and reads without pause: every write is
/// kept, every read sees the model as of its last write.
#[test]
fn folds_on_a_thread_of_their_own_beside_a_writer() {
    let (dir, db, t, model) = table();
    t.set_take_bytes(16 * 1024);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let folder = s.spawn(|| {
            let mut folds = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                t.fold().unwrap();
                folds += 1;
            }
            folds
        });
        for round in 0..60u32 {
            let from = (round * 37) % KEYS;
            write(&t, &model, from..from + 40, 100 + round);
            let m = model.lock().unwrap();
            for i in from..from + 40 {
                let found = t.get(key(i)).unwrap().map(|v| v.to_vec());
                assert_eq!(found.as_ref(), m.get(&key(i)), "round {round}: key {i}");
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(folder.join().unwrap() > 0);
    });
    check(&t, &model, "after the writer");
    check_reopened(&dir, &db, &model, "reopened after the writer");
}
