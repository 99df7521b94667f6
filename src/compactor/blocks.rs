//! A chunk's event blocks, made on a thread of their own (`compactor-block`) while the
//! compactor's thread goes on with the rest of the chunk's transaction: once the
//! chunk's records are applied, their events are handed over here to be counted for the
//! console's rollups, sorted and cut into blocks, compressed, added to the event index,
//! appended to the block files and synced, while the transaction writes the persons
//! the chunk changed and journals them. The transaction then waits for the blocks and
//! stores their pointers, so a chunk still commits whole, in order, or not at all.
//!
//! One chunk at a time: the hand-over waits for the thread to take it (a channel that
//! holds nothing), and a transaction waits for its chunk's blocks however it returns
//! ([`Building`]'s drop), so no more than one chunk's events are ever held here. A
//! failed append or sync comes back as the error that aborts the chunk, which is then
//! read again; a panic here is raised again on the compactor's thread, which stops as
//! it would for its own. Without the thread (it could not be started) the blocks are
//! made on the compactor's thread, as they were before.

use std::collections::HashMap;
use std::io;
use std::panic;
use std::sync::mpsc::{self, Receiver};
use std::sync::OnceLock;
use std::time::Instant;

use super::phases::BlockTimes;

use crate::store::block::{self, Entry, Files, POINTER_LEN};
use crate::store::{event_index, keys, rollup};
use crate::support::worker::{Job, Worker};

/// One chunk's events, by project, and where their blocks go.
pub struct Chunk {
    pub entries: HashMap<u64, Vec<Entry>>,
    /// The id of the chunk's first block; the others follow it.
    pub first_block: u64,
    pub files: Files,
    pub index: event_index::Index,
}

/// A chunk's blocks, appended to the block files and synced.
pub struct Stored {
    /// Each block's key in `events` and its pointer, the value stored there.
    pub blocks: Vec<([u8; 24], [u8; POINTER_LEN])>,
    /// The id after the chunk's last block.
    pub next_block: u64,
    /// The console's rollups of the chunk's events.
    pub counted: rollup::Pending,
    /// How long the blocks took to make and to sync.
    pub times: BlockTimes,
}

/// Count, build, index, append and sync a chunk's blocks, on whichever thread.
pub fn store(chunk: Chunk) -> io::Result<Stored> {
    let started = Instant::now();
    let mut counted = rollup::Pending::default();
    for (project, list) in &chunk.entries {
        for e in list {
            let (name, who) = (&e.event, &e.distinct_id);
            counted.add(*project, e.timestamp, name, e.person_id, who, &e.properties);
        }
    }
    let mut next_block = chunk.first_block;
    let mut blocks = Vec::new();
    for (project, list) in chunk.entries {
        for built in block::build_indexed(list) {
            let block = event_index::BlockRef {
                id: next_block,
                project,
                newest: built.newest,
                oldest: built.oldest,
            };
            // Before the commit, so a read never finds a committed block missing from
            // the index; one naming a block that is not (yet) stored passes over it.
            chunk.index.add(&[event_index::NewBlock {
                block,
                distinct_ids: built.distinct_ids,
                events: built.events,
                properties: built.properties,
            }]);
            let pointer = chunk.files.append(&built.value)?;
            blocks.push((keys::block(project, built.newest, next_block), pointer));
            next_block += 1;
        }
    }
    // The blocks are on disk before the pointers can be (see block::files).
    let built = Instant::now();
    if !blocks.is_empty() {
        chunk.files.sync()?;
    }
    let times = BlockTimes {
        build: built - started,
        sync: built.elapsed(),
    };
    Ok(Stored {
        blocks,
        next_block,
        counted,
        times,
    })
}

/// What the thread sends back: the blocks, or the panic that stopped their making.
type Outcome = crate::support::worker::Outcome<io::Result<Stored>>;

/// What the thread runs: a chunk's [`store`], or what a test makes of it.
type Work = Box<dyn FnOnce() -> io::Result<Stored> + Send>;

