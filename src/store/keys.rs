//! Key layouts of the trees, part of the on-disk format. Every key starts with the
//! project id (big-endian) so each project's data is one contiguous range, and times
//! are encoded so byte order is time order.

use uuid::Uuid;

pub fn project(project: u64) -> [u8; 8] {
    project.to_be_bytes()
}

/// A signed time whose big-endian bytes sort in numeric order.
pub fn time(ms: i64) -> [u8; 8] {
    ((ms as u64) ^ (1 << 63)).to_be_bytes()
}

pub fn time_from(bytes: [u8; 8]) -> i64 {
    (u64::from_be_bytes(bytes) ^ (1 << 63)) as i64
}

/// An event's place in the read order: project, time, uuid. The read API's cursor.
pub fn event(project: u64, ts: i64, uuid: Uuid) -> [u8; 32] {
    let mut k = [0u8; 32];
    k[..8].copy_from_slice(&project.to_be_bytes());
    k[8..16].copy_from_slice(&time(ts));
    k[16..].copy_from_slice(uuid.as_bytes());
    k
}

/// The time and uuid back out of an event's place.
pub fn split_event(key: &[u8]) -> Option<(i64, Uuid)> {
    let ts: [u8; 8] = key.get(8..16)?.try_into().ok()?;
    let id: [u8; 16] = key.get(16..32)?.try_into().ok()?;
    Some((time_from(ts), Uuid::from_bytes(id)))
}

/// `events` range bound: the first block whose newest event is at or after `ts` in
/// `project`.
pub fn event_bound(project: u64, ts: i64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&project.to_be_bytes());
    k[8..].copy_from_slice(&time(ts));
    k
}

/// `events`: project, time of the block's newest event, block id (unique, from a
/// counter in `meta`).
pub fn block(project: u64, newest: i64, id: u64) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..16].copy_from_slice(&event_bound(project, newest));
    k[16..].copy_from_slice(&id.to_be_bytes());
    k
}

/// The project and newest time back out of an `events` key.
pub fn split_block(key: &[u8]) -> Option<(u64, i64)> {
    let project: [u8; 8] = key.get(..8)?.try_into().ok()?;
    let ts: [u8; 8] = key.get(8..16)?.try_into().ok()?;
    Some((u64::from_be_bytes(project), time_from(ts)))
}

/// The block id back out of an `events` key.
pub fn block_id(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.get(16..24)?.try_into().ok()?))
}

/// `recent_ids`: when a chunk was stored, then the chunk's first block id, so keys sort
/// by age.
pub fn recent(arrival: i64, id: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&time(arrival));
    k[8..].copy_from_slice(&id.to_be_bytes());
    k
}

/// `persons`: project, uuid.
pub fn with_uuid(project: u64, uuid: Uuid) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..8].copy_from_slice(&project.to_be_bytes());
    k[8..].copy_from_slice(uuid.as_bytes());
    k
}

/// `persons_first_seen`: project, first event's time inverted (newest first in key
/// order), person uuid.
pub fn first_seen(project: u64, created_at: i64, uuid: Uuid) -> [u8; 32] {
    let mut k = [0u8; 32];
    k[..8].copy_from_slice(&project.to_be_bytes());
    k[8..16].copy_from_slice(&(!u64::from_be_bytes(time(created_at))).to_be_bytes());
    k[16..].copy_from_slice(uuid.as_bytes());
    k
}

/// The time and uuid back out of a `persons_first_seen` key.
pub fn split_first_seen(key: &[u8]) -> Option<(i64, Uuid)> {
    let inverted: [u8; 8] = key.get(8..16)?.try_into().ok()?;
    let id: [u8; 16] = key.get(16..32)?.try_into().ok()?;
    let ts = time_from((!u64::from_be_bytes(inverted)).to_be_bytes());
    Some((ts, Uuid::from_bytes(id)))
}

/// `distinct_ids`: project, distinct id.
pub fn with_str(project: u64, s: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + s.len());
    k.extend_from_slice(&project.to_be_bytes());
    k.extend_from_slice(s.as_bytes());
    k
}

/// `groups`: project, group type index, group key.
pub fn group(project: u64, index: u8, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + key.len());
    k.extend_from_slice(&project.to_be_bytes());
    k.push(index);
    k.extend_from_slice(key.as_bytes());
    k
}

/// `group_types`: name to index under tag 0, index to name under tag 1.
pub fn group_type_by_name(project: u64, name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + name.len());
    k.extend_from_slice(&project.to_be_bytes());
    k.push(0);
    k.extend_from_slice(name.as_bytes());
    k
}

pub fn group_type_by_index(project: u64, index: u8) -> [u8; 10] {
    let mut k = [0u8; 10];
    k[..8].copy_from_slice(&project.to_be_bytes());
    k[8] = 1;
    k[9] = index;
    k
}

/// In `meta`: the last log entry the compactor applied (u64 big-endian).
pub const CHECKPOINT_KEY: &[u8] = b"compactor.applied_seq";
/// In `meta`: the next block id (u64 big-endian), advanced in each chunk's transaction.
pub const NEXT_BLOCK_KEY: &[u8] = b"events.next_block";
/// Written (empty) and flushed after the database is reopened, to prove it writes.
pub const PROBE_KEY: &[u8] = b"store.write_probe";

/// The log's keys: sequence numbers that sort in arrival order.
pub fn seq(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_order_is_byte_order() {
        let times = [i64::MIN, -1_000, -1, 0, 1, 1_700_000_000_000, i64::MAX];
        for w in times.windows(2) {
            assert!(time(w[0]) < time(w[1]), "{} < {}", w[0], w[1]);
        }
        for t in times {
            assert_eq!(time_from(time(t)), t);
        }
    }

    #[test]
    fn event_keys_sort_by_project_then_time() {
        let u = Uuid::nil();
        assert!(event(1, i64::MAX, u) < event(2, i64::MIN, u));
        assert!(event(1, 5, u) < event(1, 6, u));
        assert!(event_bound(1, 5).as_slice() <= event(1, 5, u).as_slice());
        assert!(event_bound(1, 6).as_slice() > event(1, 5, Uuid::max()).as_slice());
        let id = Uuid::now_v7();
        assert_eq!(split_event(&event(3, -7, id)), Some((-7, id)));
    }

    #[test]
    fn block_keys_sort_by_project_then_newest_time() {
        assert!(block(1, i64::MAX, u64::MAX) < block(2, i64::MIN, 0));
        assert!(block(1, 5, u64::MAX) < block(1, 6, 0));
        assert!(event_bound(1, 5).as_slice() <= block(1, 5, 0).as_slice());
        assert!(event_bound(1, 6).as_slice() > block(1, 5, u64::MAX).as_slice());
        assert_eq!(split_block(&block(3, -7, 9)), Some((3, -7)));
        assert!(recent(5, u64::MAX) < recent(6, 0));
    }

    #[test]
    fn first_seen_keys_sort_by_project_then_newest_first() {
        let (a, b) = (Uuid::nil(), Uuid::max());
        assert!(first_seen(1, i64::MIN, b) < first_seen(2, i64::MAX, a));
        assert!(first_seen(1, 6, b) < first_seen(1, 5, a));
        assert!(first_seen(1, 1, b) < first_seen(1, -1, a));
        assert!(first_seen(1, 5, a) < first_seen(1, 5, b));
        assert_eq!(split_first_seen(&first_seen(3, -7, b)), Some((-7, b)));
        assert_eq!(
            split_first_seen(&first_seen(3, 1_700_000_000_000, a)),
            Some((1_700_000_000_000, a))
        );
    }
}
