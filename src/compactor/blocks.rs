//! A chunk's event blocks, made on a thread of their own (`compactor-block`) while the
//! compactor's thread applies the chunk's records: the events are handed over in parts
//! as they are applied ([`Building::add`]), each part counted for the console's
//! rollups, sorted and cut into blocks, compressed, added to the event index and
//! appended to the block files while the next part is applied. Each project's last
//! block of a part is left open to the next part's events, so events handed over in
//! time order are cut as they would be all at once. Once every record is applied the
//! transaction hands over the end ([`Building::end`]): the last blocks are made and
//! the files synced while it writes the persons the chunk changed, journals them and
//! reads the log's next chunk. It then waits ([`Building::wait`]) and stores their
//! pointers, so a chunk still commits whole, in order, or not at all.
//!
//! One chunk at a time, a few parts in flight: the hand-over of a chunk waits for the
//! thread to take it (a channel that holds nothing), a part waits once
//! [`PARTS_QUEUED`] are queued, and a transaction waits for its chunk's blocks however
//! it returns ([`Building`]'s drop). A transaction that returns before it waited (an
//! abort, or a conflict sled retries) gives its chunk up: before the end the thread
//! stops making it and syncs nothing; after it the blocks are made and synced but
//! never named. Either way what it counted is dropped, and a retry
//! starts over from the same block id (the event index takes a block added again in
//! its latest place; appended bytes are never named). A failed append or sync comes
//! back as the error that aborts the chunk, which is then read again; a panic here is
//! raised again on the compactor's thread, which stops as it would for its own.
//! Without the thread (it could not be started) the blocks are made on the compactor's
//! thread as the parts come, as they were before.

use std::collections::HashMap;
use std::io;
use std::panic;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use super::phases::BlockTimes;

use crate::store::block::{self, Built, Entry, Files, POINTER_LEN};
use crate::store::{event_index, keys, rollup};
use crate::support::sync::lock;
use crate::support::worker::{Job, Worker};

/// Parts handed over and not yet taken by the thread, at most; with the one it makes
/// and each project's open block, what a chunk holds here is bounded.
const PARTS_QUEUED: usize = 2;

/// Where a chunk's blocks go.
pub struct Chunk {
    /// The id of the chunk's first block; the others follow it.
    pub first_block: u64,
    pub files: Files,
    pub index: event_index::Index,
}

/// Some of a chunk's events, by project.
pub type Part = HashMap<u64, Vec<Entry>>;

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

/// A chunk's blocks being made, part after part, on whichever thread.
struct Making {
    chunk: Chunk,
    /// Each project's last block, open to the next part's events.
    open: HashMap<u64, Vec<Entry>>,
    stored: Stored,
}

impl Making {
    fn new(chunk: Chunk) -> Making {
        let next_block = chunk.first_block;
        Making {
            chunk,
            open: HashMap::new(),
            stored: Stored {
                blocks: Vec::new(),
                next_block,
                counted: rollup::Pending::default(),
                times: BlockTimes::default(),
            },
        }
    }

    /// Count a part's events, and make every block of it but each project's last.
    fn part(&mut self, part: Part) -> io::Result<()> {
        let started = Instant::now();
        for (project, list) in part {
            for e in &list {
                let (name, who) = (&e.event, &e.distinct_id);
                let counted = &mut self.stored.counted;
                counted.add(project, e.timestamp, name, e.person_id, who, &e.properties);
            }
            let open = self.open.entry(project).or_default();
            open.extend(list);
            for built in block::build_open(open) {
                self.store(project, built)?;
            }
        }
        self.stored.times.build += started.elapsed();
        Ok(())
    }

    /// Index and append one block.
    fn store(&mut self, project: u64, built: Built) -> io::Result<()> {
        let id = self.stored.next_block;
        let block = event_index::BlockRef {
            id,
            project,
            newest: built.newest,
            oldest: built.oldest,
        };
        // Before the commit, so a read never finds a committed block missing from the
        // index; one naming a block that is not (yet) stored passes over it.
        self.chunk.index.add(&[event_index::NewBlock {
            block,
            distinct_ids: built.distinct_ids,
            events: built.events,
            properties: built.properties,
        }]);
        let pointer = self.chunk.files.append(&built.value)?;
        let key = keys::block(project, built.newest, id);
        self.stored.blocks.push((key, pointer));
        self.stored.next_block += 1;
        Ok(())
    }

    /// Make the open blocks and sync: the chunk's blocks are on disk before their
    /// pointers can be (see block::files).
    fn finish(mut self) -> io::Result<Stored> {
        let started = Instant::now();
        for (project, open) in std::mem::take(&mut self.open) {
            for built in block::build_indexed(open) {
                self.store(project, built)?;
            }
        }
        let built = Instant::now();
        if !self.stored.blocks.is_empty() {
            self.chunk.files.sync()?;
        }
        let times = &mut self.stored.times;
        times.build += built - started;
        times.sync = built.elapsed();
        Ok(self.stored)
    }
}

/// What the compactor hands over for a chunk, in order: parts, then the end. A chunk
/// whose end never comes was given up.
enum Handed {
    Part(Part),
    End,
}

