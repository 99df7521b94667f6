//! A database of format 5, as the build before split runs left it: each layered table
//! one `.run` file and no manifest, changes in the deltas. Opened to be written it is
//! marked format 6, reads every person through the old run, and the next fold splits
//! the run by key range; opened only to read, its format is left as found.

use uuid::Uuid;

use super::{FORMAT, FORMAT_KEY};
use crate::store::layered::{Writer, DIR_NAME};
use crate::store::{keys, Trees, PERSONS_TREE};

const PERSONS: u128 = 3_000;

fn person_key(i: u128) -> [u8; 24] {
    keys::with_uuid(1, Uuid::from_u128(i * 7_919))
}

fn person(i: u128, version: u32) -> Vec<u8> {
    format!(r#"{{"id":{i},"v":{version},"properties":{{"email":"user{i}@example.com"}}}}"#)
        .into_bytes()
}

#[test]
fn a_format_five_database_reads_its_runs_and_folds_them_split() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = sled::open(dir.path()).unwrap();
        let runs = dir.path().join(DIR_NAME);
        std::fs::create_dir_all(&runs).unwrap();
        let mut sorted: Vec<u128> = (0..PERSONS).collect();
        sorted.sort_by_key(|&i| person_key(i));
        let mut w = Writer::create(&runs.join("persons.0000000004.run")).unwrap();
        for &i in &sorted {
            w.push(&person_key(i), &person(i, 1)).unwrap();
        }
        w.finish().unwrap().sync_all().unwrap();
        let delta = db.open_tree(PERSONS_TREE).unwrap();
        delta.insert(person_key(5), person(5, 2)).unwrap();
        let meta = db.open_tree("meta").unwrap();
        meta.insert(FORMAT_KEY, &5u64.to_be_bytes()[..]).unwrap();
        db.flush().unwrap();
    }
    let db = crate::store::reopen_for_tests(dir.path());
    let format = |trees: &Trees| trees.meta.get(FORMAT_KEY).unwrap().unwrap().to_vec();
    let read = Trees::open_to_read(&db, dir.path()).unwrap();
    assert_eq!(format(&read), 5u64.to_be_bytes());
    drop(read);
    let trees = Trees::open(&db, dir.path()).unwrap();
    assert_eq!(format(&trees), FORMAT.to_be_bytes());
    let get = |t: &Trees, i: u128| t.persons.get(person_key(i)).unwrap().map(|v| v.to_vec());
    for i in (0..PERSONS).step_by(11) {
        let version = if i == 5 { 2 } else { 1 };
        assert_eq!(get(&trees, i), Some(person(i, version)), "person {i}");
    }
    assert_eq!(get(&trees, 5), Some(person(5, 2)));
    trees.persons.set_part_bytes(16 * 1024);
    trees.persons.insert(person_key(9), person(9, 3)).unwrap();
    trees.persons.fold().unwrap();
    let parts = trees.persons.run().unwrap();
    assert!(parts.parts().len() > 4, "{} parts", parts.parts().len());
    assert_eq!(parts.entries(), PERSONS as u64);
    assert!(!dir
        .path()
        .join(DIR_NAME)
        .join("persons.0000000004.run")
        .exists());
    drop((trees, parts));
    let again = Trees::open(&db, dir.path()).unwrap();
    assert_eq!(get(&again, 9), Some(person(9, 3)));
    assert_eq!(get(&again, 5), Some(person(5, 2)));
    assert_eq!(get(&again, 2_999), Some(person(2_999, 1)));
    assert_eq!(again.persons.iter().count(), PERSONS as usize);
}
