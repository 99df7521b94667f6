//! Retention and the outbox: event blocks its readers (the ClickHouse sink, edge
//! mode's forwarder) have not passed on yet are kept past the retention period, so an outage never loses events
//! that retention would otherwise delete first. Up to a cap: once more than
//! [`MAX_HELD_EVENTS`] events wait in the outbox, retention deletes as usual and says
//! so loudly, and the sink counts each block it then misses
//! (`flagpost_sink_missing_blocks_total`).
//!
//! Block ids grow with every chunk, and the outbox is in chunk order, so the blocks
//! still to send are those from the first one the outbox names on; while a backfill
//! runs, every block is.

use serde::Deserialize;

use super::Outbox;

/// Unsent events beyond which retention no longer waits for the sink: about a day at
/// 200 events/s sustained, some gigabytes of blocks, bounding the disk an outage can
/// take.
pub const MAX_HELD_EVENTS: u64 = 20_000_000;

/// The lowest block id retention must keep (it keeps every block with this id or
/// above), or None if the outbox holds nothing back.
pub fn keep_from(outbox: &sled::Tree) -> sled::Result<Option<u64>> {
    let outbox = Outbox::from_tree(outbox.clone());
    // Only the sink backfills; without it (edge mode alone) nothing is held for one.
    let backfilling = outbox.sink_reads()?
        && match outbox.backfill()? {
            Some(v) => !backfill_done(&v),
            // The sink has not started yet: it will backfill everything there is.
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

/// The backfill's progress as the sink's `backfill::Progress` stores it under the
/// outbox's backfill key, read here only for its phase (`"Done"` once every block it
/// sends was sent). The other fields are checked as that type checks them, so a
/// progress the sink could not read is one retention waits for; the sink's tests pin
/// the two shapes together.
#[derive(Deserialize)]
#[allow(dead_code)]
struct Backfill {
    phase: Phase,
    after: Option<Vec<u8>>,
    below_block: u64,
    #[serde(default)]
    from_block: u64,
    rows: u64,
}

/// The phases of the sink's `backfill::Phase`, decoded by the same derive, so every
/// form serde takes for one (`"Done"`, `{"Done": null}`) reads the same here.
#[derive(Deserialize, PartialEq)]
enum Phase {
    Persons,
    DistinctIds,
    Groups,
    Events,
    Done,
}

/// Whether the stored backfill progress `state` says it is done; one that does not
/// decode is taken as still running.
pub fn backfill_done(state: &[u8]) -> bool {
    serde_json::from_slice::<Backfill>(state).is_ok_and(|b| b.phase == Phase::Done)
}

/// Whether retention keeps the block at `key` for the outbox's reader.
pub fn held(key: &[u8], keep_from: Option<u64>) -> bool {
    match (keep_from, block_id(key)) {
        (Some(from), Some(id)) => id >= from,
        _ => false,
    }
}

fn block_id(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.get(16..24)?.try_into().ok()?))
}
