//! The log's next chunk read while the current one's blocks are made, and the larger
//! chunks read while the compactor is behind: applied in order and once, also when the
//! commit it was read beside fails.

use super::*;
use crate::store::block::files::FILE_SYNC;

/// More records than two chunks read while behind, each of its own person.
const RECORDS: i64 = 10_000;

fn pageviews() -> Vec<Record> {
    (0..RECORDS)
        .map(|i| {
            let who = format!("user-{i}");
            record(
                1,
                i,
                json!({"event": "$pageview", "distinct_id": who, "properties": {"n": i}}),
            )
        })
        .collect()
}

/// Each stored event's `n`, sorted, against every record's: none lost, none twice.
fn assert_stored_once(f: &Fixture) {
    let mut stored: Vec<i64> = f
        .events(1)
        .iter()
        .map(|e| e.properties["n"].as_i64().unwrap())
        .collect();
    stored.sort_unstable();
    assert_eq!(stored, (0..RECORDS).collect::<Vec<_>>());
}

fn checkpoint(f: &Fixture) -> Option<u64> {
    let value = f.trees.meta.get(CHECKPOINT_KEY).unwrap()?;
    keys::seq(&value)
}

#[test]
fn the_chunk_read_ahead_is_applied_next_in_order() {
    let mut f = fixture(Compaction::default());
    f.push(&pageviews());
    let first = f.compactor.step().unwrap();
    // Behind by thousands of entries: a larger chunk than the realtime one.
    assert!(first.realtime > 1024, "{} records", first.realtime);
    let applied = checkpoint(&f).unwrap();
    let ahead = f
        .compactor
        .ahead
        .as_ref()
        .expect("the next chunk was read ahead");
    assert_eq!(ahead.first_seq, Some(applied + 1));
    f.drain();
    assert!(f.log_empty());
    assert!(f.compactor.ahead.is_none());
    assert_stored_once(&f);
    assert_eq!(
        f.compactor.stats.applied.load(Ordering::Relaxed),
        RECORDS as u64
    );
}

#[test]
fn a_failed_commit_drops_the_chunk_read_beside_it_and_both_are_read_again() {
    let mut f = fixture(Compaction::default());
    f.push(&pageviews());
    f.compactor.step().unwrap();
    let applied = checkpoint(&f);
    // The next chunk's blocks fail to sync, after the one after it was read ahead.
    f.trees.blocks.syncs().fail(FILE_SYNC, 0);
    assert!(f.compactor.step().is_err());
    assert!(f.compactor.ahead.is_none());
    assert_eq!(
        checkpoint(&f),
        applied,
        "nothing of the failed chunk committed"
    );
    f.drain();
    assert!(f.log_empty());
    assert_stored_once(&f);
}

#[test]
fn a_restart_with_a_chunk_read_ahead_reads_it_again() {
    let mut f = fixture(Compaction::default());
    f.push(&pageviews());
    f.compactor.step().unwrap();
    assert!(f.compactor.ahead.is_some());
    f.restart();
    f.drain();
    assert!(f.log_empty());
    assert_stored_once(&f);
}
