//! A batch is handed to the worker to send only after a sync that followed its
//! reading returned ([`ready`]): rows read from a chunk sled has not yet written out
//! would, after a crash, be persons that never were. A failing sync hands nothing
//! over and moves nothing: the entries, the checkpoint and the batch in flight stay,
//! and the next pass sends the same batch. The backfill's runs are held the same way.

use sled::transaction::ConflictableTransactionError;
use uuid::Uuid;

use super::*;
use crate::store::outbox::{record, Committed};

/// A store whose outbox holds `n` entries, each a person and a link.
fn store(n: u64) -> (tempfile::TempDir, crate::store::Trees, Outbox) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path().join("db")).unwrap();
    let trees = crate::store::Trees::open(&db, dir.path()).unwrap();
    let outbox = Outbox::from_tree(trees.outbox.clone());
    for i in 0..n {
        let c = Committed {
            at: 1_000,
            persons: vec![(1, Uuid::from_u128(u128::from(i) + 1))],
            linked: vec![(1, format!("d{i}"))],
            ..Committed::default()
        };
        let tree = outbox.tree();
        tree.transaction(|tx| Ok::<_, ConflictableTransactionError<()>>(record(tx, &c)?))
            .unwrap();
    }
    (dir, trees, outbox)
}

/// The outbox's entries, checkpoint and batch in flight.
fn progress(outbox: &Outbox) -> (Vec<u64>, u64, Option<(u64, u64)>) {
    let seqs = outbox.entries(None).unwrap().map(|e| e.unwrap().seq);
    (
        seqs.collect(),
        outbox.checkpoint().unwrap(),
        outbox.in_flight().unwrap(),
    )
}

#[test]
fn a_batch_is_ready_only_after_a_sync_that_followed_its_reading() {
    let (_dir, trees, outbox) = store(3);
    let sources = Sources::of(&trees);
    let young = ready(&outbox, &sources, 0, 100, Shape::Current).unwrap();
    assert!(young.is_none(), "young and small: it waits");
    assert_eq!(
        sources.syncs().count(SEND_SYNC),
        0,
        "nothing read, nothing synced"
    );
    // Two rows an entry: two entries reach four rows.
    let batch = ready(&outbox, &sources, 5_000, 4, Shape::Current).unwrap();
    let batch = batch.expect("a batch");
    assert_eq!((batch.first, batch.last, batch.rows()), (1, 2, 4));
    assert_eq!(sources.syncs().count(SEND_SYNC), 1);
    // Sent and acknowledged: the next batch has a sync of its own.
    outbox.acknowledge(batch.first, batch.last).unwrap();
    let batch = ready(&outbox, &sources, 5_000, 4, Shape::Current).unwrap();
    let batch = batch.expect("a batch");
    assert_eq!((batch.first, batch.last, batch.rows()), (3, 3, 2));
    assert_eq!(sources.syncs().count(SEND_SYNC), 2);
}

#[test]
fn a_failed_sync_hands_nothing_over_and_the_same_batch_comes_next() {
    let (_dir, trees, outbox) = store(3);
    let sources = Sources::of(&trees);
    sources.syncs().fail(SEND_SYNC, 0);
    let failed = ready(&outbox, &sources, 5_000, 4, Shape::Current);
    assert!(failed.is_err(), "{:?}", failed.map(|b| b.map(|b| b.rows())));
    // Fixed before reading, and nothing acknowledged.
    assert_eq!(progress(&outbox), (vec![1, 2, 3], 0, Some((1, 2))));
    assert_eq!(sources.syncs().count(SEND_SYNC), 0);
    // However many rows a batch may now take, the same one comes, whole.
    let batch = ready(&outbox, &sources, 9_000, 100, Shape::Current).unwrap();
    let batch = batch.expect("the same batch");
    assert_eq!((batch.first, batch.last, batch.rows()), (1, 2, 4));
    assert_eq!(sources.syncs().count(SEND_SYNC), 1);
}

/// The backfill's runs the same way: handed over only after a sync, and a failed
/// sync moves its stored progress nowhere.
#[test]
fn a_backfill_run_is_ready_only_after_a_sync() {
    use crate::sink::backfill::{self, Progress};
    let (_dir, trees, outbox) = store(0);
    let sources = Sources::of(&trees);
    let from = Progress::resume(&outbox, &sources).unwrap();
    assert!(!from.is_done());
    let stored = outbox.backfill().unwrap();
    sources.syncs().fail(SEND_SYNC, 0);
    assert!(backfill::ready(&sources, &from, Shape::Current).is_err());
    assert_eq!(sources.syncs().count(SEND_SYNC), 0);
    assert_eq!(outbox.backfill().unwrap(), stored);
    let step = backfill::ready(&sources, &from, Shape::Current).unwrap();
    assert_eq!(sources.syncs().count(SEND_SYNC), 1);
    assert_ne!(step.then, from, "the run moves the backfill on once sent");
    assert_eq!(
        outbox.backfill().unwrap(),
        stored,
        "saved only after the insert"
    );
}
