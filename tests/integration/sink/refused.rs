//! The worker against a ClickHouse that fails inserts after the worker connected and
//! sent: the server answering an insert with an error (its `events` table renamed
//! away, after the batch's persons, links and groups went in) and the server gone
//! mid-run. Neither failed batch is acknowledged: the outbox keeps every entry, its
//! checkpoint and its batch in flight stay as they were, and once inserts work again
//! the same batch is sent whole and everything arrives once.

use flagpost::sink::worker::Pass;
use flagpost::sink::Table;

use super::worker::{assert_all_there, drain, store, worker, Store, CHUNKS};
use super::*;

/// What the outbox says about the sink's progress: entries left, the checkpoint, the
/// batch in flight.
fn progress(s: &Store) -> (usize, u64, Option<(u64, u64)>) {
    (
        s.outbox.entries(None).unwrap().count(),
        s.outbox.checkpoint().unwrap(),
        s.outbox.in_flight().unwrap(),
    )
}

#[test]
#[ignore = "needs clickhouse-server: run by .ci/run, cargo test -- --include-ignored"]
fn inserts_failing_after_the_worker_connected_acknowledge_nothing() {
    let mut ch = ClickHouse::start("sink_refused");
    let s = store();
    let mut w = worker(&ch, &s);
    // Connected, tables made, and a first pass sent (the backfill's first run).
    assert_eq!(
        block_on(w.step()).expect("first pass"),
        Pass::Sent { rows: 1 }
    );
    let before = progress(&s);
    assert_eq!(before, (CHUNKS as usize, 0, None));

    // ClickHouse up, the connection fine, but the last table of the batch refused.
    let db = &ch.database;
    assert_eq!(ch.query("SELECT count() FROM groups"), "0\n");
    ch.query(&format!("RENAME TABLE {db}.events TO {db}.events_away"));
    let failed = block_on(w.step());
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(w.stats().errors.get(), 1);
    assert_eq!(w.stats().rows_of(Table::Event), 0);
    // The batch was fixed before sending and stays so; nothing else moved.
    let (entries, checkpoint, in_flight) = progress(&s);
    assert_eq!((entries, checkpoint), (CHUNKS as usize, 0));
    assert_eq!(in_flight, Some((1, 3)));
    // The tables before `events` took their rows: only the acknowledgement is missing.
    assert_eq!(ch.query("SELECT count() FROM groups"), "1\n");
    ch.query(&format!("RENAME TABLE {db}.events_away TO {db}.events"));

    // The same batch, whole, now goes through (the backfill may take its turn first);
    // then the server dies mid-run.
    let mut passes = Vec::new();
    for _ in 0..4 {
        if progress(&s).2.is_none() {
            break;
        }
        passes.push(block_on(w.step()).expect("a pass"));
    }
    let whole = Pass::Sent {
        rows: 12_000 + 2 + 2 + 1,
    };
    assert!(passes.contains(&whole), "{passes:?}");
    let after_resend = progress(&s);
    assert_eq!(after_resend, (CHUNKS as usize - 3, 3, None));
    ch.stop();
    for _ in 0..2 {
        assert!(block_on(w.step()).is_err());
    }
    assert_eq!(w.stats().errors.get(), 3);
    assert_eq!(progress(&s).0, after_resend.0);
    assert_eq!(progress(&s).1, after_resend.1);
    ch.resume();
    drain(&mut w);
    assert_all_there(&ch, &s);
}
