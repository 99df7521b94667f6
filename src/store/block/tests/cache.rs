use super::*;
use crate::store::block::files::{Files, Pointer};
use crate::store::block::tests::value;

fn rows(first: u128) -> Arc<Rows> {
    Arc::new(Rows::decode(&value(first, 3)).unwrap())
}

fn key(offset: u64) -> Key {
    Pointer {
        count: 3,
        file: 0,
        offset,
        len: 1,
        crc: 0,
    }
}

#[test]
fn the_budget_holds_and_a_block_read_again_stays_longer() {
    // Blocks of events 10-12, 20-22, ...: the same weight each.
    let weight = rows(10).weight();
    let cache = Cache::new(weight * 3);
    for i in 0..3 {
        cache.insert(key(i), rows((i as u128 + 1) * 10));
    }
    assert_eq!(cache.bytes(), weight * 3);
    // Read since the hand last passed: the next insert evicts the one after it.
    let first = cache.get(key(0)).unwrap();
    assert_eq!(first.heads()[0].uuid.as_u128(), 10);
    cache.insert(key(3), rows(40));
    assert_eq!(cache.bytes(), weight * 3);
    assert!(cache.get(key(0)).is_some());
    assert!(cache.get(key(1)).is_none());
    assert!(cache.get(key(2)).is_some());
    assert_eq!(cache.get(key(3)).unwrap().heads()[0].uuid.as_u128(), 40);
    // Every one read: the hand gives each another turn, then evicts the oldest.
    cache.insert(key(4), rows(50));
    assert_eq!(cache.bytes(), weight * 3);
    assert!(cache.get(key(2)).is_none());
    for i in [0, 3, 4] {
        assert!(cache.get(key(i)).is_some(), "{i}");
    }
}

#[test]
fn a_block_heavier_than_the_budget_is_not_kept() {
    let block = rows(10);
    let cache = Cache::new(block.weight() - 1);
    cache.insert(key(0), block);
    assert!(cache.get(key(0)).is_none());
    assert_eq!(cache.bytes(), 0);
}

#[test]
fn files_decode_a_block_once_for_reads_that_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let files = Files::open(dir.path()).unwrap();
    let (a, b) = (value(0, 3), value(10, 4));
    let (pa, pb) = (files.append(&a).unwrap(), files.append(&b).unwrap());
    files.sync().unwrap();
    let first = files.rows(b"k", &pa).unwrap();
    assert!(Arc::ptr_eq(&first, &files.rows(b"k", &pa).unwrap()));
    assert_eq!(files.cached_bytes(), first.weight());
    let other = files.rows(b"k", &pb).unwrap();
    assert_eq!(other.heads().len(), 4);
    assert!(!Arc::ptr_eq(&first, &other));
    // A block held in the tree itself (no pointer) is decoded, not kept.
    assert_eq!(files.rows(b"k", &a).unwrap().heads().len(), 3);
    assert_eq!(files.cached_bytes(), first.weight() + other.weight());
}
