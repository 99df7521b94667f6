//! The forwarder's blocking work (reading the outbox and the event blocks, writing
//! its progress, building and gzipping request bodies) on threads of its own, at the
//! compactor's lower priority (its nice value) when the server sets one: forwarding
//! is background work like compaction, so when the cores are busy capture's requests
//! come first and the forwarder catches up when they are not; the backlog it leaves
//! meanwhile is on disk already. A thread's nice value cannot be raised back without
//! privileges, so these threads are not the runtime's shared blocking pool.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

/// Threads doing the forwarder's work: one reads and plans while another gzips, and
/// two cores' worth of gzip outpace what one upstream takes from one edge.
pub const THREADS: usize = 2;

type Job = Box<dyn FnOnce() + Send>;

/// A handle on the forwarder's threads; they end once every handle is dropped.
#[derive(Clone)]
pub struct Work {
    jobs: mpsc::Sender<Job>,
}

impl Work {
    /// [`THREADS`] threads at `nice` (0 leaves them as they are).
    pub fn new(nice: i32) -> Work {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..THREADS {
            let queue = queue.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("forwarder-{i}"))
                .spawn(move || {
                    crate::support::priority::lower(nice, "forwarder");
                    loop {
                        let job = crate::support::sync::lock(&queue).recv();
                        match job {
                            // A job that panics fails alone: its caller gets None.
                            Ok(job) => {
                                let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
                            }
                            Err(_) => return,
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "forwarder: cannot start a worker thread");
            }
        }
        Work { jobs }
    }

    /// Run `f` on one of the threads; None if it could not run there (no thread
    /// started, or `f` panicked).
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = tx.send(f());
        });
        self.jobs.send(job).ok()?;
        rx.await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_runs_on_its_threads_at_the_nice_value_given() {
        let work = Work::new(7);
        let (name, nice) = work
            .run(|| {
                let name = std::thread::current().name().map(str::to_string);
                // SAFETY: as above; reads this thread's nice value.
                let nice =
                    unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
                (name, nice)
            })
            .await
            .unwrap();
        assert!(name.unwrap().starts_with("forwarder-"));
        assert_eq!(nice, 7);
        assert_eq!(work.run(|| panic!("a job that fails")).await, None::<()>);
        assert_eq!(work.run(|| 2 + 2).await, Some(4), "a panic ends no thread");
    }
}
