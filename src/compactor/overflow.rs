//! Spike detection: a token bucket per (project, distinct id). Events beyond it go to
//! the overflow lane, which is processed at lower priority, so one runaway client
//! cannot delay everyone else's events. Nothing is ever dropped.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

use crate::store::dedup::IdHasher;

/// Buckets kept in memory: a table of 32,768 slots, about 800 KiB, most of a core's
/// second-level cache here rather than several MiB of the shared one. Past this, the
/// buckets that are (nearly) full again are forgotten ([`SLACK`]). At a million
/// distinct ids, a map of 100,000 buckets cost the compactor a read from memory or two
/// per event, more than the rest of the event's check.
const MAX_BUCKETS: usize = 16_384;
/// When the map is full, a bucket this share of its burst or less from full is
/// forgotten: the id comes back with a full bucket, so it gains at most this share of
/// the burst each time the map fills. An id that sends faster keeps its bucket however
/// many others come and go.
const SLACK: f64 = 0.01;
/// At rest, a map with room for more buckets than this gives back what it can
/// ([`Limiter::rest`]).
const SMALL_MAP: usize = 1024;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    /// Unix milliseconds of the last refill.
    at: i64,
}

pub struct Limiter {
    rate_per_ms: f64,
    burst: f64,
    /// Keyed by a 64-bit hash of the project and the distinct id, with keys chosen at
    /// random when the limiter is made ([`Limiter::key`]): no string per bucket to
    /// allocate on every event or to keep scattered across the heap, and no way for a
    /// client to choose distinct ids that crowd one slot of the map, which only mixes
    /// the key's bits ([`IdHasher`], as the deduplication window's set of uuids does).
    /// Two ids sharing a key (about one chance in 2^64 per pair) would share a bucket.
    /// The map is empty after a restart, so the keys need not outlive the process.
    buckets: HashMap<u64, Bucket, BuildHasherDefault<IdHasher>>,
    hasher: foldhash::fast::RandomState,
    /// The latest arrival seen (unix ms): every bucket is full again once the burst
    /// has refilled since.
    latest: i64,
    /// When [`Limiter::rest`] last forgot the full buckets (clock ms).
    trimmed: i64,
}

impl Limiter {
    pub fn new(rate_per_second: f64, burst: f64) -> Limiter {
        Limiter {
            rate_per_ms: rate_per_second.max(0.0) / 1000.0,
            burst: burst.max(1.0),
            buckets: HashMap::default(),
            hasher: foldhash::fast::RandomState::default(),
            latest: i64::MIN,
            trimmed: i64::MIN,
        }
    }

