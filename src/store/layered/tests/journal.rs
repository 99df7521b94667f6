//! The journal across crashes: a start reads it up to the length sled recorded and
//! cuts what lies past it (a torn record, a chunk sled never committed), a fold that
//! stops between its manifest and its rotation, or before the journal it carried over
//! is recorded, reads the same after, and a chunk
//! whose journal sync fails is not committed and leaves the journal refusing writes
//! until it is opened again.

use sled::transaction::{ConflictableTransactionError, Transactional};

use super::chunk::{Journaled, Pending};
use super::journal::{journal_path, JOURNAL_RECORD_SYNC, JOURNAL_SYNC};
use super::run::tests::{key, value};
use super::*;

fn table() -> (tempfile::TempDir, sled::Db, Layered) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path().join("db")).unwrap();
    let t = Layered::open(&db, dir.path(), "persons").unwrap();
    let entries = (0..50).map(|i| (IVec::from(key(i)), IVec::from(value(i, 1))));
    t.write(entries.collect()).unwrap();
    (dir, db, t)
}

/// The journals in `dir`'s tables, oldest first.
fn journals(dir: &tempfile::TempDir) -> Vec<PathBuf> {
    let tables = dir.path().join(DIR_NAME);
    let mut files: Vec<_> = std::fs::read_dir(&tables)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".journal"))
        .collect();
    files.sort();
    files
}

fn current(dir: &tempfile::TempDir) -> PathBuf {
    journals(dir).pop().unwrap()
}

fn values(t: &Layered) -> Vec<Option<Vec<u8>>> {
    (0..60)
        .map(|i| t.get(key(i)).unwrap().map(|v| v.to_vec()))
        .collect()
}

#[test]
fn a_torn_tail_is_cut_and_what_was_committed_reads() {
    let (dir, db, t) = table();
    let before = values(&t);
    let path = current(&dir);
    let len = std::fs::metadata(&path).unwrap().len();
    drop(t);
    // Half a record: its length and CRC, then a few bytes of payload.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(&[200, 0, 0, 0, 1, 2, 3, 4, 7, 7]);
    std::fs::write(&path, bytes).unwrap();
    let reopened = Layered::open(&db, dir.path(), "persons").unwrap();
    assert_eq!(values(&reopened), before);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
    // And it is appended to after the cut.
    reopened.insert(key(55), value(55, 1)).unwrap();
    drop(reopened);
    let again = Layered::open(&db, dir.path(), "persons").unwrap();
    assert_eq!(again.get(key(55)).unwrap().unwrap().to_vec(), value(55, 1));
}

#[test]
fn a_journal_longer_than_sleds_record_is_cut_to_it() {
    let (dir, db, t) = table();
    let before = values(&t);
    let path = current(&dir);
    let len = std::fs::metadata(&path).unwrap().len();
    // A chunk journaled and synced whose transaction never commits (a crash).
    let pending = Pending::new(&t);
    pending.insert(key(3), value(3, 9));
    pending.insert(key(57), value(57, 9));
    let chunk = Journaled::begin(t.journal(), std::slice::from_ref(&pending));
    assert!(chunk.stage().unwrap().is_some());
    assert!(std::fs::metadata(&path).unwrap().len() > len);
    // Readers saw it staged; the chunk does not commit, so it is put back.
    assert_eq!(t.get(key(3)).unwrap().unwrap().to_vec(), value(3, 9));
    chunk.finish(false);
    assert_eq!(values(&t), before);
    drop(t);
    let reopened = Layered::open(&db, dir.path(), "persons").unwrap();
    assert_eq!(values(&reopened), before);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
}

#[test]
fn a_chunk_whose_journal_sync_fails_is_not_committed() {
    let (dir, db, t) = table();
    let before = values(&t);
    let meta = db.open_tree("meta").unwrap();
    let recorded = meta.get(t.journal().key()).unwrap();
    let pending = Pending::new(&t);
    let chunk = Journaled::begin(t.journal(), std::slice::from_ref(&pending));
    t.journal().syncs().fail(JOURNAL_SYNC, 0);
    let outcome = (&meta,).transaction(|(meta,)| {
        chunk.restart();
        pending.insert(key(4), value(4, 5));
        match chunk.stage() {
            Ok(Some((k, v))) => meta.insert(k, &v[..]).map(drop)?,
            Ok(None) => {}
            Err(_) => return Err(ConflictableTransactionError::Abort(())),
        }
        meta.insert(&b"checkpoint"[..], &b"chunk"[..])?;
        Ok(())
    });
    assert!(outcome.is_err());
    chunk.finish(outcome.is_ok());
    assert_eq!(meta.get(b"checkpoint").unwrap(), None);
    assert_eq!(meta.get(t.journal().key()).unwrap(), recorded);
    assert_eq!(values(&t), before);
    // The failure is kept, as sled keeps its own: every write, the probe and a fold's
    // rotation refuse until the journal is opened again.
    assert!(t.journal().kept_error().is_err());
    assert!(t.insert(key(8), value(8, 8)).is_err());
    assert!(t.journal().probe().is_err());
    assert!(t.fold().is_err());
    assert_eq!(values(&t), before);
    drop(t);
    let reopened = Layered::open(&db, dir.path(), "persons").unwrap();
    assert_eq!(values(&reopened), before);
    reopened.journal().kept_error().unwrap();
    reopened.insert(key(8), value(8, 8)).unwrap();
    assert_eq!(reopened.get(key(8)).unwrap().unwrap().to_vec(), value(8, 8));
}

