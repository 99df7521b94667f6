//! How the hash set's chunks are kept in `recent_ids`: each chunk's own entry until
//! there are more than [`MAX_ENTRIES_PER_SEGMENT`], then all of them rewritten as one,
//! and again each time as many more have come. Rewriting on every chunk would keep the
//! tree as small but write the whole hash set again for each chunk stored.

use super::*;
use crate::config::{DEFAULT_DEDUP_MAX_AGE_MS, DEFAULT_DEDUP_MAX_IDS};

/// The ids in `recent_ids`, read back from every entry.
fn stored(tree: &sled::Tree) -> Vec<Id> {
    let mut all: Vec<Id> = tree
        .iter()
        .flat_map(|e| decode(&e.unwrap().1).unwrap())
        .collect();
    all.sort_unstable();
    all
}

#[test]
fn chunk_entries_are_rewritten_as_one_only_past_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let tree = db.open_tree("recent_ids").unwrap();
    let mut w = Window::new(
        &std::env::temp_dir(),
        DEFAULT_DEDUP_MAX_AGE_MS,
        DEFAULT_DEDUP_MAX_IDS,
    );
    let id = |c: usize| (1, c as u128 + 1);
    // Store chunk `c` as the compactor does, and apply what the window asks;
    // returns how many entries that removed.
    let mut store = |c: usize| {
        let k = keys::recent(5, c as u64);
        tree.insert(k, encode(&[id(c)])).unwrap();
        let rewrite = w.insert(IVec::from(&k[..]), 5, &[id(c)], None, 5).unwrap();
        let removals = rewrite.removals();
        rewrite.apply(&tree).unwrap();
        removals
    };
    let limit = MAX_ENTRIES_PER_SEGMENT;
    for c in 0..limit {
        assert_eq!(store(c), 0, "chunk {c} keeps its own entry");
    }
    assert_eq!(tree.len(), limit);
    // One more: every entry so far and its own become one.
    assert_eq!(store(limit), limit + 1);
    assert_eq!(tree.len(), 1);
    let all: Vec<Id> = (0..=limit).map(id).collect();
    assert_eq!(stored(&tree), all);
    // The combined entry counts as one: as many more chunks as the limit allows keep
    // their own entries, the next rewrites all of them again.
    for c in limit + 1..2 * limit {
        assert_eq!(store(c), 0, "chunk {c} keeps its own entry");
    }
    assert_eq!(tree.len(), limit);
    assert_eq!(store(2 * limit), limit + 1);
    assert_eq!(tree.len(), 1);
    let all: Vec<Id> = (0..=2 * limit).map(id).collect();
    assert_eq!(stored(&tree), all);
    assert!(all.iter().all(|&i| w.contains(i).unwrap()));
}
