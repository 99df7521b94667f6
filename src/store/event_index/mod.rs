//! The event index: for each (project, distinct id), (project, event name) and
//! (project, property key), the event blocks holding such events, so a person's
//! events, the events of a name, those with a property, or any of them together
//! ([`lookup`]) read only those blocks, newest first and only as many as a page
//! needs ([`newest`]), instead of every block; each run keeps the places of the names
//! and property keys read in it ([`names`]), so a page of a name does not go through
//! all their blocks.
//! None of it
//! goes through sled. Blocks newer than the runs cover are held in memory
//! ([`recent`]), added by the compactor once a chunk's blocks are committed; past
//! [`FOLD_BLOCKS`] that part is written out as an immutable sorted [`run`] file by the
//! index's worker, and runs are merged size-tiered past [`MAX_RUNS`] ([`work`]). The
//! [`manifest`] names the runs and the block ids they cover; blocks above that are
//! found again at the next start (a crash loses only memory) and indexed by the
//! worker's build, which is also how a database written before the index (or before
//! its current format) gets one. Until the build is done, reads fall back to reading
//! every block.
//!
//! Files, in the database's `event_index/`: `MANIFEST` and `N.run`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

mod lookup;
pub mod manifest;
mod names;
mod newest;
pub mod recent;
pub mod run;
mod table;
mod work;
pub mod worker;

pub use lookup::Ask;
pub use newest::Newest;
pub use recent::{Kind, NewBlock};
pub use run::BlockRef;
pub use work::Step;

use manifest::Manifest;
use recent::Recent;
use run::Run;

/// The directory, inside the database's.
pub const DIR_NAME: &str = "event_index";
/// The recent part is folded into a run past this many blocks (about 100,000 events):
/// what a start after a crash reads again, and what a fold writes at once.
pub const FOLD_BLOCKS: usize = if cfg!(test) { 8 } else { 2048 };
/// Past this many runs the smallest are merged: a read looks in at most about this
/// many files.
pub const MAX_RUNS: usize = 8;
/// How many runs a merge takes, smallest first: each event's entry is rewritten
/// about log4 of the runs' growth times.
const MERGE_WIDTH: usize = 4;

/// The event index of one open database; clones share it.
#[derive(Clone)]
pub struct Index {
    shared: Arc<Shared>,
}

struct Shared {
    dir: PathBuf,
    /// Opened by the server (it folds, merges and builds) rather than by a command
    /// that only reads.
    writable: bool,
    /// The runs and the recent part: readers take it briefly to clone what they read,
    /// the compactor to add a chunk's blocks, the worker to swap in what it wrote.
    state: RwLock<State>,
    /// The build's blocks still to index, found on its first step; only the worker
    /// takes it.
    build: Mutex<Option<work::Build>>,
    /// The worker, woken when a recent part is frozen.
    worker: Mutex<Option<std::thread::Thread>>,
    /// Retention deleted blocks: the worker drops them from the runs.
    purge: AtomicBool,
    /// Why the index on disk was set aside at open, if it was.
    set_aside: Option<String>,
    /// The log has said that reads scan until the build is done.
    said_scanning: AtomicBool,
}

/// The open runs, each with its number.
type Runs = Vec<(u64, Arc<Run>)>;

struct State {
    manifest: Manifest,
    runs: Runs,
    active: Recent,
    /// A recent part being written as a run, read until the run is in `runs`.
    frozen: Option<Arc<Recent>>,
    /// Every stored block is in the runs or the recent part.
    complete: bool,
    /// Blocks from this id on were stored after the index opened, and added by the
    /// compactor; the build indexes those below it that the runs do not cover.
    start_next: u64,
    /// Every block from `start_next` up to this one (excluded) is in a run: recent
    /// parts folded while the build was under way, covered once it is done.
    folded_to: u64,
}

/// What `check` and the disk report say of the index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    pub runs: usize,
    pub entries: u64,
    pub blocks: u64,
    pub bytes: u64,
    /// Every block id below this is in the runs.
    pub covered: u64,
    /// Blocks stored before it opened that the runs do not cover: built in the
    /// background once a server opens the database.
    pub complete: bool,
    pub recent_blocks: usize,
    /// Why the index on disk was set aside (to be built again), if it was.
    pub set_aside: Option<String>,
}

fn io_err(e: sled::Error) -> std::io::Error {
    std::io::Error::other(e)
}

impl Index {
    /// The index of the database in `db_dir`, whose blocks from `next_block` on are
    /// yet to be stored. A manifest claiming blocks the database does not have (a
    /// database restored from a backup, which holds no index) or a run that does not
    /// read is dropped and the index built again, logged.
    pub fn open(db_dir: &Path, next_block: u64, writable: bool) -> std::io::Result<Index> {
        let dir = db_dir.join(DIR_NAME);
        if writable {
            std::fs::create_dir_all(&dir)?;
        }
        let mut set_aside = None;
        let (manifest, runs) = match load(&dir, next_block) {
            Ok(found) => found,
            Err(e) => {
                set_aside = Some(e.to_string());
                if e.kind() == std::io::ErrorKind::Unsupported {
                    tracing::info!(why = %e, "event index of an older format: building it again");
                } else {
                    tracing::warn!(error = %e, "event index unreadable: building it again");
                }
                if writable {
                    Manifest::default().store(&dir)?;
                }
                (Manifest::default(), Vec::new())
            }
        };
        if writable {
            manifest.remove_strays(&dir)?;
        }
        let mut index = Index::with(dir, manifest, runs, writable, next_block);
        if let Some(shared) = Arc::get_mut(&mut index.shared) {
            shared.set_aside = set_aside;
        }
        Ok(index)
    }