/// The probe a reopen makes writes past the committed bytes and cuts them off again:
/// the journal reads and appends as before.
#[test]
fn a_probe_leaves_the_journal_as_it_was() {
    let (dir, db, t) = table();
    let before = values(&t);
    let path = current(&dir);
    let len = std::fs::metadata(&path).unwrap().len();
    t.journal().probe().unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
    t.insert(key(56), value(56, 1)).unwrap();
    drop(t);
    let reopened = Layered::open(&db, dir.path(), "persons").unwrap();
    let mut expected = before;
    expected[56] = Some(value(56, 1));
    assert_eq!(values(&reopened), expected);
}

/// A fold whose new runs are named by the manifest, stopped before its rotation is
/// recorded: the old journal still reads, over runs that hold the same values.
#[test]
fn a_fold_stopped_before_its_rotation_reads_the_same() {
    let (dir, db, t) = table();
    t.fold().unwrap();
    t.insert(key(2), value(2, 2)).unwrap();
    t.insert(key(58), value(58, 1)).unwrap();
    t.insert(key(7), TOMBSTONE).unwrap();
    let before = values(&t);
    let old = current(&dir);
    t.journal().syncs().fail(JOURNAL_RECORD_SYNC, 0);
    // The record naming the new journal is not known durable: the fold fails, the
    // new journal stays (it is current in memory), the old ones stay on disk.
    let _ = t.fold();
    assert_eq!(values(&t), before);
    drop(t);
    // As a start after a crash that lost sled's unflushed record: the old journal.
    let meta = db.open_tree("meta").unwrap();
    let mut v = meta.get(b"persons.journal").unwrap().unwrap().to_vec();
    let n = |p: &std::path::Path| -> u64 {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        name.split('.').nth(1).unwrap().parse().unwrap()
    };
    let old_n = n(&old);
    assert!(
        old.exists() || journal_path(&dir.path().join(DIR_NAME), "persons", old_n + 1).exists()
    );
    if old.exists() {
        v[..8].copy_from_slice(&old_n.to_be_bytes());
        v[8..16].copy_from_slice(&old_n.to_be_bytes());
        v[16..].copy_from_slice(&std::fs::metadata(&old).unwrap().len().to_be_bytes());
        meta.insert(b"persons.journal", v).unwrap();
    }
    let reopened = Layered::open(&db, dir.path(), "persons").unwrap();
    reopened.remove_strays().unwrap();
    assert_eq!(values(&reopened), before);
    // And a fold from there goes through.
    reopened.fold().unwrap();
    assert_eq!(values(&reopened), before);
    assert_eq!(reopened.delta_len(), 0);
}

