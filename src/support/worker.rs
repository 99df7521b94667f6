//! A background thread taking jobs one at a time (the compactor's block thread and its
//! fold thread): named, at a nice value of its own, handing back the memory it freed
//! once it has had nothing to do for a moment ([`super::idle`]). A job is work and a
//! hand-back: on the thread the work runs under `catch_unwind` and the hand-back gets
//! its value or the panic; a job the thread cannot take (it could not start, or it is
//! gone) is given back, to run on the caller's thread, where a panic goes on as any
//! other. Dropped, the worker lets the thread finish the jobs sent and joins it.

use std::any::Any;
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::thread::JoinHandle;
use std::time::Duration;

/// With no job for this long the thread counts as quiet and hands back the memory it
/// freed; under load the next job comes sooner.
const QUIET: Duration = Duration::from_millis(100);

/// What a job's work came to: its value, or the panic that stopped it.
pub type Outcome<T> = Result<T, Box<dyn Any + Send>>;

/// Work and what is done with its outcome.
pub struct Job(Box<dyn FnOnce(bool) + Send>);

impl Job {
    pub fn new<T: 'static>(
        work: impl FnOnce() -> T + Send + 'static,
        back: impl FnOnce(Outcome<T>) + Send + 'static,
    ) -> Job {
        Job(Box::new(move |on_thread| {
            let outcome = match on_thread {
                true => panic::catch_unwind(AssertUnwindSafe(work)),
                false => Ok(work()),
            };
            back(outcome);
        }))
    }

    /// Run the job on the calling thread.
    pub fn run_here(self) {
        (self.0)(false);
    }
}

pub struct Worker {
    name: &'static str,
    jobs: Option<SyncSender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Start the thread `name` at `nice`; up to `queue` jobs wait for it before
    /// [`Worker::send`] waits (none: each waits for the thread to take it).
    pub fn spawn(name: &'static str, nice: i32, queue: usize) -> io::Result<Worker> {
        let (jobs, received) = mpsc::sync_channel(queue);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                super::priority::lower(nice, &format!("{name} thread"));
                while let Some(job) = next(&received) {
                    (job.0)(true);
                }
            })?;
        Ok(Worker {
            name,
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Hand `job` to the thread; given back if the thread is gone.
    pub fn send(&self, job: Job) -> Result<(), Job> {
        match &self.jobs {
            Some(jobs) => jobs.send(job).map_err(|unsent| unsent.0),
            None => Err(job),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // The thread ends once it has taken every job sent.
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!(thread = self.name, "a worker thread panicked");
            }
        }
    }
}

/// The next job, or `None` once the worker is dropped; the freed memory is handed
/// back while none comes.
fn next(received: &Receiver<Job>) -> Option<Job> {
    match received.recv_timeout(QUIET) {
        Ok(job) => Some(job),
        Err(RecvTimeoutError::Timeout) => {
            super::idle::idle();
            received.recv().ok()
        }
        Err(RecvTimeoutError::Disconnected) => None,
    }
}

#[cfg(test)]
impl Worker {
    /// A worker whose thread is gone: every job is given back.
    pub fn gone(name: &'static str) -> Worker {
        Worker {
            name,
            jobs: None,
            thread: None,
        }
    }

    /// A worker whose thread takes one job and ends without running it, as a thread
    /// that panicked past a job leaves one sent meanwhile.
    pub fn dropping_one(name: &'static str) -> Worker {
        let (jobs, received) = mpsc::sync_channel::<Job>(1);
        let thread = std::thread::spawn(move || drop(received.recv()));
        Worker {
            name,
            jobs: Some(jobs),
            thread: Some(thread),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    type Seen = Arc<Mutex<Vec<(u32, Option<String>, bool)>>>;

    /// A job recording its number, the thread it ran on and whether it panicked.
    fn job(seen: &Seen, n: u32) -> Job {
        let seen = seen.clone();
        let work = move || {
            assert!(n != 2, "job {n} panics");
            std::thread::current().name().map(str::to_owned)
        };
        Job::new(work, move |outcome: Outcome<Option<String>>| {
            let panicked = outcome.is_err();
            let thread = outcome.ok().flatten();
            seen.lock().unwrap().push((n, thread, panicked));
        })
    }

    #[test]
    fn jobs_run_in_order_on_the_thread_a_panic_handed_back_and_the_drop_waits_for_them() {
        let seen = Seen::default();
        let worker = Worker::spawn("worker-test", 0, 1).unwrap();
        for n in 1..=4 {
            assert!(worker.send(job(&seen, n)).is_ok());
        }
        drop(worker);
        let thread = Some("worker-test".to_owned());
        let expected: Vec<_> = (1..=4)
            .map(|n| match n {
                2 => (n, None, true),
                _ => (n, thread.clone(), false),
            })
            .collect();
        assert_eq!(*seen.lock().unwrap(), expected);
    }

    #[test]
    fn a_job_the_thread_cannot_take_is_given_back_to_run_here() {
        let seen = Seen::default();
        let Err(job) = Worker::gone("worker-test").send(job(&seen, 1)) else {
            panic!("a thread that is gone took a job");
        };
        job.run_here();
        let here = std::thread::current().name().map(str::to_owned);
        assert_eq!(*seen.lock().unwrap(), [(1, here, false)]);
    }
}
