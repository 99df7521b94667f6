//! The syncs a durability promise rests on, made visible to tests. A `kill -9` keeps
//! the page cache, so no crash test can see a missing `fsync`; instead each sync that
//! a later step depends on (a commit naming the bytes, a rename, a removal) goes
//! through [`Syncs::run`]. Under test that counts the syncs that returned, in order,
//! with what each covered, and fails one on demand after the write went through, as a
//! failing device would; a test then checks that the dependent step waited for a sync
//! that returned and that a failed one left the old state. Outside tests a [`Syncs`]
//! holds nothing and `run` is the sync itself.

#[cfg(test)]
use std::sync::Mutex;

#[cfg(test)]
use crate::support::sync::lock;

/// One sync that returned: what it synced, and where that sync reached (a file's
/// number and how many of its bytes, when the site has them; zeros otherwise).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    pub what: &'static str,
    pub file: u64,
    pub end: u64,
}

/// The syncs of one owner (a table, the block files, the sink's store).
#[derive(Default)]
pub struct Syncs {
    /// Syncs that returned, oldest first.
    #[cfg(test)]
    done: Mutex<Vec<Done>>,
    /// Failures asked for: the sync of `what` fails once this many more were tried.
    #[cfg(test)]
    failing: Mutex<Vec<(&'static str, usize)>>,
}

impl Syncs {
    /// Run `sync`, the sync of `what`.
    #[inline]
    pub fn run<T, E: From<std::io::Error>>(
        &self,
        what: &'static str,
        sync: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        self.run_at(what, 0, 0, sync)
    }

    /// Run `sync`, which makes `file`'s first `end` bytes durable.
    #[inline]
    pub fn run_at<T, E: From<std::io::Error>>(
        &self,
        what: &'static str,
        file: u64,
        end: u64,
        sync: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        #[cfg(test)]
        self.injected(what)?;
        let out = sync()?;
        #[cfg(test)]
        lock(&self.done).push(Done { what, file, end });
        #[cfg(not(test))]
        let _ = (what, file, end);
        Ok(out)
    }
}

#[cfg(test)]
impl Syncs {
    /// Make a sync of `what` fail, after `after` more of them were tried; the write
    /// before it has gone through, only the sync fails.
    pub fn fail(&self, what: &'static str, after: usize) {
        lock(&self.failing).push((what, after));
    }

    /// The syncs that returned, oldest first.
    pub fn done(&self) -> Vec<Done> {
        lock(&self.done).clone()
    }

    /// How many syncs of `what` returned.
    pub fn count(&self, what: &'static str) -> usize {
        lock(&self.done).iter().filter(|d| d.what == what).count()
    }

    fn injected(&self, what: &'static str) -> std::io::Result<()> {
        let mut failing = lock(&self.failing);
        let mut fails = false;
        failing.retain_mut(|(w, after)| {
            if *w != what || fails {
                return true;
            }
            match after.checked_sub(1) {
                Some(left) => {
                    *after = left;
                    true
                }
                None => {
                    fails = true;
                    false
                }
            }
        });
        match fails {
            true => Err(std::io::Error::other(format!(
                "injected failure of the {what} sync"
            ))),
            false => Ok(()),
        }
    }
}
