//! What the tests see and change of the fold schedule.

use super::*;

/// The fold thread's state, seen from another thread while the compactor is busy.
pub struct Probe(Arc<Shared>);

impl Probe {
    /// Whether a fold is under way on the fold thread.
    pub fn running(&self) -> bool {
        lock(&self.0.state).running
    }

    /// Times the compactor waited for a fold under way.
    pub fn waits(&self) -> u64 {
        lock(&self.0.state).waits
    }

    /// When a failed fold is tried again.
    pub fn retry_at(&self) -> Option<Instant> {
        lock(&self.0.state).retry_at
    }

    /// Make the retry of a failed fold due now.
    pub fn retry_now(&self) {
        if let Some(at) = &mut lock(&self.0.state).retry_at {
            *at = Instant::now();
        }
    }

    /// Wait up to `patience` for the fold under way to end; whether it did.
    pub fn ended_within(&self, patience: Duration) -> bool {
        let state = lock(&self.0.state);
        let (state, _) = self
            .0
            .ended
            .wait_timeout_while(state, patience, |s| s.running)
            .unwrap_or_else(|e| e.into_inner());
        !state.running
    }
}

impl Schedule {
    pub fn probe(&self) -> Probe {
        Probe(self.shared.clone())
    }

    /// The fold thread gone, as if it had panicked past a fold: folds handed to it
    /// are given back.
    pub fn lose_thread(&mut self) {
        self.folder = Some(Worker::gone(THREAD));
    }

    /// The fold thread replaced by one that takes the next fold and ends without
    /// running it: a thread that panics past a fold leaves one handed to it meanwhile
    /// so.
    pub fn lose_next_request(&mut self) {
        self.folder = Some(Worker::dropping_one(THREAD));
    }
}