/// The block thread, started at the first chunk; dropped, it finishes and is joined.
pub struct Builder {
    /// The nice value the thread runs at, the compactor's.
    nice: i32,
    thread: OnceLock<Option<Worker>>,
}

impl Builder {
    pub fn new(nice: i32) -> Builder {
        Builder {
            nice,
            thread: OnceLock::new(),
        }
    }

    /// Start storing `chunk`'s blocks on the thread (here, if it cannot be started).
    pub fn start(&self, chunk: Chunk) -> Building {
        self.run(Box::new(move || store(chunk)))
    }

    fn run(&self, work: Work) -> Building {
        let (reply, outcome) = mpsc::sync_channel(1);
        let job = Job::new(work, move |made: Outcome| {
            // The transaction waits for it; if it went, nothing is lost. The channel
            // holds one, so this send never waits.
            let _ = reply.send(made);
        });
        let thread = self.thread.get_or_init(|| {
            // Each hand-over waits for the thread to take the chunk.
            Worker::spawn("compactor-block", self.nice, 0)
                .inspect_err(|e| tracing::warn!(error = %e, "cannot start the compactor's block thread; blocks are made on the compactor's"))
                .ok()
        });
        let unsent = match thread {
            Some(thread) => thread.send(job).err(),
            None => Some(job),
        };
        if let Some(job) = unsent {
            job.run_here();
        }
        Building {
            outcome: Some(outcome),
        }
    }
}

/// A chunk's blocks on their way.
pub struct Building {
    outcome: Option<Receiver<Outcome>>,
}

impl Building {
    /// Wait for the blocks; a panic while making them is raised again here.
    pub fn wait(mut self) -> io::Result<Stored> {
        match self.outcome.take().map(|o| o.recv()) {
            Some(Ok(Ok(stored))) => stored,
            Some(Ok(Err(panic))) => panic::resume_unwind(panic),
            Some(Err(_)) | None => Err(io::Error::other("the compactor's block thread stopped")),
        }
    }
}

