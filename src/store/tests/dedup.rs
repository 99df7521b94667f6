use super::*;
use crate::config::{DEFAULT_DEDUP_MAX_AGE_MS, DEFAULT_DEDUP_MAX_IDS};

const HOUR: i64 = 60 * 60 * 1000;

/// For windows whose entries hold uuids: no entry names blocks.
fn no_blocks(_: &[(u64, u64)]) -> Result<std::collections::HashMap<u64, Vec<Id>>, sled::Error> {
    panic!("no entry names blocks")
}

/// The window of `tree`, whose entries hold uuids, at `now`, its segments in `dir`.
fn load(dir: &tempfile::TempDir, tree: &sled::Tree, now: i64) -> Window {
    Window::load(
        tree,
        &dir.path().join(DIR_NAME),
        DEFAULT_DEDUP_MAX_AGE_MS,
        DEFAULT_DEDUP_MAX_IDS,
        now,
        no_blocks,
    )
    .unwrap()
}

/// A `recent_ids` tree in a fresh database, removed when the dir is dropped.
fn recent_ids() -> (tempfile::TempDir, sled::Tree) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let tree = db.open_tree("recent_ids").unwrap();
    (dir, tree)
}

fn ids(from: u128, n: u128) -> Vec<Id> {
    (from..from + n)
        .map(|i| (1 + (i % 2) as u64, i * 7919))
        .collect()
}

#[test]
fn values_round_trip_and_reject_damage() {
    let mut chunk = ids(0, 100);
    chunk.push((9, u128::MAX));
    chunk.push(chunk[0]);
    let bytes = encode(&chunk);
    let mut back = decode(&bytes).unwrap();
    chunk.sort_unstable();
    chunk.dedup();
    back.sort_unstable();
    assert_eq!(back, chunk);
    for n in [1, 8, 11, 13, bytes.len() - 1] {
        assert_eq!(decode(&bytes[..n]), None, "prefix {n}");
    }
    assert_eq!(decode(&[]), Some(Vec::new()));
}

fn key(n: u64) -> IVec {
    IVec::from(&keys::recent(0, n)[..])
}

#[test]
fn finds_every_id_in_the_window_and_nothing_else() {
    let mut w = Window::new(
        &std::env::temp_dir(),
        DEFAULT_DEDUP_MAX_AGE_MS,
        DEFAULT_DEDUP_MAX_IDS,
    );
    // Enough for several frozen segments plus a partial hash set.
    for c in 0..300u64 {
        w.insert(key(c), 1000, &ids(c as u128 * 1000, 1000), None, 1000)
            .unwrap();
    }
    assert!(w.frozen.len() >= 4, "{} segments", w.frozen.len());
    assert_eq!(w.len(), 300_000);
    for i in (0..300_000u128).step_by(97) {
        assert!(w.contains((1 + (i % 2) as u64, i * 7919)).unwrap(), "{i}");
        // The same uuid in the other project was never seen.
        assert!(!w.contains((2 - (i % 2) as u64, i * 7919)).unwrap(), "{i}");
        assert!(!w.contains((1, i * 7919 + 1)).unwrap(), "{i}");
    }
}

#[test]
fn prunes_by_count_keeping_at_least_the_count() {
    let max = 3 * SEGMENT_IDS;
    let mut w = Window::new(&std::env::temp_dir(), DEFAULT_DEDUP_MAX_AGE_MS, max);
    let mut deleted = 0;
    let n = SEGMENT_IDS as u128;
    for c in 0..6u128 {
        deleted += w
            .insert(key(c as u64), 0, &ids(c * n, n), None, 0)
            .unwrap()
            .removals();
    }
    // Six segments inserted; the oldest go once the rest hold the count.
    assert_eq!(w.len(), max);
    assert!(!w.contains(ids(0, 1)[0]).unwrap());
    assert!(w.contains(ids(6 * n - 1, 1)[0]).unwrap());
    assert!(w.contains(ids(3 * n, 1)[0]).unwrap());
    assert_eq!(deleted, 3, "the dropped segments' entries are deleted");
}

