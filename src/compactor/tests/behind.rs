//! The larger chunks read while the compactor is behind: applied in order and once,
//! and nothing of one committed when it fails.

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
fn a_compactor_behind_takes_larger_chunks_in_order_and_once() {
    let mut f = fixture(Compaction::default());
    f.push(&pageviews());
    // Entries of three records: the first entry's number.
    let start = f.log.next_seq() - (RECORDS as u64).div_ceil(3);
    let first = f.compactor.step().unwrap();
    // Thousands of entries waiting: more than a realtime chunk, of whole entries.
    assert!(first.realtime > 1024, "{} records", first.realtime);
    assert_eq!(first.realtime % 3, 0);
    let last = start + first.realtime as u64 / 3 - 1;
    assert_eq!(checkpoint(&f), Some(last));
    f.drain();
    assert!(f.log_empty());
    assert_stored_once(&f);
    assert_eq!(
        f.compactor.stats.applied.load(Ordering::Relaxed),
        RECORDS as u64
    );
}

#[test]
fn a_failed_larger_chunk_commits_nothing_and_is_read_again() {
    let mut f = fixture(Compaction::default());
    f.push(&pageviews());
    f.compactor.step().unwrap();
    let (applied, stored) = (checkpoint(&f), f.events(1).len());
    f.trees.blocks.syncs().fail(FILE_SYNC, 0);
    assert!(f.compactor.step().is_err());
    assert_eq!(
        checkpoint(&f),
        applied,
        "nothing of the failed chunk committed"
    );
    assert_eq!(f.events(1).len(), stored);
    f.drain();
    assert!(f.log_empty());
    assert_stored_once(&f);
}
