//! The delta's size, which decides a fold, and reads while folds run.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::delta::{bytes, Delta};
use super::run::tests::{key, value};
use super::*;

fn entry(i: u32, version: u32) -> (IVec, IVec) {
    (IVec::from(key(i)), IVec::from(value(i, version)))
}

/// The delta's count of its active map's bytes, against the map itself.
fn assert_counted(d: &Delta) {
    assert_eq!(d.active_bytes(), bytes(d.active()));
}

#[test]
fn the_active_maps_bytes_follow_every_change() {
    let mut d = Delta::new(delta::map_of((0..10).map(|i| entry(i, 1))));
    assert_counted(&d);
    // Rewrites of the same keys, a removal, new keys; then put back.
    let undo = d.stage(&[entry(3, 22), entry(3, 333), entry(20, 1)]);
    assert_counted(&d);
    let removal = d.stage(&[(IVec::from(key(4)), IVec::from(TOMBSTONE))]);
    assert_counted(&d);
    d.unstage(removal);
    d.unstage(undo);
    assert_counted(&d);
    assert_eq!(
        d.active_bytes(),
        bytes(&delta::map_of((0..10).map(|i| entry(i, 1))))
    );

    // A fold: frozen, written to meanwhile, then what it left under the newer writes.
    let frozen = d.freeze();
    assert_eq!(d.active_bytes(), 0);
    d.stage(&[entry(5, 7), entry(30, 1)]);
    let from = key(5);
    let left: delta::Map = frozen
        .range::<[u8], _>((Bound::Included(&from[..]), Bound::Unbounded))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    d.unfreeze(left);
    assert_counted(&d);
    assert_eq!(
        d.get(&key(5)).unwrap(),
        IVec::from(value(5, 7)),
        "newer wins"
    );
    assert_eq!(d.get(&key(4)), None, "taken by the runs");
    assert_eq!(d.active().len(), 6);

    // A failed fold: all of it back, newer over older.
    let _ = d.freeze();
    d.stage(&[entry(6, 9)]);
    d.thaw();
    assert_counted(&d);
    assert_eq!(d.get(&key(6)).unwrap(), IVec::from(value(6, 9)));
    assert_eq!(d.active().len(), 6);
}

#[test]
fn a_key_rewritten_many_times_counts_once_toward_a_fold() {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path().join("db")).unwrap();
    let t = Layered::open(&db, dir.path(), "persons").unwrap();
    let once = (key(7).len() + value(7, 1).len()) as u64;
    // Four times the smallest fold in bytes written, always the same key, a hundred
    // rewrites a record.
    let rounds = (4 * MIN_FOLD_BYTES / once / 100) as u32 + 1;
    for round in 0..rounds {
        t.write((0..100).map(|v| entry(7, v % 10)).collect())
            .unwrap();
        assert_eq!(t.pending(), once);
        assert!(!t.should_fold(), "after {} rewrites", (round + 1) * 100);
    }
    // As many bytes of different keys are due.
    let keys = (MIN_FOLD_BYTES / once + 1) as u32;
    t.write((0..keys).map(|i| entry(i, 1)).collect()).unwrap();
    assert!(t.should_fold());
    t.fold().unwrap();
    assert_eq!(t.pending(), 0);
    assert!(!t.should_fold());
}

#[test]
fn lookups_during_folds_see_every_key() {
    const KEYS: u32 = 4_000;
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path().join("db")).unwrap();
    let t = Layered::open(&db, dir.path(), "persons").unwrap();
    t.set_part_bytes(32 * 1024);
    t.write((0..KEYS).map(|i| entry(i, 1)).collect()).unwrap();
    t.fold().unwrap();
    // Changes over every part, a removal in three, new keys; folded a little at a
    // time, so each fold leaves some of the delta to be swapped back in.
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = (0..KEYS).map(|i| (key(i), value(i, 1))).collect();
    let mut changes = Vec::new();
    for i in 0..KEYS + 500 {
        let v = match i % 3 {
            0 if i < KEYS => IVec::from(TOMBSTONE),
            _ => IVec::from(value(i, 2)),
        };
        match v.is_empty() {
            true => model.remove(&key(i)),
            false => model.insert(key(i), v.to_vec()),
        };
        changes.push((IVec::from(key(i)), v));
    }
    t.write(changes).unwrap();
    t.set_take_bytes(48 * 1024);
    let stop = AtomicBool::new(false);
    let rounds = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                for i in 0..KEYS + 500 {
                    let found = t.get(key(i)).unwrap().map(|v| v.to_vec());
                    assert_eq!(found.as_ref(), model.get(&key(i)), "key {i}");
                }
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        });
        let mut folds = 0;
        while t.delta_len() > 0 {
            t.fold().unwrap();
            folds += 1;
            assert!(folds < 100);
        }
        assert!(folds >= 3, "{folds} folds");
        // At least one whole pass of the reader after the last fold.
        let seen = rounds.load(Ordering::Relaxed);
        while rounds.load(Ordering::Relaxed) < seen + 2 && !reader.is_finished() {
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap();
    });
    assert!(rounds.load(Ordering::Relaxed) >= 2);
    assert_eq!(t.pending(), 0);
}