/// A fold killed once the journal it carried over is renamed into place, before the
/// record naming that journal the first is durable: a start reads the older journals,
/// then the carried one (what they hold, less what the runs took), then the current
/// one, so the folded table and the one beside it read as they did, a change made to
/// the latter during the fold included.
#[test]
fn a_fold_killed_before_its_carried_journal_is_recorded_reads_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path().join("db")).unwrap();
    let open = || {
        let mut tables = open_all(&db, dir.path(), &["persons", "others"], true).unwrap();
        let other = tables.pop().unwrap();
        (tables.pop().unwrap(), other)
    };
    let (t, other) = open();
    for table in [&t, &other] {
        let entries = (0..50).map(|i| (IVec::from(key(i)), IVec::from(value(i, 1))));
        table.write(entries.collect()).unwrap();
    }
    t.fold().unwrap();
    t.insert(key(2), value(2, 2)).unwrap();
    t.insert(key(7), TOMBSTONE).unwrap();
    other.insert(key(3), value(3, 2)).unwrap();
    let beside = other.clone();
    t.set_during_fold(Some(Box::new(move |_: &Layered| {
        beside.insert(key(4), value(4, 3)).unwrap();
        beside.insert(key(3), TOMBSTONE).unwrap();
    })));
    let meta = db.open_tree("meta").unwrap();
    let record = |meta: &sled::Tree| meta.get(t.journal().key()).unwrap().unwrap().to_vec();
    let first = record(&meta)[..8].to_vec();
    // The fold fails at the flush of the record naming the carried journal the first:
    // every journal is still on disk.
    t.journal().syncs().fail(JOURNAL_RECORD_SYNC, 0);
    assert!(t.fold().is_err());
    let (folded, beside) = (values(&t), values(&other));
    assert_eq!(folded[2], Some(value(2, 2)));
    assert_eq!((folded[7].as_ref(), beside[3].as_ref()), (None, None));
    assert_eq!(beside[4], Some(value(4, 3)));
    // The kill lost that record; the split's, flushed before the runs were written,
    // is what the start finds.
    let mut lost = record(&meta);
    assert_ne!(lost[..8], first[..]);
    lost[..8].copy_from_slice(&first);
    meta.insert(t.journal().key(), lost).unwrap();
    drop((t, other));
    let (t, other) = open();
    t.remove_strays().unwrap();
    assert_eq!(
        (values(&t), values(&other)),
        (folded.clone(), beside.clone())
    );
    // A fold from there goes through, and a start after it reads the same.
    t.fold().unwrap();
    assert_eq!(t.delta_len(), 0);
    drop((t, other));
    let (t, other) = open();
    assert_eq!((values(&t), values(&other)), (folded, beside));
}

#[test]
fn a_huge_record_then_a_small_one_leaves_the_kept_buffer_under_its_bound() {
    let (dir, db, t) = table();
    let huge = vec![b'x'; 6 << 20];
    t.insert(key(51), huge.clone()).unwrap();
    let kept = t.journal().record_capacity();
    assert!(kept <= 4 << 20, "{kept}");
    t.insert(key(52), value(52, 1)).unwrap();
    let kept = t.journal().record_capacity();
    assert!((1..=4 << 20).contains(&kept), "{kept}");
    // Both records read back.
    drop(t);
    let again = Layered::open(&db, dir.path(), "persons").unwrap();
    assert_eq!(again.get(key(51)).unwrap().unwrap().to_vec(), huge);
    assert_eq!(again.get(key(52)).unwrap().unwrap().to_vec(), value(52, 1));
}

/// The records of the journal at `path`, by their lengths.
fn records_in(path: &std::path::Path) -> usize {
    let bytes = std::fs::read(path).unwrap();
    let mut at = super::records::HEADER.len();
    let mut records = 0;
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        at += 8 + len;
        records += 1;
    }
    assert_eq!(at, bytes.len());
    records
}

/// A fold's rotation writes each table's changes as records of about a MiB, read
/// back a table at a time: a start after it reads every table as it was, the folded
/// one's entries the runs did not take included, and so does a start after the next
/// fold, which reads the carried journal back itself.
#[test]
fn a_carried_journal_is_written_in_records_of_about_a_mib_and_reads_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path().join("db")).unwrap();
    let names = ["persons", "others", "thirds"];
    let open = || open_all(&db, dir.path(), &names, true).unwrap();
    let big = |i: u32, t: usize| -> Vec<u8> {
        let mut v = value(i, t as u32 + 1);
        v.resize(700, i as u8);
        v
    };
    let tables = open();
    // About 2 MB of each table's changes: each spans several records.
    for (t, table) in tables.iter().enumerate() {
        let entries = (0..3000).map(|i| (IVec::from(key(i)), IVec::from(big(i, t))));
        table.write(entries.collect()).unwrap();
    }
    tables[1].insert(key(5), TOMBSTONE).unwrap();
    let all = |tables: &[Layered]| -> Vec<Vec<Option<Vec<u8>>>> {
        let each = |t: &Layered| {
            let read = |i| t.get(key(i)).unwrap().map(|v| v.to_vec());
            (0..3001).map(read).collect::<Vec<_>>()
        };
        tables.iter().map(each).collect()
    };
    let before = all(&tables);
    assert_eq!(before[1][5], None);
    assert_eq!(before[2][2999], Some(big(2999, 2)));
    tables[0].fold().unwrap();
    // The two other tables' 2.2 MB each, in records of about a MiB: 3 each (one
    // record for them all before).
    let carried = records_in(&journals(&dir)[0]);
    assert_eq!(carried, 6);
    assert_eq!(all(&tables), before);
    drop(tables);
    let tables = open();
    assert_eq!(all(&tables), before);
    // The next fold carries what the first carried.
    tables[1].fold().unwrap();
    assert_eq!(all(&tables), before);
    drop(tables);
    let tables = open();
    assert_eq!(all(&tables), before);
    assert_eq!(tables[0].delta_len() + tables[1].delta_len(), 0);
    assert_eq!(tables[2].delta_len(), 3000);
}
