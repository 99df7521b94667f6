//! The version of the person and distinct-id rows an outbox entry sends, from the
//! commit's clock: `at` (ms) × [`VERSION_STEP`] plus a number from the node's id, and
//! always above the previous entry's. So on one node the newest state carries the
//! highest version, and when several nodes write the same derived person id into one
//! ClickHouse, the change committed last (by the nodes' clocks) wins everywhere.

use uuid::Uuid;

/// Versions per millisecond: room for [`tiebreak`]'s number below the clock, so two
/// nodes committing in the same millisecond still differ, and for up to 1,024
/// commits a millisecond on one node before its versions run ahead of its clock.
pub const VERSION_STEP: u64 = 1024;

/// The version of an entry committed at `at_ms` on node `node`, after `last`: the
/// clock's, unless the clock went back or the millisecond is full, then just above
/// `last`.
pub fn version(at_ms: i64, node: Option<Uuid>, last: Option<u64>) -> u64 {
    let clock = (at_ms.max(0) as u64)
        .saturating_mul(VERSION_STEP)
        .saturating_add(node.map_or(0, tiebreak));
    match last {
        Some(last) if last.saturating_add(VERSION_STEP) > clock => {
            last.saturating_add(VERSION_STEP)
        }
        _ => clock,
    }
}

/// A number below [`VERSION_STEP`] from a node's id: two nodes committing the same
/// person in the same millisecond differ by it, the same way on every query.
pub(super) fn tiebreak(node: Uuid) -> u64 {
    (node.as_u128() % VERSION_STEP as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_follow_the_clock_and_only_go_up() {
        let node = Uuid::from_u128(0xabc_0000 + 517);
        let v = version(1_700_000_000_000, Some(node), None);
        assert_eq!(v, 1_700_000_000_000 * VERSION_STEP + 517);
        // The same millisecond again, or a clock gone back: just above the last.
        assert_eq!(
            version(1_700_000_000_000, Some(node), Some(v)),
            v + VERSION_STEP
        );
        assert_eq!(
            version(1_600_000_000_000, Some(node), Some(v)),
            v + VERSION_STEP
        );
        // A later commit on another node wins over an earlier one here, whatever
        // either node's count of entries.
        let other = Uuid::from_u128(3);
        assert!(version(1_700_000_000_001, Some(other), None) > v);
        assert!(version(1_700_000_000_000, Some(other), None) < v);
    }
}
