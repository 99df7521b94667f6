//! What a thread does when it goes quiet: a tokio worker about to park, the compactor
//! with nothing to apply, the log writer with an empty queue. The binary installs the
//! action (with mimalloc: hand the memory this thread freed back to the kernel, which
//! the allocator otherwise does only when the thread allocates again, so a server that
//! goes quiet after a burst would keep the burst's peak resident). Each thread runs
//! it at most once per [`INTERVAL`], so under load a call costs a clock read; a thread
//! that has just freed memory in bulk while busy (a fold's deltas, a large body) runs
//! it at once with [`freed`].

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The least time between two runs of the action on one thread.
pub const INTERVAL: Duration = Duration::from_secs(1);

static ACTION: OnceLock<fn()> = OnceLock::new();

thread_local! {
    static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Install the action; only the first call has an effect. Returns whether it did.
pub fn set_action(action: fn()) -> bool {
    ACTION.set(action).is_ok()
}

/// The calling thread is going quiet: run the action unless it ran on this thread
/// within the last [`INTERVAL`].
pub fn idle() {
    let Some(action) = ACTION.get() else {
        return;
    };
    let now = Instant::now();
    let due = LAST.with(|last| {
        let due = last.get().is_none_or(|t| now.duration_since(t) >= INTERVAL);
        if due {
            last.set(Some(now));
        }
        due
    });
    if due {
        action();
    }
}

/// The calling thread has just freed memory in bulk: run the action now, whatever
/// the interval (and start the interval again). Memory is handed back by the thread
/// that allocated it, so call this from that thread.
pub fn freed() {
    if let Some(action) = ACTION.get() {
        LAST.with(|last| last.set(Some(Instant::now())));
        action();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static RUNS: AtomicUsize = AtomicUsize::new(0);

    #[test]
    fn runs_at_most_once_per_interval_per_thread() {
        assert!(set_action(|| {
            RUNS.fetch_add(1, Ordering::SeqCst);
        }));
        assert!(!set_action(|| {}), "the first action stays");
        for _ in 0..100 {
            idle();
        }
        assert_eq!(RUNS.load(Ordering::SeqCst), 1);
        // Another thread has its own interval.
        std::thread::spawn(idle).join().unwrap();
        assert_eq!(RUNS.load(Ordering::SeqCst), 2);
        // Memory freed in bulk runs it at once, and starts the interval again.
        freed();
        assert_eq!(RUNS.load(Ordering::SeqCst), 3);
        idle();
        assert_eq!(RUNS.load(Ordering::SeqCst), 3);
        std::thread::spawn(|| {
            freed();
            idle();
        })
        .join()
        .unwrap();
        assert_eq!(RUNS.load(Ordering::SeqCst), 4);
    }
}
