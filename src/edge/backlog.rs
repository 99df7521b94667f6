//! How much the forwarder still owes upstream, and capture's bound on it
//! (`--upstream-max-backlog`): the forwarder sets the figures as it goes, capture asks
//! [`Backlog::over`] before it acknowledges, and answers 503 with `Retry-After` while
//! the bound is passed, recovering by itself as the backlog drains. Without a bound the
//! disk reserve (`--min-free-disk-mb`) is the limit, as for every event.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Backlog {
    /// The bound in bytes; 0 for none.
    limit: u64,
    /// Bytes stored (log and event blocks) not yet acknowledged by upstream.
    bytes: AtomicU64,
    /// Events not yet acknowledged by upstream.
    events: AtomicU64,
    /// Whether capture is refusing, so the change is logged once each way.
    refusing: AtomicBool,
}

impl Backlog {
    pub fn new(limit: Option<u64>) -> Backlog {
        Backlog {
            limit: limit.unwrap_or(0),
            ..Default::default()
        }
    }

    /// The forwarder's latest figures.
    pub fn set(&self, bytes: u64, events: u64) {
        self.bytes.store(bytes, Ordering::Relaxed);
        self.events.store(events, Ordering::Relaxed);
        let over = self.limit > 0 && bytes >= self.limit;
        if self.refusing.swap(over, Ordering::Relaxed) != over {
            if over {
                tracing::warn!(
                    backlog_bytes = bytes,
                    limit = self.limit,
                    "upstream backlog past --upstream-max-backlog: new events get 503 until it drains"
                );
            } else {
                tracing::info!(
                    backlog_bytes = bytes,
                    "upstream backlog drained below its bound: accepting events again"
                );
            }
        }
    }

    /// True while new events must be refused.
    pub fn over(&self) -> bool {
        self.refusing.load(Ordering::Relaxed)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    pub fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> Option<u64> {
        (self.limit > 0).then_some(self.limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_past_the_bound_and_recovers() {
        let b = Backlog::new(Some(1000));
        b.set(999, 10);
        assert!(!b.over());
        b.set(1000, 11);
        assert!(b.over());
        assert_eq!((b.bytes(), b.events()), (1000, 11));
        b.set(10, 1);
        assert!(!b.over());
        let unbounded = Backlog::new(None);
        unbounded.set(u64::MAX, 1);
        assert!(!unbounded.over());
        assert_eq!(unbounded.limit(), None);
    }
}