#[test]
fn prunes_by_age() {
    let day = 24 * HOUR;
    let mut w = Window::new(&std::env::temp_dir(), day, DEFAULT_DEDUP_MAX_IDS);
    w.insert(key(1), 0, &ids(0, 10), None, 0).unwrap();
    // Two hours later the old hash set is frozen (past an hour) ...
    w.insert(key(2), 2 * HOUR, &ids(10, 10), None, 2 * HOUR)
        .unwrap();
    assert!(w.contains(ids(0, 1)[0]).unwrap() && w.contains(ids(10, 1)[0]).unwrap());
    // ... and a day after its newest arrival it is dropped, the later one kept.
    let batch = w.prune(day + HOUR).unwrap();
    assert!(!w.contains(ids(0, 1)[0]).unwrap());
    assert!(w.contains(ids(10, 1)[0]).unwrap());
    assert_eq!(batch.removals(), 1);
    assert_eq!(w.len(), 10);
}

#[test]
fn reloads_what_was_committed_without_the_expired() {
    let (dir, tree) = recent_ids();
    let now = 100 * HOUR;
    for (i, at) in [(1u64, now - 30 * HOUR), (2, now - 2 * HOUR), (3, now)] {
        let chunk = ids(u128::from(i) * 100, 10);
        tree.insert(keys::recent(at, i), encode(&chunk)).unwrap();
    }
    tree.insert(keys::recent(now, 4), &b"damaged"[..]).unwrap();
    let w = load(&dir, &tree, now);
    assert_eq!(w.len(), 20);
    assert!(!w.contains(ids(100, 1)[0]).unwrap(), "older than a day");
    assert!(w.contains(ids(200, 1)[0]).unwrap() && w.contains(ids(309, 1)[0]).unwrap());
    assert_eq!(
        tree.len(),
        2,
        "the expired and the damaged entries are deleted"
    );
}

/// Reloading a day of entries groups them by the hour they arrived in, as they
/// were grouped when stored, not one segment per entry: every lookup scans the
/// segments.
#[test]
fn reloaded_entries_are_frozen_by_arrival_hour() {
    let (dir, tree) = recent_ids();
    let now = 100 * HOUR;
    let entries = 1000u64;
    for i in 0..entries {
        let at = now - 20 * HOUR + (i as i64) * 20 * HOUR / entries as i64;
        let chunk = ids(u128::from(i) * 10, 10);
        tree.insert(keys::recent(at, i), encode(&chunk)).unwrap();
    }
    let w = load(&dir, &tree, now);
    assert_eq!(w.len(), 10_000);
    assert!(w.frozen.len() <= 21, "{} segments", w.frozen.len());
    assert!((0..10_000)
        .step_by(7)
        .all(|i| w.contains(ids(i, 1)[0]).unwrap()));
}

#[test]
fn many_small_chunks_become_one_entry() {
    let (dir, tree) = recent_ids();
    let mut w = Window::new(
        &std::env::temp_dir(),
        DEFAULT_DEDUP_MAX_AGE_MS,
        DEFAULT_DEDUP_MAX_IDS,
    );
    for c in 0..1000u64 {
        let chunk = ids(u128::from(c), 1);
        let k = keys::recent(5, c);
        tree.insert(k, encode(&chunk)).unwrap();
        w.insert(IVec::from(&k[..]), 5, &chunk, None, 5)
            .unwrap()
            .apply(&tree)
            .unwrap();
    }
    assert!(tree.len() <= MAX_ENTRIES_PER_SEGMENT + 1, "{}", tree.len());
    let back = load(&dir, &tree, 5);
    assert_eq!(back.len(), 1000);
    assert!((0..1000).all(|c| back.contains(ids(c, 1)[0]).unwrap()));
}

#[test]
fn block_ranges_round_trip_and_are_told_apart_from_uuids() {
    let ranges = [(0, 3), (7, 8), (u64::MAX - 1, u64::MAX)];
    let bytes = encode_ranges(&ranges);
    assert_eq!(decode_ranges(&bytes).unwrap(), ranges);
    assert_eq!(decode_ranges(&bytes[..bytes.len() - 1]), None);
    // A uuids value never reads as ranges, even of a project whose first byte is the tag.
    for n in 0..40 {
        let uuids = encode(&(0..n).map(|i| (0xB2, i)).collect::<Vec<_>>());
        assert_eq!(decode_ranges(&uuids), None, "{n} uuids");
    }
}

