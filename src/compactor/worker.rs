//! The compactor's thread: steps until stopped, idles when there is nothing to do,
//! backs off (and reports itself unhealthy) while steps fail, runs retention every
//! few minutes, and stops for good on a panic rather than risk applying a chunk twice.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::Compactor;

/// With nothing to do, look again after this long (the lag floor at low load).
const IDLE_WAIT: Duration = Duration::from_millis(5);
/// After a storage error, wait before retrying the same step.
const ERROR_BACKOFF: Duration = Duration::from_millis(500);
/// How often old events are deleted.
const RETENTION_INTERVAL: Duration = Duration::from_secs(600);

/// Lower the calling thread's scheduling priority to `nice` (Linux keeps one per
/// thread). Failure only costs throughput, so it is logged, not fatal.
fn lower_priority(nice: i32) {
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
                "cannot lower the compactor's priority"
            );
        }
    }
}

/// The compactor's thread; stop it at shutdown.
pub struct Handle {
    thread: JoinHandle<()>,
    stop: Arc<AtomicBool>,
}

impl Handle {
    /// Finish the current step and stop. What is left in the log is applied at the
    /// next start.
    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.thread().unpark();
        if self.thread.join().is_err() {
            tracing::error!("compactor thread panicked");
        }
    }
}

/// Run the compactor on its own thread until stopped. A failing step marks the
/// compactor unhealthy (the server then refuses new writes) and is retried; a panic
/// stops it for good rather than risk applying a chunk twice or half.
pub fn spawn(mut compactor: Compactor) -> std::io::Result<Handle> {
    let stop = Arc::new(AtomicBool::new(false));
    let stop_flag = stop.clone();
    let thread = std::thread::Builder::new().name("compactor".into()).spawn(move || {
        lower_priority(compactor.settings.nice);
        let stats = compactor.stats();
        let mut last_retention: Option<Instant> = None;
        while !stop_flag.load(Ordering::SeqCst) {
            if last_retention.is_none_or(|t| t.elapsed() >= RETENTION_INTERVAL) {
                last_retention = Some(Instant::now());
                if let Err(e) = compactor.enforce_retention(crate::clock::now_ms()) {
                    tracing::error!(error = %e, "retention pass failed");
                }
            }
            match std::panic::catch_unwind(AssertUnwindSafe(|| compactor.step())) {
                Ok(Ok(report)) => {
                    if !stats.healthy.swap(true, Ordering::SeqCst) {
                        tracing::info!("compactor recovered");
                    }
                    if report.is_idle() {
                        crate::idle::idle();
                        std::thread::park_timeout(IDLE_WAIT);
                    }
                }
                Ok(Err(e)) => {
                    if stats.healthy.swap(false, Ordering::SeqCst) {
                        tracing::error!(error = %e, "compactor step failed; refusing new events until it succeeds");
                    }
                    std::thread::park_timeout(ERROR_BACKOFF);
                }
                Err(_) => {
                    stats.healthy.store(false, Ordering::SeqCst);
                    tracing::error!("compactor panicked; refusing new events until restart");
                    return;
                }
            }
        }
    })?;
    Ok(Handle { thread, stop })
}
