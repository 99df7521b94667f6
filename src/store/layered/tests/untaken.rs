//! What a fold leaves of its frozen map, from the key ranges its runs took, against
//! the entries those ranges hold one by one.

use std::ops::Bound;

use sled::IVec;

use super::super::delta::{Key, Map};
use super::{untaken, TakenRange};

fn key(i: u32) -> Vec<u8> {
    format!("k{i:04}").into_bytes()
}

fn frozen() -> Map {
    (0..100u32)
        .filter(|i| i % 3 != 0)
        .map(|i| (Key::from(&key(i)[..]), IVec::from(&key(i)[..])))
        .collect()
}

/// The entries of `frozen` in none of `ranges`, one at a time.
fn model(frozen: &Map, ranges: &[TakenRange]) -> Vec<Vec<u8>> {
    let inside = |k: &[u8]| {
        ranges.iter().any(|(lower, stop)| {
            let to = stop
                .as_ref()
                .map_or(Bound::Unbounded, |s| Bound::Excluded(&s[..]));
            k >= &lower[..] && within(k, to)
        })
    };
    frozen
        .keys()
        .filter(|k| !inside(&k[..]))
        .map(|k| k.to_vec())
        .collect()
}

fn within(k: &[u8], to: Bound<&[u8]>) -> bool {
    match to {
        Bound::Excluded(s) => k < s,
        _ => true,
    }
}

fn range(lower: u32, stop: Option<u32>) -> TakenRange {
    let lower = Box::from(&key(lower)[..]);
    (lower, stop.map(|s| Key::from(&key(s)[..])))
}

#[test]
fn what_is_left_is_every_entry_outside_the_ranges_taken() {
    let frozen = frozen();
    let cases: Vec<Vec<TakenRange>> = vec![
        vec![],
        vec![range(0, None)],
        vec![range(0, Some(50))],
        vec![range(10, Some(20)), range(30, Some(30)), range(50, None)],
        // A range's stop before its group's end (the limit met), the next empty.
        vec![range(5, Some(7)), range(40, Some(40)), range(60, Some(99))],
        // Ranges that meet, and keys the map does not hold at their bounds.
        vec![range(3, Some(9)), range(9, Some(12)), range(12, Some(200))],
        vec![range(200, None)],
    ];
    for ranges in cases {
        let left: Vec<Vec<u8>> = untaken(&frozen, &ranges)
            .keys()
            .map(|k| k.to_vec())
            .collect();
        assert_eq!(left, model(&frozen, &ranges), "{} ranges", ranges.len());
        for (k, v) in untaken(&frozen, &ranges) {
            assert_eq!(frozen.get(&k), Some(&v));
        }
    }
}