/// Entries naming blocks combine into one naming every block, the runs that meet
/// joined; the window reloads from it through the blocks' uuids.
#[test]
fn entries_naming_blocks_combine_into_one_naming_them_all() {
    let (dir, tree) = recent_ids();
    let mut w = Window::new(
        &std::env::temp_dir(),
        DEFAULT_DEDUP_MAX_AGE_MS,
        DEFAULT_DEDUP_MAX_IDS,
    );
    let block_ids = |b: u64| ids(u128::from(b) * 3, 3);
    let mut stored = Vec::new();
    for c in 0..1000u64 {
        // Chunks of two blocks, one block skipped every hundred chunks.
        let first = 2 * c + c / 100;
        let ranges = [(first, first + 2)];
        let chunk: Vec<Id> = (first..first + 2).flat_map(block_ids).collect();
        stored.extend(first..first + 2);
        let k = keys::recent(5, first);
        tree.insert(k, encode_ranges(&ranges)).unwrap();
        w.insert(IVec::from(&k[..]), 5, &chunk, Some(&ranges), 5)
            .unwrap()
            .apply(&tree)
            .unwrap();
    }
    assert!(tree.len() <= MAX_ENTRIES_PER_SEGMENT + 1, "{}", tree.len());
    let combined = tree
        .iter()
        .map(|e| decode_ranges(&e.unwrap().1).unwrap().len())
        .max()
        .unwrap();
    // Ten runs at most: one more than the blocks skipped.
    assert!(combined <= 10, "runs that meet are joined: {combined}");
    let back = Window::load(
        &tree,
        &dir.path().join(DIR_NAME),
        DEFAULT_DEDUP_MAX_AGE_MS,
        DEFAULT_DEDUP_MAX_IDS,
        5,
        |r| {
            Ok(r.iter()
                .flat_map(|&(a, b)| a..b)
                .map(|b| (b, block_ids(b)))
                .collect())
        },
    )
    .unwrap();
    assert_eq!(back.len(), 6000);
    assert!(stored
        .iter()
        .all(|&b| back.contains(block_ids(b)[1]).unwrap()));
}

/// Random (v4-like) uuids: every segment's range holds them, so only the table tells.
fn scrambled(from: u128, n: u128) -> Vec<Id> {
    (from..from + n)
        .map(|i| {
            let x = i.wrapping_mul(0x2545_f491_4f6c_dd1d_9e37_79b9_7f4a_7c15) ^ (i << 67);
            (1 + (i % 3) as u64, x.rotate_left(41))
        })
        .collect()
}

#[test]
fn random_uuids_are_found_in_any_segment_until_it_is_dropped() {
    let n = SEGMENT_IDS as u128;
    let mut w = Window::new(
        &std::env::temp_dir(),
        DEFAULT_DEDUP_MAX_AGE_MS,
        4 * SEGMENT_IDS,
    );
    for c in 0..8u128 {
        w.insert(key(c as u64), 0, &scrambled(c * n, n), None, 0)
            .unwrap();
    }
    // Eight segments in, the oldest dropped once the rest hold the count.
    assert_eq!(w.len(), 4 * SEGMENT_IDS);
    assert_eq!(
        w.table.len(),
        w.frozen_len,
        "the table holds the frozen uuids"
    );
    let kept = 8 * n - 4 * n;
    for i in (0..8 * n).step_by(61) {
        let id = scrambled(i, 1)[0];
        assert_eq!(w.contains(id).unwrap(), i >= kept, "uuid {i}");
        // The same uuid in another project, and a neighbour, were never stored.
        assert!(!w.contains((id.0 + 3, id.1)).unwrap(), "uuid {i}");
        assert!(!w.contains((id.0, id.1 ^ 1)).unwrap(), "uuid {i}");
    }
    // A uuid stored again later (a duplicate the compactor did not catch) lives in two
    // segments; dropping the older keeps the newer's.
    let again = scrambled(7 * n, 1);
    w.insert(key(99), 0, &again, None, 0).unwrap();
    for c in 8..12u128 {
        w.insert(key(c as u64 + 100), 0, &scrambled(c * n, n), None, 0)
            .unwrap();
    }
    assert!(w.contains(again[0]).unwrap());
    assert_eq!(w.table.len(), w.frozen_len);
}

