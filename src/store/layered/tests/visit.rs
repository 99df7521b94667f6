//! A visit of a range reads what the table's iterator reads: the delta's entries over
//! the runs' (a rewrite replacing, a tombstone removing), across parts, within the
//! bounds asked for, in key order.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::store::layered::run::tests::{key, value};
use crate::store::layered::{Layered, TOMBSTONE};

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
