//! Spike detection: a token bucket per (project, distinct id). Events beyond it go to
//! the overflow lane, which is processed at lower priority, so one runaway client
//! cannot delay everyone else's events. Nothing is ever dropped.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// Buckets kept in memory; past this, the idle ones (full again) are forgotten.
const MAX_BUCKETS: usize = 100_000;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    /// Unix milliseconds of the last refill.
    at: i64,
}

pub struct Limiter {
    rate_per_ms: f64,
    burst: f64,
    /// Keyed by project and a 64-bit hash of the distinct id: no string per bucket to
    /// allocate on every event or to keep scattered across the heap. Two ids sharing a
    /// hash (about one chance in 2^64 per pair) would share a bucket.
    buckets: HashMap<(u64, u64), Bucket>,
}

/// The distinct id's bucket hash: SipHash with fixed keys, so it is the same after a
/// restart and routing on replay does not change.
fn id_hash(distinct_id: &str) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    distinct_id.hash(&mut h);
    h.finish()
}

impl Limiter {
    pub fn new(rate_per_second: f64, burst: f64) -> Limiter {
        Limiter {
            rate_per_ms: rate_per_second.max(0.0) / 1000.0,
            burst: burst.max(1.0),
            buckets: HashMap::new(),
        }
    }

    /// Take a token for an event received at `now` (unix ms); false means overflow.
    /// Time comes from the event's arrival, so replaying the log after a restart
    /// routes events the same way.
    pub fn allow(&mut self, project: u64, distinct_id: &str, now: i64) -> bool {
        if self.buckets.len() >= MAX_BUCKETS {
            self.forget_idle(now);
        }
        let (rate, burst) = (self.rate_per_ms, self.burst);
        let bucket = self
            .buckets
            .entry((project, id_hash(distinct_id)))
            .or_insert(Bucket {
                tokens: burst,
                at: now,
            });
        let elapsed = (now - bucket.at).max(0) as f64;
        bucket.tokens = (bucket.tokens + elapsed * rate).min(burst);
        bucket.at = bucket.at.max(now);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn forget_idle(&mut self, now: i64) {
        let (rate, burst) = (self.rate_per_ms, self.burst);
        self.buckets
            .retain(|_, b| b.tokens + (now - b.at).max(0) as f64 * rate < burst);
        if self.buckets.len() >= MAX_BUCKETS {
            // Every bucket is busy: start over rather than grow without bound.
            self.buckets.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_rate() {
        let mut l = Limiter::new(10.0, 5.0);
        let allowed = (0..8).filter(|_| l.allow(1, "a", 1000)).count();
        assert_eq!(allowed, 5);
        // Another id and another project have their own buckets.
        assert!(l.allow(1, "b", 1000));
        assert!(l.allow(2, "a", 1000));
        // 10/s: one token back after 100 ms, not before.
        assert!(!l.allow(1, "a", 1099));
        assert!(l.allow(1, "a", 1100));
        assert!(!l.allow(1, "a", 1100));
        // Never more than the burst, however long it was idle.
        let later = (0..10).filter(|_| l.allow(1, "a", 1_000_000)).count();
        assert_eq!(later, 5);
        // Time going backwards (replayed events) never adds tokens.
        assert!(!l.allow(1, "a", 0));
    }

    #[test]
    fn bounded_memory() {
        let mut l = Limiter::new(100.0, 1000.0);
        for i in 0..(MAX_BUCKETS + 10) {
            l.allow(1, &i.to_string(), 0);
        }
        assert!(l.buckets.len() <= MAX_BUCKETS);
    }
}
