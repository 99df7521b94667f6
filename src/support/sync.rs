//! Locking shared by the modules that guard plain data with a mutex.

use std::sync::{Mutex, MutexGuard};

/// Lock `mutex`, carrying on if a thread panicked while holding it. Only for data that
/// is consistent at every point a panic could interrupt it; each caller says why its
/// data is.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Taken for reading around each unit of work a background writer does (a compactor
/// step, a sink pass) and for writing by whoever needs the writer to stand still
/// between units (a backup). tokio's lock is fair, so a waiting backup is not starved
/// by a writer that takes it again at once; the compactor's thread, outside the
/// runtime, takes it with `blocking_read`.
pub type Gate = tokio::sync::RwLock<()>;
