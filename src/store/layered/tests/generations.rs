//! Each map's heap ([`Generation`]): made by the owner's first write, replaced at a
//! freeze, released once the frozen map is dropped. The test binary's allocator is
//! not mimalloc, so nothing is allocated in these heaps; what is tested is when each
//! is made and handed back (the binary's allocator tests test what it serves).

use sled::IVec;

use super::*;

fn entry(key: &[u8], value: u8) -> (IVec, IVec) {
    (IVec::from(key), IVec::from(&[value; 300][..]))
}

/// The only test of this binary that makes heaps: the owner is process-wide.
#[test]
fn each_map_has_a_heap_of_its_own_handed_back_after_its_drop() {
    heaps::enable();
    heaps::adopt();
    let mut delta = Delta::default();
    assert!(delta.heap().made().is_none(), "made before any write");
    delta.stage(&[entry(b"a", 1)]);
    let first = delta
        .heap()
        .made()
        .expect("made by the owner's first write");

    // Written elsewhere, a map's heap is not made: the owner alone allocates in them.
    let mut elsewhere = Delta::default();
    std::thread::scope(|s| {
        s.spawn(|| elsewhere.stage(&[entry(b"x", 9)]));
    });
    assert!(elsewhere.heap().made().is_none());

    let frozen = delta.freeze();
    delta.stage(&[entry(b"b", 2)]);
    let second = delta.heap().made().expect("the new active map's own heap");
    assert_ne!(first, second);

    // The fold's done: the delta lets go of the frozen map, the fold still holds it.
    let retired = heaps::retired();
    delta.unfreeze(Map::new());
    assert_eq!(heaps::retired(), retired);
    assert_eq!(frozen.get(&b"a"[..]), Some(&IVec::from(&[1u8; 300][..])));
    drop(frozen);
    assert_eq!(heaps::retired(), retired + 1, "retired with its map");
    assert!(heaps::release() >= 1);
    assert_eq!(heaps::retired(), 0);

    // A failed fold's map goes back under the active one; its heap is retired, the
    // entries kept.
    let _frozen = delta.freeze();
    delta.thaw();
    drop(_frozen);
    assert_eq!(heaps::retired(), 1);
    assert_eq!(heaps::release(), 1);
    assert_eq!(delta.get(b"b"), Some(IVec::from(&[2u8; 300][..])));
    assert!(delta.heap().made().is_none());
}
