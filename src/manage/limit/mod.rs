//! Failed authentications with keys (on every endpoint that takes a personal or project
//! secret key, `http::personal` being their one way in, and the console's sign-in),
//! limited per client address with a small token bucket: each attempt takes a token
//! before its key is looked at or its body read, an attempt whose key turns out good
//! gives it back, tokens come back at a steady rate, and an address without tokens is
//! refused (429). Taking the token first is what makes the limit hold under
//! concurrency: a hundred guesses sent at once, their bodies held back, cannot all pass
//! the check before the first failure is counted. Guessing keys costs minutes per few
//! dozen tries. An IPv6 address is counted on its own and, more loosely, with the rest
//! of its /64 (the block one subscriber holds), so rotating through a /64 buys a few
//! addresses' worth of guesses, not 2^64. The memory is bounded (`table`).

mod table;

use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use table::{Key, Rate, Slot, Table, Two};

/// Failures an address may have in a burst: enough for a person fixing a typo.
pub const BURST: f64 = 20.0;
/// One token comes back every this long (20 a minute).
pub const REFILL_EVERY: Duration = Duration::from_secs(3);
/// A /64's failures in a burst, over all its addresses: a household or an office
/// behind one prefix, three people fixing typos at once.
pub const BURST_PER_64: f64 = 3.0 * BURST;
/// A /64 earns tokens three times as fast as one address: three addresses' worth.
pub const REFILL_EVERY_PER_64: Duration = Duration::from_secs(1);
/// Buckets kept at most (addresses and /64s together), about 8 MiB with their index:
/// far more than the addresses that fail a key in a minute, bounded however many an
/// attacker rotates through.
pub const MAX_BUCKETS: usize = 50_000;

const PER_ADDRESS: Rate = Rate {
    burst: BURST,
    every: REFILL_EVERY,
};

fn rate(key: Key) -> Rate {
    match key {
        Key::V4(_) | Key::V6(_) => PER_ADDRESS,
        Key::Net64(_) => Rate {
            burst: BURST_PER_64,
            every: REFILL_EVERY_PER_64,
        },
    }
}

pub struct FailedAuth {
    /// Held for a few map operations, never across an await.
    table: Mutex<Table>,
}

impl Default for FailedAuth {
    fn default() -> Self {
        FailedAuth::with_capacity(MAX_BUCKETS)
    }
}

/// One attempt's tokens, taken. Dropped, the attempt counts as failed;
/// [`Attempt::passed`] gives the tokens back.
#[must_use = "drop it for a failure, or call passed()"]
pub struct Attempt<'a> {
    limit: &'a FailedAuth,
    slots: Two<Slot>,
}

impl Attempt<'_> {
    /// The key was good: the attempt costs nothing.
    pub fn passed(self) {
        self.limit.refund_at(self.slots.as_slice(), Instant::now());
    }
}

/// The buckets an attempt from `ip` takes a token from.
fn keys(ip: IpAddr) -> Two<Key> {
    match ip.to_canonical() {
        IpAddr::V4(v4) => Two::one(Key::V4(u32::from(v4))),
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            Two::pair(Key::V6(bits), Key::Net64((bits >> 64) as u64))
        }
    }
}

impl FailedAuth {
    /// A limit keeping at most `cap` buckets; past them, addresses share the overflow
    /// bucket, which allows what one address does.
    pub fn with_capacity(cap: usize) -> FailedAuth {
        FailedAuth {
            table: Mutex::new(Table::new(cap, rate, PER_ADDRESS)),
        }
    }

    /// Takes a token for an attempt about to be made, or `Err(seconds)` until the
    /// address may try again when it has none left.
    pub fn take(&self, ip: IpAddr) -> Result<Attempt<'_>, u64> {
        let slots = self.take_at(ip, Instant::now())?;
        Ok(Attempt { limit: self, slots })
    }

    fn take_at(&self, ip: IpAddr, now: Instant) -> Result<Two<Slot>, u64> {
        crate::support::sync::lock(&self.table).take(keys(ip), now)
    }

    fn refund_at(&self, slots: &[Slot], now: Instant) {
        crate::support::sync::lock(&self.table).refund(slots, now);
    }

    /// Buckets held now (the overflow bucket not counted).
    pub fn buckets(&self) -> usize {
        crate::support::sync::lock(&self.table).len()
    }
}

#[cfg(test)]
#[path = "tests/counts.rs"]
mod tests;
