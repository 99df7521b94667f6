//! Settings and hooks the tests set on a table.

use super::{DuringFold, Layered};
use crate::support::syncs::Syncs;

impl Layered {
    /// Make folds take at most `bytes` of the delta.
    pub fn set_take_bytes(&self, bytes: u64) {
        self.inner
            .take_bytes
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Make folds cut runs at `bytes`.
    pub fn set_part_bytes(&self, bytes: u64) {
        self.inner
            .part_bytes
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Run `hook` in every fold from now, once the delta is frozen (`None`: no more).
    pub(crate) fn set_during_fold(&self, hook: Option<DuringFold>) {
        *crate::support::sync::lock(&self.inner.during_fold) = hook;
    }

    pub(crate) fn syncs(&self) -> &Syncs {
        &self.inner.syncs
    }
}
