//! A background thread's scheduling priority: the compactor and the forwarder run at
//! a nice value of their own so capture and `/decide` come first on busy cores.

/// Lower the calling thread's scheduling priority to `nice` (Linux keeps one per
/// thread); `what` names the thread in the warning. Failure only costs throughput,
/// so it is logged, not fatal.
pub fn lower(nice: i32, what: &str) {
    if nice <= 0 {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid takes no arguments; setpriority takes integers and changes
        // only this thread's nice value.
        let rc = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice.min(19))
        };
        if rc != 0 {
            tracing::warn!(
                error = %std::io::Error::last_os_error(),
                "cannot lower the {what}'s priority"
            );
        }
    }
}
