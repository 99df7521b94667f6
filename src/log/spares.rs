//! Spare segment files: segments are allocated before they are written, zero-filled by
//! a background thread ([`Preparer`]) or recycled from segments the compactor has
//! finished with, so a roll rarely waits and a segment's size never changes while
//! entries are appended.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::segment::{allocate, zero_fill, SPARE_PREFIX};
use super::Shared;
use crate::support::sync::lock;

/// Ready segments kept beside the one being written, so a roll does not wait for one
/// to be zero-filled.
const SPARES: usize = 1;

#[derive(Default)]
pub(super) struct Spares {
    pub(super) ready: Vec<PathBuf>,
    counter: u64,
    stop: bool,
}

impl Shared {
    pub(super) fn spare_path(&self, spares: &mut Spares) -> PathBuf {
        spares.counter += 1;
        self.dir
            .join(format!("{SPARE_PREFIX}{}.tmp", spares.counter))
    }

    /// A ready segment file, renamed to `target`. Made here if none is ready.
    pub(super) fn take_spare(&self, target: &Path) -> io::Result<()> {
        let ready = {
            let mut spares = lock(&self.spares);
            let ready = spares.ready.pop();
            self.spare_wanted.notify_one();
            ready
        };
        match ready {
            Some(path) => std::fs::rename(path, target),
            // None ready (the disk is busy, or the log grows faster than the compactor
            // frees segments): allocate one now rather than wait for zeros to be
            // written. Its first syncs cost a little more, marking blocks written.
            None => self.allocate_into(target, self.segment_bytes),
        }
    }

    /// Allocate a file under a spare's name, then rename it to `target`: a crash
    /// midway leaves a spare, removed at the next start, never an empty segment.
    pub(super) fn allocate_into(&self, target: &Path, len: u64) -> io::Result<()> {
        let tmp = {
            let mut spares = lock(&self.spares);
            self.spare_path(&mut spares)
        };
        if let Err(e) = allocate(&tmp, len) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(tmp, target)
    }

    /// A segment no longer in use: kept as a spare when one is wanted and it has the
    /// usual size, deleted otherwise.
    pub(super) fn retire(&self, path: &Path) -> io::Result<()> {
        {
            let mut spares = lock(&self.spares);
            let size = std::fs::metadata(path).map(|m| m.len()).ok();
            if spares.ready.len() < SPARES && size == Some(self.segment_bytes) {
                let spare = self.spare_path(&mut spares);
                std::fs::rename(path, &spare)?;
                spares.ready.push(spare);
                return Ok(());
            }
        }
        std::fs::remove_file(path)
    }
}

/// Keeps zero-filled segments ready on its own thread, so a roll rarely waits. The
/// thread stops when this is dropped.
pub struct Preparer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Preparer {
    pub(super) fn start(shared: Arc<Shared>) -> io::Result<Preparer> {
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("wal-segments".into())
            .spawn(move || prepare_loop(&s))?;
        Ok(Preparer {
            shared,
            thread: Some(thread),
        })
    }

    /// Stop the thread and wait for it.
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for Preparer {
    fn drop(&mut self) {
        lock(&self.shared.spares).stop = true;
        self.shared.spare_wanted.notify_all();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("log segment preparer panicked");
            }
        }
    }
}

fn prepare_loop(shared: &Shared) {
    let mut failing = false;
    loop {
        let path = {
            let mut spares = lock(&shared.spares);
            while !spares.stop && spares.ready.len() >= SPARES {
                spares = shared
                    .spare_wanted
                    .wait(spares)
                    .unwrap_or_else(|p| p.into_inner());
            }
            if spares.stop {
                return;
            }
            shared.spare_path(&mut spares)
        };
        match zero_fill(&path, shared.segment_bytes) {
            Ok(()) => {
                failing = false;
                let mut spares = lock(&shared.spares);
                spares.ready.push(path);
            }
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                if !std::mem::replace(&mut failing, true) {
                    tracing::error!(error = %e, "cannot prepare a log segment; retrying");
                }
                // Wait before retrying, or for a stop.
                let spares = lock(&shared.spares);
                if spares.stop {
                    return;
                }
                let _ = shared
                    .spare_wanted
                    .wait_timeout(spares, std::time::Duration::from_secs(1));
            }
        }
    }
}
