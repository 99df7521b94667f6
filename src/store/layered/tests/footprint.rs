//! The delta's memory accounting ([`Delta::footprint`]) against what its maps really
//! allocate, counted by this test binary's allocator on the test's own thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use sled::IVec;

use super::*;

/// The system allocator, counting the bytes each thread holds.
struct Counting;

thread_local! {
    static HELD: Cell<i64> = const { Cell::new(0) };
}

fn count(delta: i64) {
    // A thread being torn down has no counter left; its allocations are not ours.
    let _ = HELD.try_with(|held| held.set(held.get() + delta));
}

// SAFETY: every call goes to the system allocator unchanged; a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as i64);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as i64));
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as i64 - layout.size() as i64);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes the calling thread allocated while `make` ran, for what it returned.
fn allocated<T>(make: impl FnOnce() -> T) -> (T, u64) {
    let before = HELD.with(Cell::get);
    let made = make();
    (made, (HELD.with(Cell::get) - before) as u64)
}

/// A delta of `n` entries of the shape of one table, written in random key order.
fn delta(n: u64, key_len: usize, value_len: usize) -> Delta {
    let mut d = Delta::default();
    for i in 0..n {
        // Scattered keys, as person uuids and distinct ids come.
        let mut key = vec![b'k'; key_len];
        let h = i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes();
        key[..8].copy_from_slice(&h);
        let value = vec![b'v'; value_len];
        d.stage(&[(IVec::from(key), IVec::from(value))]);
    }
    d
}

#[test]
fn footprint_is_within_a_fifth_of_what_the_maps_allocate() {
    // (key, value) lengths: a distinct id (project, kind, id) -> person uuid; a person
    // key -> its properties; first seen (time, person) -> nothing; all inline.
    for (key_len, value_len) in [(45, 16), (25, 400), (33, 0), (12, 8)] {
        let (d, real) = allocated(|| delta(20_000, key_len, value_len));
        let estimate = d.footprint();
        let (lo, hi) = (real * 4 / 5, real * 6 / 5);
        assert!(
            (lo..=hi).contains(&estimate),
            "{key_len}-byte keys, {value_len}-byte values: estimated {estimate}, \
             allocated {real}"
        );
        let raw = 20_000 * (key_len + value_len) as u64;
        if value_len < 100 {
            assert!(
                real > 2 * raw,
                "short entries cost more than twice their bytes: {real} against {raw}"
            );
        }
    }
}

#[test]
fn footprint_counts_the_frozen_map_too() {
    let mut d = delta(1_000, 45, 16);
    let active = d.footprint();
    d.freeze();
    assert_eq!(
        d.footprint(),
        active,
        "the frozen map counts as it did active"
    );
    d.stage(&[(
        IVec::from(&b"another key of more than 22 bytes"[..]),
        IVec::from(&b"v"[..]),
    )]);
    assert_eq!(
        d.footprint(),
        active + entry_footprint(33, 1),
        "an entry added to the active map adds its own share"
    );
}

#[test]
fn the_memory_kept_as_the_maps_change_is_what_counting_them_again_finds() {
    let mut d = delta(500, 45, 16);
    let counted = |d: &Delta| footprint_of(d.active());
    assert_eq!(d.memory().active, counted(&d));
    let before = d.memory();
    let key = IVec::from(vec![b'n'; 40]);
    let long = |n| IVec::from(vec![b'v'; n]);
    // A key written, then rewritten with a shorter value, in a chunk that fails.
    let mut undo = d.stage(&[(key.clone(), long(300))]);
    undo.extend(d.stage(&[(key.clone(), long(30))]));
    assert_eq!(d.memory().active, counted(&d));
    assert!(d.memory().active > before.active);
    d.unstage(undo);
    assert_eq!(d.memory(), before);
    let frozen = d.freeze();
    let expected = Memory {
        active: 0,
        frozen: before.active,
    };
    assert_eq!(d.memory(), expected);
    d.stage(&[(key, long(100))]);
    // What the fold did not take goes back under the active map.
    let left: Map = frozen
        .iter()
        .take(7)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    d.unfreeze(left);
    assert_eq!(d.memory().frozen, 0);
    assert_eq!(d.memory().active, counted(&d));
    assert_eq!(d.active().len(), 8);
}
