//! A visit of a range reads what the table's iterator reads: the delta's entries over
//! the runs' (a rewrite replacing, a tombstone removing), across parts, within the
//! bounds asked for, in key order.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::store::layered::run::tests::{key, value};
use crate::store::layered::{block_entries, Layered, Noter, Visitor, TOMBSTONE};

type Entries = Vec<(Vec<u8>, Vec<u8>)>;

fn visited(t: &Layered, from: &[u8], to: Option<&[u8]>) -> Entries {
    let mut out = Vec::new();
    t.visit(from, to, |k, v| out.push((k.to_vec(), v.to_vec())));
    out
}

fn iterated(t: &Layered, from: &[u8], to: Option<&[u8]>) -> Entries {
    let upper = to.map_or(Bound::Unbounded, |t| Bound::Excluded(t.to_vec()));
    t.range((Bound::Included(from.to_vec()), upper))
        .map(|kv| {
            let (k, v) = kv.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .collect()
}

#[test]
fn a_visit_reads_the_delta_over_the_runs_in_key_order() {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path().join("db")).unwrap();
    let t = Layered::open(&db, dir.path(), "persons").unwrap();
    // Parts of about 40 keys, so ranges cross them.
    t.set_part_bytes(4096);
    let bounds: [(&[u8], Option<&[u8]>); 6] = [
        (b"", None),
        (b"k0000100", Some(b"k0000900")),
        (b"k00002", Some(b"k00003")),
        (b"k00000555", Some(b"k00000556")),
        (b"k00001999", None),
        (b"z", None),
    ];
    let check = |state: &str, model: &BTreeMap<Vec<u8>, Vec<u8>>| {
        for (from, to) in bounds {
            let got = visited(&t, from, to);
            assert_eq!(got, iterated(&t, from, to), "{state} {from:?}..{to:?}");
            let want: Entries = model
                .range(from.to_vec()..)
                .take_while(|(k, _)| to.is_none_or(|t| k.as_slice() < t))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            assert_eq!(got, want, "{state} {from:?}..{to:?}");
        }
    };
    let mut model = BTreeMap::new();
    for i in (0..2_000).step_by(2) {
        t.insert(key(i), value(i, 1)).unwrap();
        model.insert(key(i), value(i, 1));
    }
    check("in the delta", &model);
    t.fold().unwrap();
    assert!(t.run().unwrap().parts().len() > 10);
    check("folded", &model);
    // Keys between the runs' keys, rewrites of theirs, removals, and keys past the
    // runs' last.
    for i in (0..2_100).step_by(3) {
        if i % 4 == 0 {
            t.insert(key(i), TOMBSTONE).unwrap();
            model.remove(&key(i));
        } else {
            t.insert(key(i), value(i, 2)).unwrap();
            model.insert(key(i), value(i, 2));
        }
    }
    check("changed over the runs", &model);
    t.fold().unwrap();
    check("folded again", &model);
}

/// A reader that notes how many entries each block it reads holds, and leaves unread
/// every block it has a note of; what it was given, and the entries its notes counted.
#[derive(Default)]
struct Noting {
    given: Vec<Vec<u8>>,
    noted: usize,
    /// Entries the notes it passed over counted.
    counted: u64,
}

impl Visitor for Noting {
    fn reads_notes(&self) -> Option<usize> {
        Some(0)
    }

    fn note(&mut self, raw: &[u8]) -> Option<Vec<u8>> {
        let n = block_entries(raw).count();
        self.noted += n;
        Some((n as u64).to_le_bytes().to_vec())
    }

    fn pass_over_noted(&mut self, note: &[u8]) -> bool {
        let counted = <[u8; 8]>::try_from(note).map(u64::from_le_bytes);
        self.counted += counted.unwrap_or(0);
        counted.is_ok()
    }

    fn entry(&mut self, key: &[u8], _: &[u8]) {
        self.given.push(key.to_vec());
    }
}

#[test]
fn a_block_noted_once_is_left_unread_while_its_run_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path().join("db")).unwrap();
    let t = Layered::open(&db, dir.path(), "persons").unwrap();
    t.set_part_bytes(4096);
    for i in 0..1_000 {
        t.insert(key(i), value(i, 1)).unwrap();
    }
    t.fold().unwrap();
    let visit = |from: &[u8]| {
        let mut v = Noting::default();
        t.visit_with(from, None, &mut v);
        v
    };
    // The first visit reads from key 500 on, noting each block it reads (the first of
    // them whole, keys before 500 too).
    let first = visit(&key(500));
    assert_eq!(first.given, (500..1_000).map(key).collect::<Vec<_>>());
    assert!(first.noted >= 500 && first.noted < 600, "{}", first.noted);
    // The next leaves those blocks unread, and reads and notes the others; a rewrite
    // in the delta of a key in a noted block is still given.
    t.insert(key(700), value(700, 2)).unwrap();
    let second = visit(&key(0));
    let unnoted = 1_000 - first.noted as u32;
    assert_eq!(second.noted, unnoted as usize);
    let mut want: Vec<_> = (0..unnoted).map(key).collect();
    want.push(key(700));
    assert_eq!(second.given, want);
    assert_eq!(visit(&key(0)).given, vec![key(700)]);
    // A fold writes the part the delta changed again, without notes: its keys are
    // read and noted; the parts it kept keep theirs.
    t.fold().unwrap();
    let folded = visit(&key(0));
    assert!(folded.given.contains(&key(700)));
    assert!(folded.given.len() < 200, "{}", folded.given.len());
    assert_eq!(folded.noted, folded.given.len());
    assert_eq!(visit(&key(0)).given, Vec::<Vec<u8>>::new());
}

