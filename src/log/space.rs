//! The disk-space guard. When free space on the database's filesystem falls under a
//! reserve, new events are refused with 503 before anything is written, so the store
//! never meets a full disk mid-write (sled does not recover from that without a
//! restart); when space returns, events are accepted again by themselves.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Free space as last measured, and whether it is above the reserve.
#[derive(Debug)]
pub struct Space {
    reserve: u64,
    free: AtomicU64,
    ok: AtomicBool,
}

impl Space {
    pub fn new(reserve: u64) -> Space {
        Space {
            reserve,
            free: AtomicU64::new(u64::MAX),
            ok: AtomicBool::new(true),
        }
    }

    /// Whether there is room to accept new events.
    pub fn is_ok(&self) -> bool {
        self.ok.load(Ordering::Relaxed)
    }

    pub fn free_bytes(&self) -> u64 {
        self.free.load(Ordering::Relaxed)
    }

    /// Measure again; logs when the state changes. A failed measurement keeps the
    /// previous state (the disk did not fill up because statvfs failed).
    pub fn check(&self, dir: &Path) {
        let Some(free) = free_bytes(dir) else {
            return;
        };
        self.free.store(free, Ordering::Relaxed);
        let ok = free > self.reserve;
        let mib = |b: u64| b / (1024 * 1024);
        if self.ok.swap(ok, Ordering::Relaxed) != ok {
            if ok {
                tracing::info!(
                    free_mib = mib(free),
                    "disk space is back; accepting events again"
                );
            } else {
                tracing::error!(
                    free_mib = mib(free),
                    reserve_mib = mib(self.reserve),
                    "disk nearly full; refusing new events with 503 until space returns"
                );
            }
        }
    }
}

/// Bytes available to unprivileged writers on the filesystem holding `dir`.
pub fn free_bytes(dir: &Path) -> Option<u64> {
    let path = CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid NUL-terminated string and `stat` a valid out-pointer.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut stat) };
    (rc == 0).then(|| stat.f_bavail.saturating_mul(stat.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_decides() {
        let dir = tempfile::tempdir().unwrap();
        let free = free_bytes(dir.path()).unwrap();
        assert!(free > 0);
        let roomy = Space::new(0);
        roomy.check(dir.path());
        assert!(roomy.is_ok());
        assert_eq!(
            roomy.free_bytes() / 4096,
            free_bytes(dir.path()).unwrap() / 4096
        );
        let greedy = Space::new(u64::MAX);
        greedy.check(dir.path());
        assert!(!greedy.is_ok());
        // A path that cannot be measured keeps the previous state.
        greedy.check(Path::new("/nonexistent/dir"));
        assert!(!greedy.is_ok());
    }
}
