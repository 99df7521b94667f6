//! The backlog guard: capture's backpressure. When the log's files hold more than a
//! bound (the compactor has fallen that far behind), new events are refused with 503
//! and `Retry-After`, as for a full disk, so a compactor slower than capture grows a
//! bounded log instead of filling the disk; once the compactor has drained a quarter
//! of the bound, events are accepted again by themselves.
//!
//! The bound is in bytes of segment files, not entries or seconds: bytes are what
//! fill the disk, an entry holds anything from one event to 64 KiB of them, and a lag
//! in seconds would refuse a slow trickle as readily as a flood.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Refusing stops once the log is back under this share of the bound (numerator,
/// denominator): each refusal and resumption is then a real change of state, not a
/// flicker on every segment the compactor releases.
const RESUME_AT: (u64, u64) = (3, 4);

/// The log's size as last measured, and whether new events are accepted.
#[derive(Debug)]
pub struct Backlog {
    /// The bound in bytes; 0 turns the guard off.
    max: u64,
    bytes: AtomicU64,
    ok: AtomicBool,
}

impl Backlog {
    pub fn new(max: u64) -> Backlog {
        Backlog {
            max,
            bytes: AtomicU64::new(0),
            ok: AtomicBool::new(true),
        }
    }

    /// Whether the log has room for new events.
    pub fn is_ok(&self) -> bool {
        self.ok.load(Ordering::Relaxed)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    /// Take a new measurement of the log's files (`bytes`); logs when the state
    /// changes, so a long refusal is said once, not per request.
    pub fn check(&self, bytes: u64) {
        self.bytes.store(bytes, Ordering::Relaxed);
        if self.max == 0 {
            return;
        }
        let was_ok = self.is_ok();
        let ok = match was_ok {
            true => bytes <= self.max,
            false => bytes <= self.max / RESUME_AT.1 * RESUME_AT.0,
        };
        if ok == was_ok || self.ok.swap(ok, Ordering::Relaxed) == ok {
            return;
        }
        let mib = |b: u64| b / (1024 * 1024);
        if ok {
            tracing::info!(
                log_mib = mib(bytes),
                "the compactor has caught up with the log; accepting events again"
            );
        } else {
            tracing::warn!(
                log_mib = mib(bytes),
                max_log_mib = mib(self.max),
                "the compactor is behind the log by more than --max-log-mb; refusing new events with 503 until it catches up"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn refuses_over_the_bound_and_resumes_under_three_quarters() {
        let b = Backlog::new(100 * MIB);
        b.check(100 * MIB);
        assert!(b.is_ok(), "at the bound is not over it");
        b.check(100 * MIB + 1);
        assert!(!b.is_ok());
        b.check(80 * MIB);
        assert!(
            !b.is_ok(),
            "under the bound but over three quarters: still refusing"
        );
        b.check(75 * MIB);
        assert!(b.is_ok());
        assert_eq!(b.bytes(), 75 * MIB);
        b.check(90 * MIB);
        assert!(b.is_ok(), "accepting again up to the bound itself");
    }

    #[test]
    fn zero_turns_it_off() {
        let b = Backlog::new(0);
        b.check(u64::MAX);
        assert!(b.is_ok());
        assert_eq!(b.bytes(), u64::MAX);
    }
}
