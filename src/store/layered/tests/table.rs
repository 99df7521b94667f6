use std::collections::BTreeMap;
use std::ops::Bound;

use super::run::tests::{key, value};
use super::*;

struct Fixture {
    dir: tempfile::TempDir,
    db: sled::Db,
    table: Layered,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path().join("db")).unwrap();
    let table = Layered::open(&db, dir.path(), "persons").unwrap();
    Fixture { dir, db, table }
}

fn all(table: &Layered) -> Vec<(Vec<u8>, Vec<u8>)> {
    table
        .iter()
        .map(|kv| {
            let (k, v) = kv.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .collect()
}

/// `n` keys written to the delta; what the table should then hold.
fn fill(t: &Layered, n: u32) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let model: BTreeMap<Vec<u8>, Vec<u8>> = (0..n).map(|i| (key(i), value(i, 1))).collect();
    let entries = model
        .iter()
        .map(|(k, v)| (IVec::from(&k[..]), IVec::from(&v[..])));
    t.write(entries.collect()).unwrap();
    model
}

#[test]
fn reads_see_the_delta_over_the_run_before_and_after_folds() {
    let f = fixture();
    let t = &f.table;
    let mut model = fill(t, 3_000);
    assert!(t.should_fold());
    let folded = t.fold().unwrap();
    assert_eq!((folded.entries, folded.taken), (3_000, 3_000));
    assert!(t.delta_len() == 0);
    assert_eq!(t.pending(), 0);
    assert!(!t.should_fold());
    assert_eq!(all(t), model.clone().into_iter().collect::<Vec<_>>());

    // Changes over the run: new values, removals (tombstones), new keys, a key that
    // is removed without ever being in the run.
    for i in (0..3_000).step_by(3) {
        t.insert(key(i), value(i, 2)).unwrap();
        model.insert(key(i), value(i, 2));
    }
    for i in (1..3_000).step_by(7) {
        t.insert(key(i), TOMBSTONE).unwrap();
        model.remove(&key(i));
    }
    for i in 3_000..3_500 {
        t.insert(key(i), value(i, 1)).unwrap();
        model.insert(key(i), value(i, 1));
    }
    t.insert(key(9_999), TOMBSTONE).unwrap();
    let check = |t: &Layered, model: &BTreeMap<Vec<u8>, Vec<u8>>| {
        for i in 0..3_600 {
            assert_eq!(
                t.get(key(i)).unwrap().map(|v| v.to_vec()),
                model.get(&key(i)).cloned(),
                "key {i}"
            );
        }
        assert_eq!(t.get(key(9_999)).unwrap(), None);
        assert_eq!(all(t), model.clone().into_iter().collect::<Vec<_>>());
        // A prefix and a range cut in the middle of pages.
        let prefix: Vec<_> = t
            .scan_prefix(b"k0000012")
            .map(|kv| kv.unwrap().0.to_vec())
            .collect();
        let want: Vec<_> = model
            .keys()
            .filter(|k| k.starts_with(b"k0000012"))
            .cloned()
            .collect();
        assert_eq!(prefix, want);
        let from = key(1_234);
        let got: Vec<_> = t
            .range((Bound::Excluded(from.clone()), Bound::Unbounded))
            .map(|kv| kv.unwrap().0.to_vec())
            .collect();
        let want: Vec<_> = model
            .range((Bound::Excluded(from), Bound::Unbounded))
            .map(|(k, _)| k.clone())
            .collect();
        assert_eq!(got, want);
    };
    check(t, &model);
    t.fold().unwrap();
    assert!(t.delta_len() == 0, "the delta is emptied by the fold");
    check(t, &model);

    // Reopened: the newest run is the table's.
    let reopened = Layered::open(&f.db, f.dir.path(), "persons").unwrap();
    check(&reopened, &model);
    assert_eq!(reopened.pending(), 0);
    let runs = std::fs::read_dir(f.dir.path().join(DIR_NAME))
        .unwrap()
        .filter(|e| {
            !e.as_ref()
                .unwrap()
                .path()
                .to_string_lossy()
                .ends_with(".journal")
        })
        .count();
    assert_eq!(
        runs,
        2,
        "the replaced runs are removed: one run and the manifest: {:?}",
        std::fs::read_dir(f.dir.path().join(DIR_NAME))
            .unwrap()
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_crash_before_the_rename_leaves_a_stray_that_is_removed() {
    let f = fixture();
    let t = &f.table;
    t.insert(key(1), value(1, 1)).unwrap();
    t.fold().unwrap();
    let dir = f.dir.path().join(DIR_NAME);
    // What a crash leaves: runs and a manifest being made, an older run not yet
    // removed, and a run of a build before manifests.
    std::fs::write(dir.join("persons.0000000002.part"), b"half").unwrap();
    std::fs::write(dir.join("persons.manifest.new"), b"half").unwrap();
    std::fs::write(dir.join("persons.0000000003.run.new"), b"half").unwrap();
    std::fs::copy(
        dir.join("persons.0000000001.part"),
        dir.join("persons.0000000000.part"),
    )
    .unwrap();
    std::fs::copy(
        dir.join("persons.0000000001.part"),
        dir.join("persons.0000000004.run"),
    )
    .unwrap();
    std::fs::write(dir.join("distinct_ids.0000000009.run"), b"another table's").unwrap();
    let reopened = Layered::open(&f.db, f.dir.path(), "persons").unwrap();
    assert_eq!(reopened.get(key(1)).unwrap().unwrap().to_vec(), value(1, 1));
    reopened.remove_strays().unwrap();
    let mut left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|f| !f.ends_with(".journal"))
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "distinct_ids.0000000009.run",
            "persons.0000000001.part",
            "persons.manifest"
        ]
    );
}