/// Notes of each block's entries count, as a fold writes them.
const COUNTED: Noter = Noter {
    parts: &[8, 1],
    note: |raw, out| {
        out.extend_from_slice(&(block_entries(raw).count() as u64).to_le_bytes());
        out.push(7);
    },
};

/// Open the table "persons" of the database in `dir`, noting its blocks, in parts of
/// a few blocks.
fn noting(dir: &std::path::Path) -> (sled::Db, Layered) {
    let db = sled::open(dir.join("db")).unwrap();
    let t = Layered::open(&db, dir, "persons").unwrap();
    t.set_part_bytes(4096);
    t.note_blocks(Some(COUNTED));
    (db, t)
}

#[test]
fn the_notes_a_fold_writes_leave_blocks_unread_after_a_restart_unless_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let (db, t) = noting(dir.path());
    for i in 0..1_000 {
        t.insert(key(i), value(i, 1)).unwrap();
    }
    t.fold().unwrap();
    let visit = |t: &Layered| {
        let mut v = Noting::default();
        t.visit_with(&key(0), None, &mut v);
        v
    };
    // Every block is noted by the fold: none is read, none noted in memory.
    let fresh = visit(&t);
    assert_eq!(
        (fresh.given.len(), fresh.noted, fresh.counted),
        (0, 0, 1_000)
    );
    assert_eq!(t.memory_bytes().1, t.run().unwrap().resident_bytes());
    let parts = t.run().unwrap().parts().len();
    assert!(parts > 2, "{parts}");
    // A change folded: its part is written again, noted; the others keep their notes.
    t.insert(key(700), value(700, 2)).unwrap();
    t.fold().unwrap();
    let folded = visit(&t);
    assert_eq!((folded.given.len(), folded.counted), (0, 1_000));
    // After a restart, the same.
    drop((t, db));
    let (db, t) = noting(dir.path());
    assert_eq!(visit(&t).counted, 1_000);
    assert!(t.verify().unwrap().is_ok());
    // A note that fails its CRC is no note: its block is read, and `check` names it.
    let run = t.run().unwrap().parts()[1].run.clone();
    let bytes = std::fs::read(run.path()).unwrap();
    let index_at = u64::from_le_bytes(bytes[bytes.len() - 24..][..8].try_into().unwrap());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(run.path())
        .unwrap();
    // The last CRC of the first part's notes (the second's, a byte each, follow).
    let last_crc = index_at - run.block_count() as u64 * 5 - 1;
    let byte = [bytes[last_crc as usize] ^ 0xff];
    std::os::unix::fs::FileExt::write_all_at(&file, &byte, last_crc).unwrap();
    let damaged = visit(&t);
    let last_block = run.block_count() - 1;
    assert!(!damaged.given.is_empty());
    assert_eq!(damaged.given.len() as u64 + damaged.counted, 1_000);
    let err = t.verify().unwrap().unwrap_err().to_string();
    assert!(
        err.contains(&format!("block {last_block}: its note")),
        "{err}"
    );
    drop(db);
}
