//! The threads that sync the log's groups in flight: while one group's `fdatasync`
//! runs on one of them, the writer ([`super::writer`]) writes the next group and hands
//! its sync to another. The disk takes concurrent syncs of one file faster than one
//! after the other (the device merges their cache flushes), and the writer no longer
//! waits for a sync before writing. A sync thread enters its outcome in the
//! [`Ledger`], which answers the groups in order, then wakes the writer.

use std::fs::File;
use std::io;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::ledger::Ledger;
use super::Shared;
use crate::support::sync::lock;

/// One group's sync, for a sync thread.
pub(super) struct Task {
    /// The writer's number for the group.
    pub id: u64,
    /// The number after the group's last entry.
    pub end: u64,
    /// The description that syncs it (see [`super::Appender::write`]); None when the
    /// log has no segment open, which a group that was written never meets.
    pub file: Option<Arc<File>>,
}

/// The sync threads; they stop when this is dropped.
pub(super) struct Syncers {
    tasks: Option<mpsc::Sender<Task>>,
    ledger: Arc<Mutex<Ledger>>,
    /// Told of each sync finished, to wake the writer.
    done: UnboundedSender<()>,
    threads: Vec<JoinHandle<()>>,
}

impl Syncers {
    /// `count` threads, entering each finished sync in `ledger` and then telling
    /// `done`.
    pub fn start(
        count: usize,
        shared: &Arc<Shared>,
        ledger: &Arc<Mutex<Ledger>>,
        done: UnboundedSender<()>,
    ) -> io::Result<Syncers> {
        let (tx, rx) = mpsc::channel::<Task>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::with_capacity(count);
        for i in 0..count {
            let (rx, shared, done) = (rx.clone(), shared.clone(), done.clone());
            let ledger = ledger.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("wal-sync-{i}"))
                    .spawn(move || sync_loop(&rx, &shared, &ledger, &done))?,
            );
        }
        Ok(Syncers {
            tasks: Some(tx),
            ledger: ledger.clone(),
            done,
            threads,
        })
    }

    /// Start a group's sync; its outcome always comes (to the ledger, then `done`).
    /// Not to be called with the ledger locked.
    pub fn sync(&self, task: Task) {
        let Some(tasks) = &self.tasks else {
            return;
        };
        if let Err(mpsc::SendError(task)) = tasks.send(task) {
            // No sync thread is left (one panicked): the group fails.
            let failed = Err(io::Error::other("the log's sync threads have stopped"));
            lock(&self.ledger).finish(task.id, failed, Instant::now());
            let _ = self.done.send(());
        }
    }
}

impl Drop for Syncers {
    fn drop(&mut self) {
        self.tasks = None;
        for thread in self.threads.drain(..) {
            if thread.join().is_err() {
                tracing::error!("write-ahead log sync thread panicked");
            }
        }
    }
}

fn sync_loop(
    tasks: &Mutex<mpsc::Receiver<Task>>,
    shared: &Shared,
    ledger: &Mutex<Ledger>,
    done: &UnboundedSender<()>,
) {
    loop {
        // The lock is held only while waiting for a task, not while syncing.
        let next = lock(tasks).recv();
        let Ok(task) = next else {
            return;
        };
        let result = shared
            .before_sync(task.end)
            .and_then(|()| task.file.as_ref().map_or(Ok(()), |f| f.sync_data()));
        let at = Instant::now();
        // The description is closed here, not by the writer.
        drop(task.file);
        // Answered here when every earlier group is; the writer only learns that a
        // group left the pipeline.
        lock(ledger).finish(task.id, result, at);
        if done.send(()).is_err() {
            return;
        }
    }
}

/// A test's hook before each sync ([`Shared::sync_hook`]).
#[cfg(test)]
pub(crate) type Hook = Arc<dyn Fn(u64) -> io::Result<()> + Send + Sync>;

impl Shared {
    /// What tests inject before a group's sync (failures, a sync held in flight);
    /// nothing otherwise.
    pub(super) fn before_sync(&self, end: u64) -> io::Result<()> {
        #[cfg(test)]
        {
            self.injected_failure()?;
            let hook = lock(&self.sync_hook).clone();
            if let Some(hook) = hook {
                hook(end)?;
            }
        }
        #[cfg(not(test))]
        let _ = end;
        Ok(())
    }

    /// Counts a sync (or probe) tried, and fails it while `failing_commits` says so.
    #[cfg(test)]
    pub(super) fn injected_failure(&self) -> io::Result<()> {
        use std::sync::atomic::Ordering;
        self.commits_tried.fetch_add(1, Ordering::SeqCst);
        let failing = self.failing_commits.load(Ordering::SeqCst);
        if failing > 0 {
            self.failing_commits.store(failing - 1, Ordering::SeqCst);
            return Err(io::Error::other("injected failure"));
        }
        Ok(())
    }
}
