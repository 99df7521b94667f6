//! The open database as the server shares it, replaceable while serving.
//!
//! sled 0.34 keeps the first I/O error its background writer meets (a full disk, say)
//! and returns it from every later call until the database is opened again, and the
//! layered tables' journal does the same with a record it failed to write
//! (`layered::journal`): [`still_writes`] asks both. So the
//! open database sits in a slot: request handlers take a reference for one request,
//! and the compactor, which owns recovery, empties the slot, waits for those references
//! to be given back, drops the database and opens it again (see
//! `compactor::worker`). While the slot is empty, reads answer "unavailable".
//!
//! Nothing acknowledged is lost by a reopen: sled holds only what the compactor applied
//! from the write-ahead log, and the log's segments are recycled only after a
//! checkpoint past them is durable, so whatever sled loses is read from the log again.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;

use super::{check, keys, Error, Trees};

/// The database and its trees, opened together.
pub struct Open {
    pub db: sled::Db,
    pub trees: Trees,
}

/// The slot, and what reopening needs.
pub struct Live {
    dir: PathBuf,
    cache_bytes: u64,
    slot: ArcSwapOption<Open>,
    /// Set when the database could not be reopened: only a restart can help.
    failed: AtomicBool,
}

/// How often an emptied slot is checked for references still held.
const RELEASE_POLL: Duration = Duration::from_millis(10);

impl Live {
    pub fn new(dir: &Path, cache_bytes: u64, open: Open) -> Live {
        Live {
            dir: dir.to_path_buf(),
            cache_bytes,
            slot: ArcSwapOption::from_pointee(open),
            failed: AtomicBool::new(false),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The open database, or `None` while it is being reopened.
    pub fn get(&self) -> Option<Arc<Open>> {
        self.slot.load_full()
    }

    /// Whether the database is usable or still being recovered; false once recovery
    /// gave up.
    pub fn is_live(&self) -> bool {
        !self.failed.load(Ordering::SeqCst)
    }

    pub fn give_up(&self) {
        self.failed.store(true, Ordering::SeqCst);
    }

    /// Empty the slot and wait (at most `patience`) until every reference taken from it
    /// is dropped, then drop the database: its files and its lock are closed when this
    /// returns true. False if references were still held; the slot stays empty.
    pub fn close(&self, patience: Duration) -> bool {
        let Some(mut open) = self.slot.swap(None) else {
            return true;
        };
        let deadline = Instant::now() + patience;
        loop {
            match Arc::try_unwrap(open) {
                Ok(open) => {
                    drop(open);
                    return true;
                }
                Err(held) if Instant::now() < deadline => {
                    open = held;
                    std::thread::sleep(RELEASE_POLL);
                }
                Err(held) => {
                    // Put back so whoever holds it can finish; still unusable.
                    self.slot.store(Some(held));
                    return false;
                }
            }
        }
    }

    /// Open the database again into the empty slot, after proving it can write (a
    /// probe key written and flushed, the tables' journal probed). Returns its trees
    /// and checkpoint.
    pub fn reopen(&self) -> Result<(Trees, Option<u64>), Error> {
        let db = check::open(&self.dir, self.cache_bytes)?;
        let trees = Trees::open(&db, &self.dir)?;
        trees.meta.insert(keys::PROBE_KEY, &[][..])?;
        db.flush()?;
        trees.persons.journal().probe().map_err(Error::Tables)?;
        let checkpoint = trees
            .meta
            .get(keys::CHECKPOINT_KEY)?
            .and_then(|v| keys::seq(&v));
        self.slot.store(Some(Arc::new(Open {
            db,
            trees: trees.clone(),
        })));
        Ok((trees, checkpoint))
    }
}

/// Whether the database still writes: sled flushes, and the layered tables' journal
/// kept no error. Each keeps a failed write's error until the database is opened again.
pub fn still_writes(trees: &Trees) -> Result<(), Error> {
    trees.meta.flush()?;
    trees.persons.journal().kept_error().map_err(Error::Tables)
}

/// Whether `e` is the disk (or quota) being full: worth waiting for, as a restart would
/// meet the same full disk.
pub fn is_disk_full(e: &Error) -> bool {
    use std::io::ErrorKind;
    let io = match e {
        // sled wraps the OS error in one of its own that keeps the kind.
        Error::Sled(sled::Error::Io(io)) => io,
        Error::Tables(io) | Error::Blocks(io) | Error::EventIndex(io) => io,
        _ => return false,
    };
    matches!(io.kind(), ErrorKind::StorageFull | ErrorKind::QuotaExceeded)
        || matches!(io.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reopen_waits_for_every_reference_and_keeps_the_data() {
        let dir = tempfile::tempdir().unwrap();
        let db = check::open(dir.path(), 1 << 20).unwrap();
        let trees = Trees::open(&db, dir.path()).unwrap();
        trees
            .meta
            .insert(keys::CHECKPOINT_KEY, &7u64.to_be_bytes()[..])
            .unwrap();
        db.flush().unwrap();
        let live = Live::new(dir.path(), 1 << 20, Open { db, trees });
        let held = live.get().expect("open");
        // Held by a request: not closed, and given back for it to finish.
        assert!(!live.close(Duration::from_millis(30)));
        assert!(live.get().is_some());
        drop(held);
        assert!(live.close(Duration::from_millis(30)));
        assert!(live.get().is_none());
        // sled's lock is released: it opens again in the same process.
        let (trees, checkpoint) = live.reopen().unwrap();
        assert_eq!(checkpoint, Some(7));
        assert_eq!(
            trees.meta.get(keys::PROBE_KEY).unwrap().as_deref(),
            Some(&[][..])
        );
        assert!(live.get().is_some() && live.is_live());
    }

    #[test]
    fn only_a_full_disk_is_waited_out() {
        let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
        assert!(is_disk_full(&Error::Sled(sled::Error::Io(full))));
        let quota = std::io::Error::from_raw_os_error(libc::EDQUOT);
        assert!(is_disk_full(&Error::Sled(sled::Error::Io(quota))));
        let wrapped = std::io::Error::new(std::io::ErrorKind::StorageFull, "wrapped");
        assert!(is_disk_full(&Error::Sled(sled::Error::Io(wrapped))));
        let journal = std::io::Error::from_raw_os_error(libc::ENOSPC);
        assert!(is_disk_full(&Error::Tables(journal)));
        let denied = std::io::Error::from_raw_os_error(libc::EACCES);
        assert!(!is_disk_full(&Error::Sled(sled::Error::Io(denied))));
        assert!(!is_disk_full(&Error::Damaged("x".into())));
    }
}