    /// An index that reads nothing and is never complete (reads scan), until the
    /// trees it belongs to are migrated and it is opened.
    pub fn unopened(db_dir: &Path) -> Index {
        Index::with(
            db_dir.join(DIR_NAME),
            Manifest::default(),
            Vec::new(),
            false,
            u64::MAX,
        )
    }

    fn with(
        dir: PathBuf,
        manifest: Manifest,
        runs: Runs,
        writable: bool,
        next_block: u64,
    ) -> Index {
        let complete = manifest.covered >= next_block;
        Index {
            shared: Arc::new(Shared {
                dir,
                writable,
                state: RwLock::new(State {
                    manifest,
                    runs,
                    active: Recent::default(),
                    frozen: None,
                    complete,
                    start_next: next_block,
                    folded_to: next_block,
                }),
                build: Mutex::new(None),
                worker: Mutex::new(None),
                purge: AtomicBool::new(false),
                said_scanning: AtomicBool::new(false),
                set_aside: None,
            }),
        }
    }

    /// About the bytes it keeps in memory: (the recent parts, the runs' page indexes
    /// and block tables).
    pub fn memory_bytes(&self) -> (u64, u64) {
        let state = self.state();
        let frozen = state.frozen.as_deref().map_or(0, Recent::footprint);
        let runs: usize = state.runs.iter().map(|(_, r)| r.resident_bytes()).sum();
        ((state.active.footprint() + frozen) as u64, runs as u64)
    }

    fn state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.shared.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn state_mut(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.shared.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Blocks the compactor is storing, added inside its chunk's transaction, so a
    /// read that sees them stored finds them here; [`Index::committed`] follows.
    pub fn add(&self, blocks: &[NewBlock]) {
        let mut s = self.state_mut();
        for b in blocks {
            s.active.add(b);
        }
    }

    /// The compactor committed every block added so far. Past [`FOLD_BLOCKS`] the
    /// recent part is frozen for the worker to write out, unless the previous one
    /// still is; only here, so a run never covers a block id not yet committed. While
    /// the build is under way too, so the recent part stays bounded however long the
    /// build takes.
    pub fn committed(&self) {
        let mut s = self.state_mut();
        let due = s.frozen.is_none() && s.active.blocks() >= FOLD_BLOCKS;
        if due && self.shared.writable {
            let next = Recent::sized_as(&s.active);
            let full = std::mem::replace(&mut s.active, next);
            s.frozen = Some(Arc::new(full));
            drop(s);
            self.wake();
        }
    }

    fn wake(&self) {
        let worker = self.shared.worker.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = worker.as_ref() {
            t.unpark();
        }
    }

    /// Retention deleted blocks; the worker drops them from the runs when it is idle.
    pub fn note_deleted(&self) {
        self.shared.purge.store(true, Ordering::SeqCst);
        self.wake();
    }

    /// The calling thread is the worker, woken by [`Index::committed`].
    pub fn set_worker(&self, thread: std::thread::Thread) {
        *self.shared.worker.lock().unwrap_or_else(|p| p.into_inner()) = Some(thread);
    }

    pub fn status(&self) -> Status {
        let s = self.state();
        let mut st = Status {
            runs: s.runs.len(),
            covered: s.manifest.covered,
            complete: s.complete,
            recent_blocks: s.active.blocks() + s.frozen.as_ref().map_or(0, |f| f.blocks()),
            set_aside: self.shared.set_aside.clone(),
            ..Status::default()
        };
        for (_, r) in &s.runs {
            st.entries += r.entries;
            st.blocks += r.blocks.len() as u64;
            st.bytes += r.bytes;
        }
        st
    }

    /// Read every run's pages through (for `check`); how many entries of distinct ids
    /// and of event names, summed over the runs (property keys are read, not counted).
    pub fn verify(&self) -> std::io::Result<(u64, u64)> {
        let runs: Vec<Arc<Run>> = self.state().runs.iter().map(|(_, r)| r.clone()).collect();
        let (mut distinct_ids, mut events) = (0, 0);
        for r in runs {
            for e in r.entries() {
                match e?.0.get(8).copied() {
                    Some(k) if k == Kind::Event as u8 => events += 1,
                    Some(k) if k == Kind::DistinctId as u8 => distinct_ids += 1,
                    _ => {}
                }
            }
        }
        Ok((distinct_ids, events))
    }

    /// Whether every stored block is indexed.
    pub fn is_complete(&self) -> bool {
        self.state().complete
    }
}

/// The manifest and its runs, checked against the database's next block id.
fn load(dir: &Path, next_block: u64) -> std::io::Result<(Manifest, Runs)> {
    let manifest = Manifest::load(dir)?;
    if manifest.covered > next_block {
        return Err(std::io::Error::other(format!(
            "it covers block ids up to {} but the database's next is {next_block}",
            manifest.covered
        )));
    }
    let mut runs = Vec::with_capacity(manifest.runs.len());
    for &n in &manifest.runs {
        let path = manifest::run_path(dir, n);
        let run = Run::open(&path)
            .map_err(|e| std::io::Error::other(format!("{}: {e}", path.display())))?;
        runs.push((n, Arc::new(run)));
    }
    Ok((manifest, runs))
}
