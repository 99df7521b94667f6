//! The index by property's counts of holders, moved in the chunk's transaction.

use super::*;
use crate::store::by_property::count;

/// The counts of a [`Fixture`]'s index by property, and those a count of its persons
/// as stored makes.
fn counts(f: &Fixture) -> (count::Counts, count::Counts) {
    let mut moves = count::Moves::default();
    for p in query::persons(&f.trees, 1, 100).unwrap() {
        moves.person(1, None, Some((p.created_at, &p.properties)));
    }
    (count::held(&f.trees.by_property), moves.totals())
}

/// The index's counts are written in the chunk's transaction: a chunk that fails at
/// any record, or that sled runs again, moves them as the persons it commits, once.
#[test]
fn the_index_counts_move_with_the_chunk_alone() {
    let mut records = story();
    let unset = json!({"event": "e", "distinct_id": "user-2", "properties": {"$unset": ["a"]}});
    records.push(record(1, records.len() as i64, unset));
    let mut clean = fixture(Compaction::default());
    clean.push(&records);
    clean.drain();
    let (want, fresh) = counts(&clean);
    assert_eq!(want, fresh);
    assert!(want.len() >= 3, "persons and keys counted: {want:?}");
    for fail_at in 0..records.len() {
        let mut f = fixture(Compaction::default());
        f.push(&records);
        f.compactor.fail_at = Some((Source::Log, fail_at));
        assert!(f.compactor.step().is_err(), "injected failure at {fail_at}");
        let (held, fresh) = counts(&f);
        assert_eq!(
            held, fresh,
            "fail at {fail_at}: only what committed is counted"
        );
        f.drain();
        assert_eq!(counts(&f).0, want, "fail at {fail_at}");
    }
    for conflict_at in [0, 2, 5] {
        let mut f = fixture(Compaction::default());
        f.push(&records);
        f.compactor.conflict_at = Some(conflict_at);
        f.drain();
        assert_eq!(counts(&f).0, want, "conflict at {conflict_at}");
    }
}