#[test]
fn a_failed_fold_leaves_the_table_as_it_was() {
    let f = fixture();
    let t = &f.table;
    t.write(
        (0..100)
            .map(|i| (key(i).into(), IVec::from(value(i, 1))))
            .collect(),
    )
    .unwrap();
    t.fold().unwrap();
    t.insert(key(5), value(5, 2)).unwrap();
    let pending = t.pending();
    // The runs' directory cannot take a new file: a file stands where it should be.
    let dir = f.dir.path().join(DIR_NAME);
    let moved = f.dir.path().join("moved");
    std::fs::rename(&dir, &moved).unwrap();
    std::fs::write(&dir, b"in the way").unwrap();
    assert!(t.fold().is_err());
    assert_eq!(t.pending(), pending);
    assert_eq!(t.get(key(5)).unwrap().unwrap().to_vec(), value(5, 2));
    assert_eq!(t.get(key(6)).unwrap().unwrap().to_vec(), value(6, 1));
    std::fs::remove_file(&dir).unwrap();
    std::fs::rename(&moved, &dir).unwrap();
    t.fold().unwrap();
    assert_eq!(t.get(key(5)).unwrap().unwrap().to_vec(), value(5, 2));
    assert!(t.delta_len() == 0);
}

#[test]
fn a_fold_over_a_damaged_run_keeps_it_aside() {
    let f = fixture();
    let t = &f.table;
    fill(t, 3_000);
    t.fold().unwrap();
    let path = f.dir.path().join(DIR_NAME).join("persons.0000000001.part");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[40] ^= 0xFF;
    std::fs::write(&path, &bytes).unwrap();
    let t = Layered::open(&f.db, f.dir.path(), "persons").unwrap();
    assert_eq!(t.get(key(0)).unwrap(), None);
    assert!(t.verify().unwrap().is_err());
    t.insert(key(0), value(0, 2)).unwrap();
    t.fold().unwrap();
    assert_eq!(t.get(key(0)).unwrap().unwrap().to_vec(), value(0, 2));
    assert_eq!(
        t.get(key(2_999)).unwrap().unwrap().to_vec(),
        value(2_999, 1)
    );
    assert!(path.with_extension("part.damaged").exists());
    assert!(t.verify().unwrap().is_ok());
}

#[test]
fn successor_bounds_a_prefix() {
    assert_eq!(successor(b"ab"), Some(b"ac".to_vec()));
    assert_eq!(successor(b"a\xff"), Some(b"b".to_vec()));
    assert_eq!(successor(b"\xff\xff"), None);
}

#[test]
fn a_large_delta_is_folded_in_steps() {
    let f = fixture();
    let t = &f.table;
    let model = fill(t, 3_000);
    t.set_take_bytes(64 * 1024);
    let mut folds = 0;
    while t.delta_len() > 0 {
        t.fold().unwrap();
        folds += 1;
        // Between steps, the table reads whole: part in the run, the rest in the delta.
        assert_eq!(all(t), model.clone().into_iter().collect::<Vec<_>>());
        assert!(folds < 20);
    }
    assert!(
        folds >= 4,
        "a step takes at most 64 KiB here: {folds} folds"
    );
    assert_eq!(t.pending(), 0);
    assert_eq!(t.run().unwrap().entries(), 3_000);
}

#[test]
fn a_block_that_failed_to_read_once_is_folded_when_it_reads_again() {
    let f = fixture();
    let t = &f.table;
    fill(t, 3_000);
    t.fold().unwrap();
    let path = f.dir.path().join(DIR_NAME).join("persons.0000000001.part");
    let good = std::fs::read(&path).unwrap();
    let mut bad = good.clone();
    bad[40] ^= 0xFF;
    std::fs::write(&path, &bad).unwrap();
    assert_eq!(t.get(key(0)).unwrap(), None);
    assert!(t.run().unwrap().damage_seen());
    // The read failure passes (the same bytes read back whole).
    std::fs::write(&path, &good).unwrap();
    t.insert(key(5_000), value(5_000, 1)).unwrap();
    t.fold().unwrap();
    assert_eq!(t.get(key(0)).unwrap().unwrap().to_vec(), value(0, 1));
    assert!(!path.with_extension("part.damaged").exists());
    assert_eq!(t.run().unwrap().entries(), 3_001);
}
