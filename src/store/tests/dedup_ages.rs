//! Pruning by age at times far from zero, where a cutoff computed from the wrong
//! operands (a quotient for a difference) still looks right at time zero: a segment
//! stays until a window's age after its newest arrival, to the millisecond.

use super::*;
use crate::config::DEFAULT_DEDUP_MAX_IDS;

const HOUR: i64 = 60 * 60 * 1000;
const DAY: i64 = 24 * HOUR;

fn key(n: u64) -> IVec {
    IVec::from(&keys::recent(0, n)[..])
}

/// Ten uuids of project 1 from `from`.
fn chunk(from: u128) -> Vec<Id> {
    (from..from + 10).map(|i| (1, i)).collect()
}

#[test]
fn a_segment_is_dropped_a_windows_age_after_its_newest_arrival() {
    let mut w = Window::new(&std::env::temp_dir(), DAY, DEFAULT_DEDUP_MAX_IDS);
    let start = 10 * DAY;
    w.insert(key(1), start, &chunk(0), None, start).unwrap();
    // Two hours later the first chunk is frozen, newest at `start`.
    w.insert(key(2), start + 2 * HOUR, &chunk(10), None, start + 2 * HOUR)
        .unwrap();
    assert_eq!(w.frozen.len(), 1);
    // A day after its newest arrival it is still in: the window's age is inclusive.
    assert_eq!(w.prune(start + DAY).unwrap().removals(), 0);
    assert!(w.contains((1, 0)).unwrap());
    assert_eq!(w.len(), 20);
    // A millisecond later it goes, its entry with it; the later chunk stays.
    assert_eq!(w.prune(start + DAY + 1).unwrap().removals(), 1);
    assert!(!w.contains((1, 0)).unwrap() && !w.contains((1, 9)).unwrap());
    assert!(w.contains((1, 10)).unwrap() && w.contains((1, 19)).unwrap());
    assert_eq!(w.len(), 10);
    assert_eq!(w.frozen.len(), 0);
}
