//! The failed-key limit's memory: token buckets by client address in a table of fixed
//! size, and one overflow bucket shared by every address that finds no place in it.
//! A bucket back to its full burst is worth nothing (it holds no failures), so it is
//! the only kind ever forgotten, earliest full first, found in O(log n) through an
//! index ordered by the moment each bucket fills up. A bucket still holding failures
//! is never forgotten to make room: a flood of new addresses cannot wash a victim's
//! (or its own) count away, and what does not fit shares the overflow bucket, which
//! allows no more than one address does.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// What one bucket is counted for: an IPv4 address, an IPv6 address (its /128), or an
/// IPv6 /64 as a whole (the block one subscriber holds, counted on top of each of its
/// addresses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Key {
    V4(u32),
    V6(u128),
    Net64(u64),
}

/// Where an attempt's token came from, so a good key gives it back to the same place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    Own(Key),
    Overflow,
}

/// At most two of something (an attempt's keys, its slots), without allocating: the
/// limit is taken on every request that carries a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Two<T> {
    items: [T; 2],
    len: usize,
}

impl<T: Copy> Two<T> {
    pub fn one(a: T) -> Self {
        Two {
            items: [a, a],
            len: 1,
        }
    }

    pub fn pair(a: T, b: T) -> Self {
        Two {
            items: [a, b],
            len: 2,
        }
    }

    pub fn as_slice(&self) -> &[T] {
        &self.items[..self.len]
    }

    fn map<U: Copy>(&self, mut f: impl FnMut(T) -> U) -> Two<U> {
        let first = f(self.items[0]);
        match self.len {
            1 => Two::one(first),
            _ => Two::pair(first, f(self.items[1])),
        }
    }
}

/// A bucket's size and refill rate.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rate {
    pub burst: f64,
    pub every: Duration,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(rate: Rate, now: Instant) -> Bucket {
        Bucket {
            tokens: rate.burst,
            at: now,
        }
    }

    fn refilled(self, rate: Rate, now: Instant) -> Bucket {
        let earned =
            now.saturating_duration_since(self.at).as_secs_f64() / rate.every.as_secs_f64();
        Bucket {
            tokens: (self.tokens + earned).min(rate.burst),
            at: now.max(self.at),
        }
    }

    /// When the bucket is back to its full burst, left alone.
    fn full_at(self, rate: Rate) -> Instant {
        let missing = (rate.burst - self.tokens).max(0.0);
        self.at + rate.every.mul_f64(missing)
    }
}

pub(super) struct Table {
    cap: usize,
    buckets: HashMap<Key, Bucket>,
    /// Every bucket of `buckets` by the moment it is full again: the first entry is the
    /// one to forget when the table is full, if that moment has passed.
    by_full: BTreeSet<(Instant, Key)>,
    overflow: Bucket,
    rate: fn(Key) -> Rate,
    overflow_rate: Rate,
}

impl Table {
    pub fn new(cap: usize, rate: fn(Key) -> Rate, overflow_rate: Rate) -> Table {
        Table {
            cap,
            buckets: HashMap::new(),
            by_full: BTreeSet::new(),
            overflow: Bucket::full(overflow_rate, Instant::now()),
            rate,
            overflow_rate,
        }
    }

    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Takes one token from each of `keys`' buckets, all or none: `Err(seconds)` until
    /// every one of them has a token again when one has none.
    pub fn take(&mut self, keys: Two<Key>, now: Instant) -> Result<Two<Slot>, u64> {
        let slots = keys.map(|k| self.place(k, keys.as_slice(), now));
        let mut wait: f64 = 0.0;
        for &slot in slots.as_slice() {
            let (rate, b) = self.refilled(slot, now);
            if b.tokens < 1.0 {
                wait = wait.max((1.0 - b.tokens) * rate.every.as_secs_f64());
            }
        }
        if wait > 0.0 {
            return Err(wait.ceil().max(1.0) as u64);
        }
        for &slot in slots.as_slice() {
            self.add(slot, -1.0, now);
        }
        Ok(slots)
    }

    /// Gives back the tokens of `slots`. A bucket forgotten meanwhile (it had filled up
    /// again) has nothing to give back to.
    pub fn refund(&mut self, slots: &[Slot], now: Instant) {
        for &slot in slots {
            self.add(slot, 1.0, now);
        }
    }

    /// `key`'s own bucket if it has one or one can be made (in a free place, or in the
    /// place of the bucket that has been full longest, but never one of `attempt`'s own
    /// keys), else the overflow bucket.
    fn place(&mut self, key: Key, attempt: &[Key], now: Instant) -> Slot {
        if self.buckets.contains_key(&key) {
            return Slot::Own(key);
        }
        if self.buckets.len() >= self.cap {
            let forget = self
                .by_full
                .iter()
                .take_while(|(full, _)| *full <= now)
                .map(|&(full, k)| (full, k))
                .find(|(_, k)| !attempt.contains(k));
            let Some((full, old)) = forget else {
                return Slot::Overflow;
            };
            self.by_full.remove(&(full, old));
            self.buckets.remove(&old);
        }
        let fresh = Bucket::full((self.rate)(key), now);
        self.buckets.insert(key, fresh);
        self.by_full.insert((fresh.full_at((self.rate)(key)), key));
        Slot::Own(key)
    }

    fn refilled(&self, slot: Slot, now: Instant) -> (Rate, Bucket) {
        match slot {
            Slot::Own(key) => {
                let rate = (self.rate)(key);
                let b = self
                    .buckets
                    .get(&key)
                    .map_or(Bucket::full(rate, now), |b| b.refilled(rate, now));
                (rate, b)
            }
            Slot::Overflow => (
                self.overflow_rate,
                self.overflow.refilled(self.overflow_rate, now),
            ),
        }
    }

    /// Adds `tokens` (-1 to take, +1 to give back) to the bucket of `slot`, keeping
    /// the index in step.
    fn add(&mut self, slot: Slot, tokens: f64, now: Instant) {
        let (rate, b) = self.refilled(slot, now);
        let b = Bucket {
            tokens: (b.tokens + tokens).clamp(0.0, rate.burst),
            at: b.at,
        };
        match slot {
            Slot::Overflow => self.overflow = b,
            Slot::Own(key) => {
                let Some(old) = self.buckets.get_mut(&key) else {
                    return;
                };
                self.by_full.remove(&(old.full_at(rate), key));
                *old = b;
                self.by_full.insert((b.full_at(rate), key));
            }
        }
    }
}
