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
