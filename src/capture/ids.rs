//! Event ids for events sent without one: UUIDv7, the time in milliseconds and 74
//! random bits, as PostHog assigns them.
//!
//! `Uuid::now_v7` asks the kernel for fresh random bytes (a `getrandom` call) for every
//! id, which was about 3% of the server's time under batch load. The bits here come
//! from a per-thread SplitMix64 generator seeded from the kernel once: ids need to be
//! unique, not unpredictable, and SplitMix64 never repeats an output within 2^64 steps.
//!
//! Within one millisecond a thread counts up from its last id instead (RFC 9562's
//! monotonic random), so the events of one request keep their order: the read API
//! lists events of the same time by id.

use std::cell::Cell;

use uuid::Uuid;

thread_local! {
    static STATE: Cell<u64> = Cell::new(seed());
    /// The last id's millisecond and its 74 random bits.
    static LAST: Cell<(i64, u128)> = const { Cell::new((i64::MIN, 0)) };
}

const RANDOM_BITS: u32 = 74;

fn seed() -> u64 {
    let bytes = Uuid::new_v4().into_bytes();
    u64::from_le_bytes([
        bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[9], bytes[10],
    ])
}

fn next(state: &Cell<u64>) -> u64 {
    let s = state.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
    state.set(s);
    let mut z = s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A new UUIDv7 for `now_ms` (unix milliseconds), above the thread's last one if
/// that had the same millisecond.
pub fn new_v7(now_ms: i64) -> Uuid {
    let bits = LAST.with(|last| {
        let (ms, bits) = last.get();
        let bits = if ms == now_ms && bits + 1 < 1 << RANDOM_BITS {
            bits + 1
        } else {
            // Fresh bits, the top one clear, so counting up has room.
            let (a, b) = STATE.with(|s| (next(s), next(s)));
            ((u128::from(a) << 64) | u128::from(b)) & ((1 << (RANDOM_BITS - 1)) - 1)
        };
        last.set((now_ms, bits));
        bits
    });
    // rand_a (12 bits) then rand_b (62 bits); the builder sets version and variant.
    let rand_a = (bits >> 62) as u16;
    let rand_b = (bits & ((1 << 62) - 1)) as u64;
    let mut random = [0u8; 10];
    random[..2].copy_from_slice(&rand_a.to_be_bytes());
    random[2..].copy_from_slice(&rand_b.to_be_bytes());
    let ms = u64::try_from(now_ms).unwrap_or(0);
    uuid::Builder::from_unix_timestamp_millis(ms, &random).into_uuid()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_version_7_with_the_time_and_do_not_repeat() {
        let now = 1_700_000_000_123;
        let ids: std::collections::HashSet<Uuid> = (0..100_000).map(|_| new_v7(now)).collect();
        assert_eq!(ids.len(), 100_000);
        for id in ids.iter().take(10) {
            assert_eq!(id.get_version_num(), 7);
            assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
            let (secs, nanos) = id.get_timestamp().unwrap().to_unix();
            assert_eq!(secs * 1000 + u64::from(nanos) / 1_000_000, now as u64);
        }
        // Within a millisecond, one thread's ids only go up.
        let run: Vec<Uuid> = (0..1000).map(|_| new_v7(now + 1)).collect();
        assert!(run.windows(2).all(|w| w[0] < w[1]));
        // Another thread draws other ids.
        let other = std::thread::spawn(move || new_v7(now)).join().unwrap();
        assert!(!ids.contains(&other));
    }
}
