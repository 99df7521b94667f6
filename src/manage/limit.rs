//! Failed authentications with personal API keys (on every endpoint that takes one:
//! `http::personal` is their one way in), limited per client address with a small
//! token bucket: each failure takes a token, tokens come back at a steady rate,
//! and an address without tokens is refused (429) before its key is even looked at, so
//! guessing keys costs minutes per few dozen tries. Successful requests take nothing.

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

impl FailedAuth {
    /// `Err(seconds)` until the address may try again, when it has no tokens left.
    pub fn check(&self, ip: IpAddr) -> Result<(), u64> {
        self.check_at(ip, Instant::now())
    }

    /// Takes a token for a failed authentication.
    pub fn fail(&self, ip: IpAddr) {
        self.fail_at(ip, Instant::now());
    }

    fn check_at(&self, ip: IpAddr, now: Instant) -> Result<(), u64> {
        let buckets = crate::support::sync::lock(&self.buckets);
        match buckets.get(&ip).map(|b| b.refilled(now)) {
            Some(b) if b.tokens < 1.0 => {
                let wait = (1.0 - b.tokens) * REFILL_EVERY.as_secs_f64();
                Err(wait.ceil().max(1.0) as u64)
            }
            _ => Ok(()),
        }
    }

    fn fail_at(&self, ip: IpAddr, now: Instant) {
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
        buckets.insert(
            ip,
            Bucket {
                tokens: (b.tokens - 1.0).max(0.0),
                at: now,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_failures_then_one_try_per_refill() {
        let limit = FailedAuth::default();
        let (ip, other): (IpAddr, IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t0 = Instant::now();
        for _ in 0..20 {
            assert_eq!(limit.check_at(ip, t0), Ok(()));
            limit.fail_at(ip, t0);
        }
        assert_eq!(limit.check_at(ip, t0), Err(3));
        assert_eq!(
            limit.check_at(other, t0),
            Ok(()),
            "other addresses are not limited"
        );
        let later = t0 + REFILL_EVERY;
        assert_eq!(limit.check_at(ip, later), Ok(()));
        limit.fail_at(ip, later);
        assert_eq!(limit.check_at(ip, later), Err(3));
        assert_eq!(limit.check_at(ip, later + Duration::from_secs(60)), Ok(()));
    }
}
