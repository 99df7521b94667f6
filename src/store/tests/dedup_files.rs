//! The frozen segments' uuids on disk ([`segment`]): read back exactly, found across
//! the blocks of the sparse index, and a file damaged behind the window's back is an
//! error for every lookup that reads it, never an answer.

use super::segment::Segment;
use super::*;
use crate::config::DEFAULT_DEDUP_MAX_AGE_MS;

/// `n` uuids of each of `projects`, scattered, sorted as a segment holds them.
fn sorted(projects: &[(u64, u128)]) -> Vec<Id> {
    let mut all: Vec<Id> = projects
        .iter()
        .flat_map(|&(p, n)| {
            (0..n).map(move |i| {
                (
                    p,
                    (i * 2 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835),
                )
            })
        })
        .collect();
    all.sort_unstable();
    all
}

fn files_in(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

#[test]
fn a_segment_reads_back_and_finds_every_uuid_across_its_blocks() {
    let dir = tempfile::tempdir().unwrap();
    // Projects of 1, 300 and 700 uuids: ranges that start and end inside blocks.
    let ids = sorted(&[(1, 1), (2, 300), (7, 700)]);
    let s = Segment::write(dir.path(), &ids).unwrap();
    assert_eq!(s.len(), 1001);
    assert_eq!(files_in(dir.path()), 0, "the file is unlinked once made");
    assert!(s.bytes() < s.len(), "{} bytes in memory", s.bytes());
    let mut back = Vec::new();
    s.for_each(|id| back.push(id)).unwrap();
    assert_eq!(back, ids);
    let held: std::collections::HashSet<Id> = ids.iter().copied().collect();
    for &(p, id) in &ids {
        assert!(s.contains((p, id)).unwrap(), "{p} {id:x}");
        for probe in [(p, id ^ 1), (p, id.wrapping_add(2)), (p + 1, id), (3, id)] {
            assert_eq!(
                s.contains(probe).unwrap(),
                held.contains(&probe),
                "{probe:?}"
            );
        }
    }
    let bounds: Vec<u64> = s
        .bounds()
        .map(|(p, lo, hi)| {
            assert!(lo <= hi);
            p
        })
        .collect();
    assert_eq!(bounds, [1, 2, 7]);
}

#[test]
fn a_damaged_segment_is_an_error_never_an_answer() {
    let dir = tempfile::tempdir().unwrap();
    let ids = sorted(&[(1, 1000)]);
    let s = Segment::write(dir.path(), &ids).unwrap();
    // One byte of the second block (uuids 256 to 511) changed.
    s.damage(256 * 16 + 5, &[0xa5]).unwrap();
    for (i, &id) in ids.iter().enumerate() {
        match s.contains(id) {
            Ok(found) => assert!(found && !(256..512).contains(&i), "uuid {i}: {found}"),
            Err(e) => {
                assert!((256..512).contains(&i), "uuid {i}: {e}");
                assert_eq!(e.kind(), io::ErrorKind::InvalidData);
                assert!(e.to_string().contains("checksum"), "{e}");
            }
        }
    }
    assert!(
        s.for_each(|_| {}).is_err(),
        "reading it all meets the damage"
    );
    // Cut short: the last block is missing, a lookup there is an error too.
    s.truncate(512 * 16).unwrap();
    assert!(s.contains(ids[999]).is_err());
    assert!(s.contains(ids[0]).unwrap());
}

/// A window's damaged segment: lookups that read it fail, those its bounds or
/// fingerprints answer do not read it, and dropping it (which reads it to clear its
/// fingerprints) fails too, so the caller loads the window again.
#[test]
fn a_window_with_a_damaged_segment_fails_what_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Window::new(dir.path(), DEFAULT_DEDUP_MAX_AGE_MS, 1000).with_fingerprint_bits(0);
    let chunk: Vec<Id> = (0..600).map(|i| (1, 1000 + i)).collect();
    w.insert(IVec::from(&keys::recent(0, 0)[..]), 0, &chunk, None, 0)
        .unwrap();
    w.freeze().unwrap();
    assert_eq!(w.frozen.len(), 1);
    assert_eq!(files_in(dir.path()), 0);
    w.frozen[0].ids.damage(0, &[0xff; 16]).unwrap();
    // Every slot matches a fingerprint of no bits: a uuid within the bounds reads.
    assert!(w.contains((1, 1000)).is_err());
    assert!(w.contains((1, 1001)).is_err());
    // Above every frozen uuid, or of another project: answered without a read.
    assert!(!w.contains((1, 5000)).unwrap());
    assert!(!w.contains((2, 1000)).unwrap());
    assert!(w.prune(2 * DEFAULT_DEDUP_MAX_AGE_MS).is_err());
}

/// A load empties the directory of files an earlier process left (one killed between
/// making a file and unlinking it), and makes the directory if missing.
#[test]
fn a_load_starts_from_an_empty_directory() {
    let db_dir = tempfile::tempdir().unwrap();
    let db = sled::open(db_dir.path()).unwrap();
    let tree = db.open_tree("recent_ids").unwrap();
    tree.insert(keys::recent(5, 1), encode(&[(1, 7)])).unwrap();
    let dir = db_dir.path().join(DIR_NAME);
    let no_blocks = |_: &[(u64, u64)]| Ok(Default::default());
    let w = Window::load(&tree, &dir, DEFAULT_DEDUP_MAX_AGE_MS, 10, 5, no_blocks).unwrap();
    assert!(w.contains((1, 7)).unwrap());
    std::fs::write(dir.join("4242-0.seg"), b"left by a crash").unwrap();
    let w = Window::load(&tree, &dir, DEFAULT_DEDUP_MAX_AGE_MS, 10, 5, no_blocks).unwrap();
    assert!(w.contains((1, 7)).unwrap());
    assert_eq!(files_in(&dir), 0);
}