/// Make a chunk's blocks from what comes in `handed`.
fn make(chunk: Chunk, handed: Receiver<Handed>) -> io::Result<Stored> {
    let mut making = Making::new(chunk);
    loop {
        match handed.recv() {
            Ok(Handed::Part(part)) => making.part(part)?,
            Ok(Handed::End) => return making.finish(),
            Err(_) => return Err(io::Error::other("the chunk was given up")),
        }
    }
}

/// What the thread sends back: the blocks, or the panic that stopped their making.
type Outcome = crate::support::worker::Outcome<io::Result<Stored>>;

/// What the thread runs for a chunk: [`make`], or what a test makes of it.
type Work = Box<dyn FnOnce(Receiver<Handed>) -> io::Result<Stored> + Send>;

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

    /// Start making `chunk`'s blocks on the thread (here, if it cannot be started),
    /// from the parts to be handed over.
    pub fn start(&self, chunk: Chunk) -> Building {
        self.run(Box::new(move |handed| make(chunk, handed)))
    }

    fn run(&self, work: Work) -> Building {
        let (hand, handed) = mpsc::sync_channel(PARTS_QUEUED);
        let (reply, outcome) = mpsc::sync_channel(1);
        // The work waits here until the thread takes it, so a chunk the thread cannot
        // take (it could not start, or it is gone) is made on this thread instead.
        let kept = Arc::new(Mutex::new(Some((work, handed))));
        let taken = kept.clone();
        let job = Job::new(
            move || {
                let kept = lock(&taken).take();
                match kept {
                    Some((work, handed)) => work(handed),
                    None => Err(io::Error::other(
                        "the chunk was made on the compactor's thread",
                    )),
                }
            },
            move |made: Outcome| {
                // The transaction waits for it; if it went, nothing is lost. The channel
                // holds one, so this send never waits.
                let _ = reply.send(made);
            },
        );
        let thread = self.thread.get_or_init(|| {
            // Each hand-over waits for the thread to take the chunk.
            Worker::spawn("compactor-block", self.nice, 0)
                .inspect_err(|e| tracing::warn!(error = %e, "cannot start the compactor's block thread; blocks are made on the compactor's"))
                .ok()
        });
        let sent = thread.as_ref().is_some_and(|t| t.send(job).is_ok());
        // Not sent, the job was dropped unrun, so the work is still here.
        let unsent = match sent {
            true => None,
            false => lock(&kept).take(),
        };
        match unsent {
            Some((work, _)) => Building {
                hand: None,
                outcome: None,
                here: Some((work, Vec::new())),
            },
            None => Building {
                hand: Some(hand),
                outcome: Some(outcome),
                here: None,
            },
        }
    }
}

/// A chunk's blocks on their way.
pub struct Building {
    /// Parts to the thread; `None` once the end is handed over.
    hand: Option<SyncSender<Handed>>,
    outcome: Option<Receiver<Outcome>>,
    /// Without the thread: the work and its parts, made when waited for.
    here: Option<(Work, Vec<Part>)>,
}

impl Building {
    /// Hand over some of the chunk's events; waits while [`PARTS_QUEUED`] are. After a
    /// failure on the thread the part is dropped: [`Building::wait`] reports it.
    pub fn add(&mut self, part: Part) {
        if part.is_empty() {
            return;
        }
        if let Some(hand) = &self.hand {
            let _ = hand.send(Handed::Part(part));
        } else if let Some((_, parts)) = &mut self.here {
            parts.push(part);
        }
    }

    /// Every part is handed over: the thread makes the last blocks and syncs the files
    /// while the transaction goes on (the persons written, the next chunk read), until
    /// it waits. A transaction that fails after this still waits for them, and names
    /// none of them.
    pub fn end(&mut self) {
        if let Some(hand) = self.hand.take() {
            let _ = hand.send(Handed::End);
        }
    }

    /// Hand over the end, if not yet, and wait for the blocks; a panic while making
    /// them is raised again here.
    pub fn wait(mut self) -> io::Result<Stored> {
        if let Some((work, parts)) = self.here.take() {
            let (hand, handed) = mpsc::channel();
            for part in parts {
                let _ = hand.send(Handed::Part(part));
            }
            let _ = hand.send(Handed::End);
            return work(handed);
        }
        self.end();
        match self.outcome.take().map(|o| o.recv()) {
            Some(Ok(Ok(stored))) => stored,
            Some(Ok(Err(panic))) => panic::resume_unwind(panic),
            Some(Err(_)) | None => Err(io::Error::other("the compactor's block thread stopped")),
        }
    }
}

impl Drop for Building {
    /// A transaction that returns before it waited gives its chunk up and still waits
    /// here for the thread to stop, so its chunk's blocks are done with before
    /// another's start.
    fn drop(&mut self) {
        drop(self.hand.take());
        if let Some(outcome) = self.outcome.take() {
            let _ = outcome.recv();
        }
    }
}

#[cfg(test)]
#[path = "tests/blocks.rs"]
mod tests;
