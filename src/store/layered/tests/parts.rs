//! Runs split by key range: a table grown past [`PART_BYTES`] (here a few KB) is cut
//! into parts, a fold rewrites only the parts its delta changed, and the table reads
//! the same through the delta, the parts and a reopening; a table of format 5 (one
//! `.run`, no manifest) opens and is split by its first fold.

use std::collections::BTreeMap;

use super::run::tests::{key, value};
use super::*;

/// Bytes a part is cut at here: about 40 keys.
const SMALL_PART: u64 = 4096;

fn table() -> (tempfile::TempDir, sled::Db, Layered) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path().join("db")).unwrap();
    let t = Layered::open(&db, dir.path(), "persons").unwrap();
    t.set_part_bytes(SMALL_PART);
    (dir, db, t)
}

fn all(t: &Layered) -> BTreeMap<Vec<u8>, Vec<u8>> {
    t.iter()
        .map(|kv| {
            let (k, v) = kv.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .collect()
}

fn files(t: &Layered) -> Vec<String> {
    t.run()
        .unwrap()
        .parts()
        .iter()
        .map(|p| p.file.clone())
        .collect()
}

fn check(t: &Layered, model: &BTreeMap<Vec<u8>, Vec<u8>>) {
    assert_eq!(&all(t), model);
    for i in (0..3_000).step_by(7) {
        assert_eq!(
            t.get(key(i)).unwrap().map(|v| v.to_vec()),
            model.get(&key(i)).cloned(),
            "key {i}"
        );
    }
    let first = t.scan_prefix(b"k000012").map(|kv| kv.unwrap().0.to_vec());
    let want = model.keys().filter(|k| k.starts_with(b"k000012")).cloned();
    assert_eq!(first.collect::<Vec<_>>(), want.collect::<Vec<_>>());
}

#[test]
fn a_fold_rewrites_only_the_parts_its_changes_fall_in() {
    let (dir, db, t) = table();
    let mut model = BTreeMap::new();
    for i in 0..2_000 {
        t.insert(key(i), value(i, 1)).unwrap();
        model.insert(key(i), value(i, 1));
    }
    let first = t.fold().unwrap();
    assert_eq!((first.rewritten, first.parts_before), (1, 0));
    let parts = t.run().unwrap().parts().len();
    assert!(parts > 20, "{parts} parts");
    assert!(t.delta_len() == 0);
    check(&t, &model);
    t.run().unwrap().verify().unwrap();

    // Changes within the first tenth of the keys: the other parts stay as they were.
    let before = files(&t);
    for i in (0..200).step_by(3) {
        t.insert(key(i), value(i, 2)).unwrap();
        model.insert(key(i), value(i, 2));
    }
    t.insert(key(5), TOMBSTONE).unwrap();
    model.remove(&key(5));
    check(&t, &model);
    let second = t.fold().unwrap();
    assert_eq!(second.parts_before, parts);
    assert!(
        second.rewritten < parts / 5,
        "{} of {parts} rewritten",
        second.rewritten
    );
    let after = files(&t);
    let kept = after.iter().filter(|f| before.contains(f)).count();
    assert_eq!(kept, parts - second.rewritten, "{before:?} {after:?}");
    assert!(second.written_bytes < t.run().unwrap().file_bytes() / 4);
    check(&t, &model);
    assert!(t.delta_len() == 0);
    assert_eq!(t.pending(), 0);

    // The files on disk are the manifest's and no other; a reopening reads the same.
    let mut on_disk: Vec<String> = std::fs::read_dir(dir.path().join(DIR_NAME))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|f| !f.ends_with(".journal"))
        .filter(|f| f != "persons.manifest")
        .collect();
    on_disk.sort();
    let mut named = after.clone();
    named.sort();
    assert_eq!(on_disk, named);
    let reopened = Layered::open(&db, dir.path(), "persons").unwrap();
    check(&reopened, &model);
    assert_eq!(files(&reopened), after);
}

#[test]
fn parts_emptied_by_removals_are_dropped_and_the_rest_still_read() {
    let (_dir, _db, t) = table();
    let mut model = BTreeMap::new();
    for i in 0..1_000 {
        t.insert(key(i), value(i, 1)).unwrap();
        model.insert(key(i), value(i, 1));
    }
    t.fold().unwrap();
    let parts = t.run().unwrap().parts().len();
    // The first few hundred keys removed: whole parts left empty, the first one too.
    for i in 0..300 {
        t.insert(key(i), TOMBSTONE).unwrap();
        model.remove(&key(i));
    }
    t.fold().unwrap();
    let runs = t.run().unwrap();
    assert!(
        runs.parts().len() < parts,
        "{} of {parts}",
        runs.parts().len()
    );
    assert!(runs.parts()[0].lower.is_empty());
    runs.verify().unwrap();
    check(&t, &model);
    // Keys before every remaining one land in the first part again.
    t.insert(key(1), value(1, 3)).unwrap();
    model.insert(key(1), value(1, 3));
    t.fold().unwrap();
    check(&t, &model);
}

#[test]
fn a_table_of_format_5_opens_and_its_first_fold_splits_it() {
    let dir = tempfile::tempdir().unwrap();
    let runs_dir = dir.path().join(DIR_NAME);
    std::fs::create_dir_all(&runs_dir).unwrap();
    // What the build before manifests left: one run, an older one, a delta.
    let mut model = BTreeMap::new();
    let mut w = Writer::create(&runs_dir.join("persons.0000000007.run")).unwrap();
    for i in 0..1_500 {
        w.push(&key(i), &value(i, 1)).unwrap();
        model.insert(key(i), value(i, 1));
    }
    w.finish().unwrap().sync_all().unwrap();
    std::fs::write(runs_dir.join("persons.0000000006.run"), b"replaced").unwrap();
    let db = sled::open(dir.path().join("db")).unwrap();
    let t = Layered::open(&db, dir.path(), "persons").unwrap();
    t.set_part_bytes(SMALL_PART);
    t.remove_strays().unwrap();
    assert!(!runs_dir.join("persons.0000000006.run").exists());
    assert_eq!(files(&t), ["persons.0000000007.run"]);
    t.insert(key(3), value(3, 2)).unwrap();
    model.insert(key(3), value(3, 2));
    check(&t, &model);
    let folded = t.fold().unwrap();
    assert_eq!((folded.rewritten, folded.parts_before), (1, 1));
    assert!(t.run().unwrap().parts().len() > 10);
    assert!(files(&t).iter().all(|f| f.ends_with(".part")));
    assert!(!runs_dir.join("persons.0000000007.run").exists());
    // New runs are numbered after every file found.
    assert!(files(&t)[0].as_str() > "persons.0000000007");
    check(&t, &model);
    let reopened = Layered::open(&db, dir.path(), "persons").unwrap();
    check(&reopened, &model);
}

/// Every key of a table rewritten with a value of the same size: the parts come out
/// at about the size asked. Counting a changed key in both the run and the delta made
/// about twice as many parts of half the size.
#[test]
fn a_changed_key_is_counted_once_when_a_range_is_cut() {
    let (_dir, _db, t) = table();
    t.set_part_bytes(1 << 30);
    let write = |version: u32| {
        let entries = (0..2_000).map(|i| (IVec::from(key(i)), IVec::from(value(i, version))));
        t.write(entries.collect()).unwrap();
    };
    write(1);
    t.fold().unwrap();
    let raw = t.run().unwrap().raw_bytes();
    assert_eq!(t.run().unwrap().parts().len(), 1);
    // Cut at a third of the table: three parts, not six.
    t.set_part_bytes(raw / 3 + 1);
    write(2);
    t.fold().unwrap();
    let runs = t.run().unwrap();
    assert_eq!(runs.parts().len(), 3, "{} parts", runs.parts().len());
    assert_eq!(runs.raw_bytes(), raw);
    for p in runs.parts() {
        let share = p.run.raw_bytes() as f64 / (raw as f64 / 3.0);
        assert!(
            (0.9..1.1).contains(&share),
            "a part of {share:.2} of the size asked"
        );
    }
}