    /// The bucket's key of a distinct id.
    pub fn key(&self, project: u64, distinct_id: &str) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write_u64(project);
        h.write(distinct_id.as_bytes());
        h.finish()
    }

    /// [`Limiter::take`] for a distinct id, as the tests ask.
    #[cfg(test)]
    pub fn allow(&mut self, project: u64, distinct_id: &str, now: i64) -> bool {
        let key = self.key(project, distinct_id);
        self.take(key, now)
    }

    /// Look the buckets of `keys` up, ahead of [`Limiter::take`] for each: lookups
    /// that do not wait on each other, so the processor fetches their memory at once,
    /// where the takes one after another each waited for theirs (at a million
    /// distinct ids a bucket is rarely in the cache). Returns how many there are.
    pub fn warm(&self, keys: &[u64]) -> usize {
        keys.iter().filter(|k| self.buckets.contains_key(k)).count()
    }

    /// Take a token for an event of the id of `key` ([`Limiter::key`]) received at
    /// `now` (unix ms); false means overflow. Time comes from the event's arrival, so
    /// replaying the log after a restart routes events the same way.
    pub fn take(&mut self, key: u64, now: i64) -> bool {
        if self.buckets.len() >= MAX_BUCKETS && !self.buckets.contains_key(&key) {
            self.forget_idle(now);
        }
        self.latest = self.latest.max(now);
        let (rate, burst) = (self.rate_per_ms, self.burst);
        let bucket = self.buckets.entry(key).or_insert(Bucket {
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

    /// Nothing to apply (`now` is the clock's): give back the map's memory. Once the
    /// burst has refilled since the latest arrival every bucket is full, as a new one
    /// starts, so the whole map goes (a comparison); before that, a map past
    /// [`SMALL_MAP`] forgets its full buckets and the room they took, at most once a
    /// refill (a pass over the map), so a spike of distinct ids does not keep its
    /// room while a few ids stay busy. Forgetting a full bucket changes no answer for
    /// the events that arrive after `now`.
    pub fn rest(&mut self, now: i64) {
        if self.buckets.capacity() == 0 {
            return;
        }
        // Infinite when the rate is 0: the buckets never refill.
        let refill_ms = self.burst / self.rate_per_ms;
        let since = |t: i64| now.saturating_sub(t) as f64;
        if since(self.latest) >= refill_ms {
            self.buckets = HashMap::default();
        } else if self.buckets.capacity() > SMALL_MAP && since(self.trimmed) >= refill_ms {
            self.trimmed = now;
            self.forget_full(now);
            self.buckets.shrink_to_fit();
        }
    }

    /// The bytes of the map's table: a slot (key and bucket) and a control byte for
    /// each of its buckets, which hold up to seven eighths of their number.
    pub fn footprint(&self) -> usize {
        let room = self.buckets.capacity();
        let slots = match room {
            0 => return 0,
            1..=7 => room + 1,
            _ => room / 7 * 8,
        };
        slots * (size_of::<(u64, Bucket)>() + 1) + 16
    }

    fn forget_full(&mut self, now: i64) {
        self.forget_within(0.0, now);
    }

    /// Forget the buckets that `now` hold at least the burst less `slack` tokens.
    fn forget_within(&mut self, slack: f64, now: i64) {
        let (rate, burst) = (self.rate_per_ms, self.burst);
        self.buckets
            .retain(|_, b| b.tokens + (now - b.at).max(0) as f64 * rate < burst - slack);
    }

    fn forget_idle(&mut self, now: i64) {
        self.forget_within((self.burst * SLACK).max(1.0), now);
        if self.buckets.len() >= MAX_BUCKETS / 2 {
            // Most buckets are busy: start over rather than grow without bound, and
            // rather than scan them all again for every new id that follows.
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

    #[test]
    fn a_busy_map_starts_over_instead_of_scanning_for_every_new_id() {
        // Every bucket took more than the slack (10 tokens of 1000) and none has
        // refilled: all busy, all forgotten.
        let mut l = Limiter::new(100.0, 1000.0);
        for i in 0..MAX_BUCKETS {
            let id = i.to_string();
            for _ in 0..11 {
                l.allow(1, &id, 0);
            }
        }
        assert_eq!(l.buckets.len(), MAX_BUCKETS);
        assert!(l.allow(1, "new", 1));
        assert_eq!(l.buckets.len(), 1);
        // Buckets full again, or nearly (they took a token 10 ms ago, or one now),
        // are forgotten; the busy ones are kept.
        let mut l = Limiter::new(100.0, 1000.0);
        for i in 0..MAX_BUCKETS {
            let id = i.to_string();
            let (at, tokens) = match i % 4 {
                0 => (0, 1),
                1 => (19_990, 1),
                2 => (20_000, 1),
                _ => (20_000, 20),
            };
            for _ in 0..tokens {
                l.allow(1, &id, at);
            }
        }
        assert!(l.allow(1, "new", 20_000));
        assert_eq!(l.buckets.len(), MAX_BUCKETS / 4 + 1);
    }

    #[test]
    fn a_spiking_id_keeps_its_bucket_while_many_others_come_and_go() {
        let mut l = Limiter::new(100.0, 1000.0);
        let taken = (0..1100).filter(|_| l.allow(1, "spiking", 0)).count();
        assert_eq!(taken, 1000);
        // Ten maps' worth of ids sending an event each, within a second.
        for i in 0..MAX_BUCKETS * 10 {
            assert!(l.allow(1, &format!("user {i}"), (i / 200) as i64));
        }
        assert!(l.buckets.len() < MAX_BUCKETS);
        // 820 ms later: 82 tokens back, and no more.
        let now = (MAX_BUCKETS * 10 / 200) as i64;
        assert_eq!(now, 819);
        let more = (0..100).filter(|_| l.allow(1, "spiking", now)).count();
        assert_eq!(more, 81);
    }

    #[test]
    fn at_rest_the_map_gives_its_memory_back() {
        // 100/s, a burst of 1000: a bucket that took one token is full again after
        // 10 ms, one that took them all after 10 s.
        let mut l = Limiter::new(100.0, 1000.0);
        for i in 0..10_000 {
            l.allow(1, &i.to_string(), 0);
        }
        let spike = l.footprint();
        assert!(spike >= 10_000 * size_of::<(u64, Bucket)>(), "{spike}");
        // None has refilled yet: all stay.
        l.rest(0);
        assert_eq!(l.buckets.len(), 10_000);
        // All have, but a pass over the map is made at most once a refill.
        l.rest(1);
        assert_eq!(l.buckets.len(), 10_000);
        // The burst has refilled since the latest arrival: the whole map goes.
        l.rest(10_000);
        assert_eq!(l.footprint(), 0);
        // A new bucket starts full, as the forgotten ones were.
        assert_eq!((0..1100).filter(|_| l.allow(1, "0", 10_000)).count(), 1000);

        // A spike, then a few ids still busy: the busy ones stay, with their tokens,
        // and the room the spike took goes.
        let mut l = Limiter::new(100.0, 1000.0);
        for i in 0..10_000 {
            l.allow(1, &i.to_string(), 0);
        }
        for i in 0..10 {
            for _ in 0..1000 {
                l.allow(1, &format!("busy {i}"), 5_000);
            }
        }
        assert!(!l.allow(1, "busy 0", 5_000));
        let before = l.footprint();
        l.rest(5_000);
        assert_eq!(l.buckets.len(), 10);
        assert!(
            l.footprint() * 100 < before,
            "{} of {before}",
            l.footprint()
        );
        assert!(!l.allow(1, "busy 0", 5_000), "still empty");
        assert!(l.allow(1, "busy 0", 5_010), "one token back after 10 ms");
        // A small map is left as it is until the burst has refilled.
        let room = l.buckets.capacity();
        l.rest(15_009);
        assert_eq!(l.buckets.capacity(), room);
        l.rest(15_010);
        assert_eq!(l.footprint(), 0);
    }

    #[test]
    fn with_no_rate_the_buckets_are_never_forgotten_at_rest() {
        let mut l = Limiter::new(0.0, 2.0);
        assert!(l.allow(1, "a", 0));
        assert!(l.allow(1, "a", 0));
        l.rest(i64::MAX);
        assert!(!l.allow(1, "a", i64::MAX), "it never refills");
    }
}
