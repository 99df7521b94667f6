//! A visit of a range reads what the table's iterator reads: the delta's entries over
//! the runs' (a rewrite replacing, a tombstone removing), across parts, within the
//! bounds asked for, in key order.

use std::any::Any;
use std::collections::BTreeMap;
use std::ops::Bound;

use crate::store::layered::run::tests::{key, value};
use crate::store::layered::run::Note;
use crate::store::layered::{block_entries, Layered, Visitor, TOMBSTONE};

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
}

impl Visitor for Noting {
    fn note(&mut self, raw: &[u8]) -> Option<Note> {
        let n = block_entries(raw).count();
        self.noted += n;
        Some(Box::new(n))
    }

    fn pass_over_noted(&mut self, note: &(dyn Any + Send + Sync)) -> bool {
        note.downcast_ref::<usize>().is_some()
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