impl Drop for Building {
    /// A transaction that returns before it waited still waits here, so its chunk's
    /// blocks are done before another's start.
    fn drop(&mut self) {
        if let Some(outcome) = self.outcome.take() {
            let _ = outcome.recv();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::panic::AssertUnwindSafe;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use uuid::Uuid;

    use super::*;
    use crate::store::block::files::FILE_SYNC;

    /// `n` events of each of two projects, a minute apart, some persons each.
    fn entries(n: usize) -> HashMap<u64, Vec<Entry>> {
        let one = |project: u64, i: usize| Entry {
            timestamp: 1_700_000_000_000 + i as i64 * 60_000,
            created_at: 1_700_000_000_000 + i as i64 * 60_000 + 5,
            uuid: Uuid::from_u128((project as u128) << 64 | i as u128),
            person_id: Some(Uuid::from_u128(i as u128 % 13)),
            event: ["$pageview", "$autocapture"][i % 2].into(),
            distinct_id: format!("user-{}", i % 13),
            properties: format!(r#"{{"$current_url":"https://a.example/{i}","n":{i}}}"#).into(),
        };
        [1, 2]
            .into_iter()
            .map(|p| (p, (0..n).map(|i| one(p, i)).collect()))
            .collect()
    }

    fn chunk(dir: &std::path::Path, n: usize) -> Chunk {
        Chunk {
            entries: entries(n),
            first_block: 7,
            files: Files::open(dir).unwrap(),
            index: event_index::Index::unopened(dir),
        }
    }

    /// Each block's project and newest time (its key without the id, which follows
    /// the projects' order) and bytes.
    type Blocks = Vec<(Vec<u8>, Vec<u8>)>;

    /// What a chunk stored, read back: its blocks and their ids.
    fn read_back(files: &Files, stored: &Stored) -> (Blocks, Vec<u64>) {
        let (mut blocks, mut ids) = (Vec::new(), Vec::new());
        for (key, pointer) in &stored.blocks {
            let bytes = files.resolve(pointer).unwrap().into_owned();
            blocks.push((key[..16].to_vec(), bytes));
            ids.push(u64::from_be_bytes(key[16..].try_into().unwrap()));
        }
        blocks.sort();
        ids.sort();
        (blocks, ids)
    }

    #[test]
    fn blocks_made_on_the_thread_are_the_ones_made_here() {
        let (there, here) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let builder = Builder::new(0);
        let (on_thread, in_place) = (chunk(there.path(), 700), chunk(here.path(), 700));
        let (files_there, files_here) = (on_thread.files.clone(), in_place.files.clone());
        let a = builder.start(on_thread).wait().unwrap();
        let b = store(in_place).unwrap();
        assert!(matches!(builder.thread.get(), Some(Some(_))));
        // 700 events a minute apart span more than an hour: several blocks a project.
        assert!(a.blocks.len() >= 4, "{} blocks", a.blocks.len());
        assert_eq!(a.next_block, 7 + a.blocks.len() as u64);
        assert_eq!(a.next_block, b.next_block);
        let (blocks, ids) = read_back(&files_there, &a);
        assert_eq!(ids, (7..a.next_block).collect::<Vec<_>>());
        assert_eq!((blocks, ids), read_back(&files_here, &b));
    }

    #[test]
    fn chunks_are_made_on_the_block_thread() {
        let builder = Builder::new(0);
        let name = Arc::new(Mutex::new(None));
        let seen = name.clone();
        let building = builder.run(Box::new(move || {
            *seen.lock().unwrap() = std::thread::current().name().map(str::to_owned);
            store(chunk(tempfile::tempdir().unwrap().path(), 0))
        }));
        let stored = building.wait().unwrap();
        assert!(stored.blocks.is_empty());
        assert_eq!(stored.next_block, 7);
        assert_eq!(name.lock().unwrap().as_deref(), Some("compactor-block"));
    }

    #[test]
    fn a_failed_sync_on_the_thread_comes_back_and_the_next_chunk_is_stored() {
        let dir = tempfile::tempdir().unwrap();
        let builder = Builder::new(0);
        let first = chunk(dir.path(), 50);
        first.files.syncs().fail(FILE_SYNC, 0);
        let failed = builder.start(first).wait();
        assert!(failed.is_err());
        let again = chunk(dir.path(), 50);
        let files = again.files.clone();
        let stored = builder.start(again).wait().unwrap();
        assert!(!stored.blocks.is_empty());
        assert_eq!(read_back(&files, &stored).0.len(), stored.blocks.len());
    }

    #[test]
    fn a_panic_on_the_thread_is_raised_on_the_waiting_one() {
        let builder = Builder::new(0);
        let building = builder.run(Box::new(|| panic!("a block that cannot be made")));
        let Err(raised) = panic::catch_unwind(AssertUnwindSafe(|| building.wait())) else {
            panic!("the panic was not raised");
        };
        assert_eq!(
            raised.downcast_ref::<&str>(),
            Some(&"a block that cannot be made")
        );
        // The thread goes on with the next chunk.
        let dir = tempfile::tempdir().unwrap();
        assert!(!builder
            .start(chunk(dir.path(), 10))
            .wait()
            .unwrap()
            .blocks
            .is_empty());
    }

    #[test]
    fn a_transaction_returning_early_still_waits_for_its_blocks() {
        let builder = Builder::new(0);
        let done = Arc::new(AtomicBool::new(false));
        let finished = done.clone();
        let building = builder.run(Box::new(move || {
            std::thread::sleep(Duration::from_millis(50));
            finished.store(true, Ordering::SeqCst);
            store(chunk(tempfile::tempdir().unwrap().path(), 0))
        }));
        drop(building);
        assert!(done.load(Ordering::SeqCst));
    }
}
