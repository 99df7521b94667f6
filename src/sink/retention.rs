//! Retention and the sink: event blocks ClickHouse has not received yet are kept
//! past the retention period, so an outage never loses events that retention would
//! otherwise delete first. Up to a cap: once more than [`MAX_HELD_EVENTS`] events wait
//! in the outbox, retention deletes as usual and says so loudly, and the worker counts
//! each block it then misses (`flagpost_sink_missing_blocks_total`).
//!
//! Block ids grow with every chunk, and the outbox is in chunk order, so the blocks
//! still to send are those from the first one the outbox names on; while a backfill
//! runs, every block is.

use super::backfill::{Phase, Progress};
use super::outbox::Outbox;

/// Unsent events beyond which retention no longer waits for the sink: about a day at
/// 200 events/s sustained, some gigabytes of blocks, bounding the disk an outage can
/// take.
pub const MAX_HELD_EVENTS: u64 = 20_000_000;

/// The lowest block id retention must keep (it keeps every block with this id or
/// above), or None if the sink holds nothing back.
pub fn keep_from(outbox: &sled::Tree) -> sled::Result<Option<u64>> {
    let outbox = Outbox::from_tree(outbox.clone());
    let backfilling = match outbox.backfill()? {
        Some(v) => serde_json::from_slice::<Progress>(&v).map_or(true, |p| p.phase != Phase::Done),
        // The worker has not started yet: it will backfill everything there is.
        None => true,
    };
    let mut held = 0u64;
    let mut first = None;
    for entry in outbox.entries(None)? {
        let committed = entry?.committed;
        held += committed.events;
        if first.is_none() {
            first = committed.blocks.first().and_then(|k| block_id(k));
        }
    }
    if held > MAX_HELD_EVENTS {
        tracing::error!(
            held,
            cap = MAX_HELD_EVENTS,
            "sink: too many events wait for ClickHouse; retention deletes the oldest of them"
        );
        return Ok(None);
    }
    Ok(if backfilling { Some(0) } else { first })
}

/// Whether retention keeps the block at `key` for the sink.
pub fn held(key: &[u8], keep_from: Option<u64>) -> bool {
    match (keep_from, block_id(key)) {
        (Some(from), Some(id)) => id >= from,
        _ => false,
    }
}

fn block_id(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.get(16..24)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::outbox::{record, Committed};
    use crate::store::keys;
    use sled::transaction::ConflictableTransactionError;

    #[test]
    fn holds_what_the_outbox_and_the_backfill_still_send() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path()).unwrap();
        let outbox = Outbox::open(&db).unwrap();
        let tree = outbox.tree().clone();
        // No worker yet: everything waits for the backfill.
        assert_eq!(keep_from(&tree).unwrap(), Some(0));
        let done = Progress {
            phase: Phase::Done,
            after: None,
            below_block: 0,
            from_block: 0,
            rows: 0,
        };
        done.save(&outbox).unwrap();
        assert_eq!(keep_from(&tree).unwrap(), None, "all sent");
        let chunk = |id: u64, events: u64| Committed {
            at: 1,
            blocks: vec![keys::block(1, 5, id).to_vec()],
            events,
            ..Committed::default()
        };
        for c in [chunk(7, 10), chunk(9, 10)] {
            tree.transaction(|tx| Ok::<_, ConflictableTransactionError<()>>(record(tx, &c)?))
                .unwrap();
        }
        assert_eq!(keep_from(&tree).unwrap(), Some(7));
        assert!(held(&keys::block(1, 0, 7), Some(7)));
        assert!(!held(&keys::block(1, 0, 6), Some(7)));
        assert!(!held(&keys::block(1, 0, 6), None));
        let huge = chunk(11, MAX_HELD_EVENTS);
        tree.transaction(|tx| Ok::<_, ConflictableTransactionError<()>>(record(tx, &huge)?))
            .unwrap();
        assert_eq!(keep_from(&tree).unwrap(), None, "past the cap");
    }
}
