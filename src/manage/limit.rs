//! Failed authentications with keys (on every endpoint that takes a personal or project
//! secret key, `http::personal` being their one way in, and the console's sign-in),
//! limited per client address with a small token bucket: each attempt takes a token
//! before its key is looked at or its body read, an attempt whose key turns out good
//! gives it back, tokens come back at a steady rate, and an address without tokens is
//! refused (429). Taking the token first is what makes the limit hold under
//! concurrency: a hundred guesses sent at once, their bodies held back, cannot all pass
//! the check before the first failure is counted. Guessing keys costs minutes per few
//! dozen tries. IPv6 clients are counted by their /64, the block one subscriber holds.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures an address may have in a burst: enough for a person fixing a typo.
pub const BURST: f64 = 20.0;
/// One token comes back every this long (20 a minute).
pub const REFILL_EVERY: Duration = Duration::from_secs(3);
/// Addresses remembered at most; past it, full buckets are forgotten first, so an
/// attacker rotating addresses cannot grow memory without bound.
const MAX_ADDRESSES: usize = 10_000;

#[derive(Default)]
pub struct FailedAuth {
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn refilled(self, now: Instant) -> Bucket {
        let earned = now.duration_since(self.at).as_secs_f64() / REFILL_EVERY.as_secs_f64();
        Bucket {
            tokens: (self.tokens + earned).min(BURST),
            at: now,
        }
    }
}

/// One attempt's token, taken. Dropped, the attempt counts as failed; [`Attempt::passed`]
/// gives the token back.
#[must_use = "drop it for a failure, or call passed()"]
pub struct Attempt<'a> {
    limit: &'a FailedAuth,
    ip: IpAddr,
}

impl Attempt<'_> {
    /// The key was good: the attempt costs nothing.
    pub fn passed(self) {
        self.limit.refund_at(self.ip, Instant::now());
    }
}

impl FailedAuth {
    /// Takes a token for an attempt about to be made, or `Err(seconds)` until the
    /// address may try again when it has none left.
    pub fn take(&self, ip: IpAddr) -> Result<Attempt<'_>, u64> {
        let ip = crate::geoip::subscriber(ip);
        self.take_at(ip, Instant::now())?;
        Ok(Attempt { limit: self, ip })
    }

    fn take_at(&self, ip: IpAddr, now: Instant) -> Result<(), u64> {
        let mut buckets = crate::support::sync::lock(&self.buckets);
        if buckets.len() >= MAX_ADDRESSES && !buckets.contains_key(&ip) {
            buckets.retain(|_, b| b.refilled(now).tokens < BURST);
        }
        let b = buckets.get(&ip).map_or(
            Bucket {
                tokens: BURST,
                at: now,
            },
            |b| b.refilled(now),
        );
        if b.tokens < 1.0 {
            let wait = (1.0 - b.tokens) * REFILL_EVERY.as_secs_f64();
            return Err(wait.ceil().max(1.0) as u64);
        }
        buckets.insert(
            ip,
            Bucket {
                tokens: b.tokens - 1.0,
                at: now,
            },
        );
        Ok(())
    }

    fn refund_at(&self, ip: IpAddr, now: Instant) {
        let mut buckets = crate::support::sync::lock(&self.buckets);
        if let Some(b) = buckets.get_mut(&ip) {
            let r = b.refilled(now);
            *b = Bucket {
                tokens: (r.tokens + 1.0).min(BURST),
                at: now,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    #[test]
    fn a_burst_of_failures_then_one_try_per_refill() {
        let limit = FailedAuth::default();
        let (ip, other): (IpAddr, IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t0 = Instant::now();
        for _ in 0..20 {
            assert_eq!(limit.take_at(ip, t0), Ok(()));
        }
        assert_eq!(limit.take_at(ip, t0), Err(3));
        assert_eq!(
            limit.take_at(other, t0),
            Ok(()),
            "other addresses are not limited"
        );
        let later = t0 + REFILL_EVERY;
        assert_eq!(limit.take_at(ip, later), Ok(()));
        assert_eq!(limit.take_at(ip, later), Err(3));
        assert_eq!(limit.take_at(ip, later + Duration::from_secs(60)), Ok(()));
    }

    #[test]
    fn a_good_key_gives_its_token_back() {
        let limit = FailedAuth::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        for _ in 0..100 {
            limit.take(ip).unwrap().passed();
        }
        for _ in 0..20 {
            drop(limit.take(ip).unwrap());
        }
        assert!(limit.take(ip).is_err(), "twenty failures use the burst up");
    }

    #[test]
    fn tokens_held_by_pending_attempts_are_not_lent_twice() {
        // Twenty attempts in flight at once (their bodies not yet read) hold every
        // token: the twenty-first is refused before it is looked at.
        let limit = FailedAuth::default();
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        let pending: Vec<_> = (0..20).map(|_| limit.take(ip).unwrap()).collect();
        assert!(limit.take(ip).is_err());
        for a in pending {
            a.passed();
        }
        assert!(limit.take(ip).is_ok());
    }

    #[test]
    fn an_ipv6_client_is_counted_by_its_64() {
        let limit = FailedAuth::default();
        for i in 0..20u16 {
            let ip = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, 2, i, i, i, i));
            drop(limit.take(ip).unwrap());
        }
        let same = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, 2, 9, 9, 9, 99));
        let next = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, 3, 0, 0, 0, 1));
        assert!(limit.take(same).is_err());
        assert!(limit.take(next).is_ok());
    }
}