/// Uuids sharing a fingerprint are never one: with fingerprints of no bits every
/// probe's slot matches, and only the segments' full 16 bytes answer. The window
/// answers exactly as one with full fingerprints, and as the set of what was stored.
#[test]
fn uuids_sharing_a_fingerprint_are_not_taken_for_each_other() {
    let n = 4_000u128;
    let max = 4 * n as usize;
    let mut shared =
        Window::new(&std::env::temp_dir(), DEFAULT_DEDUP_MAX_AGE_MS, max).with_fingerprint_bits(0);
    assert_eq!(shared.table.fingerprint_bits(), 0);
    let mut full = Window::new(&std::env::temp_dir(), DEFAULT_DEDUP_MAX_AGE_MS, max);
    // Chunks two hours apart, so each is frozen into a segment of its own.
    for c in 0..6u128 {
        let chunk = scrambled(c * n, n);
        let at = c as i64 * 2 * HOUR;
        for w in [&mut shared, &mut full] {
            w.insert(key(c as u64), at, &chunk, None, at).unwrap();
        }
    }
    // The last chunk is in the hash set, the three before in segments, the oldest two
    // dropped by count.
    assert_eq!(shared.frozen.len(), 3);
    assert_eq!(shared.table.len(), shared.frozen_len);
    assert_eq!(
        shared.table.fingerprint_bits(),
        0,
        "kept through the rebuilds"
    );
    let window: std::collections::HashSet<Id> = scrambled(2 * n, 4 * n).into_iter().collect();
    for i in 0..6 * n {
        let id = scrambled(i, 1)[0];
        for probe in [
            id,
            (id.0, id.1 ^ 1),
            (id.0, id.1.wrapping_add(1)),
            (id.0 + 3, id.1),
        ] {
            let expected = window.contains(&probe);
            assert_eq!(
                shared.contains(probe).unwrap(),
                expected,
                "uuid {i}: {probe:?}"
            );
            assert_eq!(
                full.contains(probe).unwrap(),
                expected,
                "uuid {i}: {probe:?}"
            );
        }
    }
}

/// Segments frozen by age faster than they expire run out of the table's generations:
/// past the last, the newest segment takes the uuids in, and every one is still found.
#[test]
fn segments_past_the_generations_are_merged_into_the_newest() {
    let mut w = Window::new(
        &std::env::temp_dir(),
        DEFAULT_DEDUP_MAX_AGE_MS,
        DEFAULT_DEDUP_MAX_IDS,
    );
    let chunks = table::GENERATIONS as u128 + 40;
    for c in 0..chunks {
        // Arrivals two hours apart, the clock at zero: nothing expires.
        w.insert(
            key(c as u64),
            c as i64 * 2 * HOUR,
            &scrambled(c * 10, 10),
            None,
            0,
        )
        .unwrap();
    }
    assert_eq!(w.frozen.len(), table::GENERATIONS - 1);
    assert_eq!(w.len(), 10 * chunks as usize);
    assert_eq!(w.table.len(), w.frozen_len);
    for i in 0..10 * chunks {
        let id = scrambled(i, 1)[0];
        assert!(w.contains(id).unwrap(), "uuid {i}");
        assert!(!w.contains((id.0, id.1 ^ 1)).unwrap(), "uuid {i}");
    }
    // The merged segment holds its entries' keys, deleted with it.
    let newest = w.frozen.back().unwrap();
    assert_eq!(newest.keys.len(), 41);
    let removed = w
        .prune(chunks as i64 * 2 * HOUR + 2 * DEFAULT_DEDUP_MAX_AGE_MS)
        .unwrap();
    assert_eq!(removed.removals(), chunks as usize - 1);
    assert_eq!(w.len(), 10);
    assert_eq!(w.table.len(), 0);
}
