//! A database of format 6, as the build before the journal left it: the layered
//! tables' recent changes in sled trees of their names. Opened to be written, they
//! are moved into the journal (logged), the trees dropped, the format marked 7, and
//! everything reads the same, then and after a restart; opened only to read, the
//! trees are read as the delta and left.

use super::{FORMAT, FORMAT_KEY};
use crate::store::layered::{JOURNAL, TOMBSTONE};
use crate::store::{keys, Trees, DISTINCT_IDS_TREE, PERSONS_TREE};

fn person_key(i: u64) -> Vec<u8> {
    keys::with_str(1, &format!("person-{i:05}")).to_vec()
}

#[test]
fn a_format_six_databases_deltas_move_into_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = sled::open(dir.path()).unwrap();
        let persons = db.open_tree(PERSONS_TREE).unwrap();
        for i in 0..500u64 {
            persons
                .insert(person_key(i), format!("{{\"v\":{i}}}").as_bytes())
                .unwrap();
        }
        persons.insert(person_key(7), TOMBSTONE).unwrap();
        let ids = db.open_tree(DISTINCT_IDS_TREE).unwrap();
        ids.insert(keys::with_str(1, "anon"), &[9u8; 16][..])
            .unwrap();
        db.open_tree("meta")
            .unwrap()
            .insert(FORMAT_KEY, &6u64.to_be_bytes()[..])
            .unwrap();
        db.flush().unwrap();
    }
    let read = |trees: &Trees| {
        let persons: Vec<_> = (0..500u64)
            .map(|i| {
                trees
                    .persons
                    .get(person_key(i))
                    .unwrap()
                    .map(|v| v.to_vec())
            })
            .collect();
        let id = trees.distinct_ids.get(keys::with_str(1, "anon")).unwrap();
        (persons, id.map(|v| v.to_vec()))
    };
    let want_persons: Vec<_> = (0..500u64)
        .map(|i| (i != 7).then(|| format!("{{\"v\":{i}}}").into_bytes()))
        .collect();
    let want = (want_persons, Some(vec![9u8; 16]));
    {
        // Only read: the trees are the delta, and stay.
        let db = crate::store::reopen_for_tests(dir.path());
        let trees = Trees::open_to_read(&db, dir.path()).unwrap();
        assert_eq!(read(&trees), want);
        assert!(db.tree_names().iter().any(|n| n == PERSONS_TREE.as_bytes()));
    }
    {
        let db = crate::store::reopen_for_tests(dir.path());
        let trees = Trees::open(&db, dir.path()).unwrap();
        assert_eq!(read(&trees), want);
        let names = db.tree_names();
        assert!(!names.iter().any(|n| n == PERSONS_TREE.as_bytes()));
        assert!(!names.iter().any(|n| n == DISTINCT_IDS_TREE.as_bytes()));
        assert_eq!(
            trees.meta.get(FORMAT_KEY).unwrap().unwrap().as_ref(),
            &FORMAT.to_be_bytes()
        );
        assert!(trees
            .meta
            .get(format!("{JOURNAL}.journal"))
            .unwrap()
            .is_some());
        db.flush().unwrap();
    }
    // A restart reads them from the journal.
    let db = crate::store::reopen_for_tests(dir.path());
    let trees = Trees::open(&db, dir.path()).unwrap();
    assert_eq!(read(&trees), want);
    trees.persons.fold().unwrap();
    assert_eq!(read(&trees), want);
}
