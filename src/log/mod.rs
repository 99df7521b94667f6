//! The write-ahead log, the first stage after capture: an accepted event is durable
//! here before any 2xx is sent, and the compactor reads it back in order. [`writer`] is
//! the group-commit thread requests append through ([`Wal`]); [`record`] is the format
//! of one accepted event; the segment files are `segment.rs` (format), `appender.rs`
//! (writing), `reader.rs` (the compactor's end) and `spares.rs` (ready-made segments);
//! [`space`] refuses new events before the disk is full, [`backlog`] while the
//! compactor is too far behind. It depends on nothing of the
//! stages after it.
//!
//! The log's files: numbered entries appended to segment files, each made durable with
//! one `fdatasync`, read back in order by the compactor.
//!
//! The log lives in `<db>/wal/`, beside sled's files. A segment is named after the
//! sequence number of its first entry (`00000000000000000042.log`) and is written from
//! the start; each entry is one frame:
//!
//! ```text
//! length u32 LE | crc32 u32 LE | sequence u64 LE | payload (length bytes)
//! ```
//!
//! The CRC covers the sequence number and the payload. A segment's entries are numbered
//! one up from its name, so a reader knows the end of the written part by the first
//! frame that is not the next entry: zeros, a torn write, or a frame left from the
//! file's earlier use.
//!
//! Segments are allocated before they are written: zero-filled by a background thread,
//! or recycled from segments the compactor has finished with, so the file's size never
//! changes while entries are appended and `fdatasync` writes only the data. (When
//! neither is ready, a segment is allocated with `posix_fallocate` on the spot.) sled's
//! own flush woke seven IO threads and took its global lock once per group commit; this
//! log costs one write and one `fdatasync` per group.
//!
//! Guarantees:
//! - An entry is reported durable only after the `fdatasync` that covers it.
//! - Each start writes on in a new segment: the last one may end in a write a crash
//!   cut short, with whole frames of it after the torn one, so it is only read, and a
//!   reader never reads a number in one segment that the next one starts at or below.
//! - A segment is created (renamed into place, directory synced) only after the
//!   previous one is synced, so a later segment never outlives an earlier entry.
//! - A segment is recycled only once the compactor's checkpoint past its last entry is
//!   itself durable in sled (see [`Reader::release`]).
//! - At a clean stop, once the writer has stopped and the compactor's durable
//!   checkpoint covers every entry, the segments and spares are deleted
//!   ([`Reader::release_at_stop`]): a stopped server keeps no log it would not read.
//!   The clean stop's record of the log's end stays, so the next start numbers on
//!   above it, and neither it nor `check --db` calls the deleted entries missing:
//!   both count only what lies above the checkpoint.
//! - After a failed write the writer continues in a new segment: numbers are skipped,
//!   never reused, and recorded as skipped ([`marks`]) before the new segment is used.
//!   A failed group's frames may be whole on disk (its write went through, its sync
//!   failed): a reader never returns an entry under a skip.
//! - A gap in the numbers that no record of a skip explains is a loss, logged at ERROR
//!   and counted; a damaged entry with intact ones after it is damage: it is returned
//!   marked for the quarantine and reading goes on. Only a bad entry with nothing
//!   intact after it at the end of the newest segment is a torn write, and it is called
//!   never acknowledged only when a clean stop recorded the log's end below it.

mod appender;
pub mod backlog;
pub mod check;
pub mod copy;
mod marks;
mod reader;
pub mod record;
mod segment;
pub mod space;
mod spares;
pub mod writer;

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::support::sync::lock;

pub use appender::Appender;
pub use reader::{Entry, Reader};
pub use record::Record;
/// Also how the event block files are made ([`crate::store::block::files`]).
pub(crate) use segment::zero_fill;
pub use spares::Preparer;
pub use writer::Wal;

use segment::{scan_dir, segment_end, segment_path, sync_dir};
use spares::Spares;

/// The log's directory inside the database directory.
pub const DIR_NAME: &str = "wal";

/// Entries the log could not return whole, for metrics.
#[derive(Debug, Default)]
pub struct Losses {
    /// A bad entry at the end of the newest segment at a start: a write cut short.
    pub torn: AtomicU64,
    /// Numbers given up after a failed write (never acknowledged).
    pub skipped: AtomicU64,
    /// Damaged entries returned to the compactor for the quarantine.
    pub quarantined: AtomicU64,
    /// Numbers missing with no skip to explain them: deleted or cut-off segments,
    /// entries lost to damage without bytes to quarantine.
    pub missing: AtomicU64,
}

/// What the writer, the compactor's reader and the spare maker share. Its mutexes
/// guard lists that are consistent at every point a panic could interrupt them, so a
/// poisoned one is used as it is ([`lock`]).
pub struct Shared {
    dir: PathBuf,
    segment_bytes: u64,
    /// The first sequence number not yet durable: every entry below it is synced.
    durable: AtomicU64,
    /// The next entry the reader will return (the compactor's position).
    read: AtomicU64,
    /// First sequence numbers of the segments in use, oldest first.
    segments: Mutex<VecDeque<u64>>,
    /// Numbers no acknowledged entry has (merged ranges): skipped after a failed write
    /// or by a start. A gap or a bad entry under them is not a loss.
    skipped: Mutex<Vec<(u64, u64)>>,
    pub losses: Losses,
    spares: Mutex<Spares>,
    spare_wanted: Condvar,
    /// The writer and its spare maker have stopped: nothing is appended or prepared
    /// any more, so a compactor that has applied everything may delete every file.
    closed: AtomicBool,
    /// Test hook: how many of the next commits (and probes) fail, and how many were
    /// tried.
    #[cfg(test)]
    pub(crate) failing_commits: AtomicU64,
    #[cfg(test)]
    pub(crate) commits_tried: AtomicU64,
    /// Test hook: segment syncs that returned, and the first number none of them
    /// covered (every entry below it was written before a sync that returned).
    #[cfg(test)]
    pub(crate) syncs: AtomicU64,
    #[cfg(test)]
    pub(crate) synced_end: AtomicU64,
}

impl Shared {
    /// Entries written and synced but not yet returned by the reader.
    pub fn depth(&self) -> u64 {
        let durable = self.durable.load(Ordering::Acquire);
        durable.saturating_sub(self.read.load(Ordering::Acquire))
    }

    /// Segment files in use.
    pub fn segments(&self) -> usize {
        lock(&self.segments).len()
    }

    /// Bytes of the segment files in use (each is allocated whole before it is written).
    pub fn bytes(&self) -> u64 {
        (self.segments() as u64).saturating_mul(self.segment_bytes)
    }

    /// The first sequence number not yet durable.
    pub fn durable_end(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Entries below `end` are durable. Only after a sync that covered them returned:
    /// under test a mark ahead of the syncs fails at once, wherever it is moved.
    fn set_durable(&self, end: u64) {
        #[cfg(test)]
        assert!(
            end <= self.synced_end.load(Ordering::SeqCst),
            "the durable mark moved to {end} before a sync covered it (synced below {})",
            self.synced_end.load(Ordering::SeqCst)
        );
        self.durable.store(end, Ordering::Release);
    }

    /// A segment sync returned with every entry below `end` written before it.
    #[cfg(test)]
    fn synced(&self, end: u64) {
        self.syncs.fetch_add(1, Ordering::SeqCst);
        self.synced_end.fetch_max(end, Ordering::SeqCst);
    }

    /// The writer and its spare maker have stopped for good.
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }
}

/// Open the log in `dir` (created if missing). `floor` is the lowest sequence number
/// a new entry may take (above the compactor's checkpoint and any older log);
/// `checkpoint` is the last entry the compactor applied, where the reader starts.
///
/// Writing always continues in a new segment: the last one may end in a write a crash
/// cut short, with whole frames of that write after it, so it is only read.
pub fn open(
    dir: &Path,
    floor: u64,
    checkpoint: Option<u64>,
    segment_bytes: u64,
) -> io::Result<(Appender, Reader, Preparer)> {
    let created = !dir.exists();
    std::fs::create_dir_all(dir)?;
    if created {
        if let Some(parent) = dir.parent() {
            sync_dir(parent)?;
        }
    }
    let firsts = scan_dir(dir)?;
    let losses = Losses::default();
    let mut skipped = marks::load_skipped(dir)?;
    let clean = marks::read_clean(dir)?;
    // The end of the log: where the last segment holding an entry ends. Segments
    // after it hold none (a crash between making one and writing to it); they stay
    // until released, and new ones are named above them.
    let mut end = None;
    for &first in firsts.iter().rev() {
        let found = segment_end(&segment_path(dir, first), first)?;
        if found.next == first && found.bad_tail.is_none() {
            continue;
        }
        if let Some(bad) = found.bad_tail {
            report_tail(first, bad, clean, &losses);
        }
        end = Some(found.next);
        break;
    }
    if let Some(clean_end) = clean {
        let found = end.unwrap_or(0);
        if found > clean_end {
            // Whole entries past a clean stop's end: a group written whose sync then
            // failed (refused, never acknowledged) before the stop. Skipped like any
            // failed write, so no start reads them.
            marks::append_skipped(dir, clean_end, found)?;
            marks::add(&mut skipped, clean_end, found);
        }
        let applied = checkpoint.map_or(0, |c| c.saturating_add(1));
        if found < clean_end && applied < clean_end {
            tracing::error!(
                from = found.max(applied),
                to = clean_end - 1,
                "the write-ahead log stopped cleanly after entry {}, but its segments end before entry {}: entries are damaged or missing (a segment deleted or cut short); the compactor reports each as it reaches it",
                clean_end - 1,
                found.max(applied)
            );
        }
        // Every number below the clean end was written: reading goes up to it, so
        // whatever is missing there is found and reported rather than passed over.
        end = Some(found.max(clean_end));
    }
    // Where writing goes on: numbers from the log's end to the next segment are
    // skipped, and recorded so at the next roll.
    let written_end = end.or(checkpoint.map(|c| c.saturating_add(1)));
    let next = end.unwrap_or(floor);
    let next_seq = next.max(floor);
    // Where the compactor resumes; if the log holds nothing from there on (or
    // nothing at all, as in a new database, which has no checkpoint yet), at the
    // first entry still to be written.
    let read_from = checkpoint.map_or(0, |c| c.saturating_add(1));
    let (read_from, durable) = if read_from >= next || end.is_none() {
        (next_seq, next_seq)
    } else {
        (read_from, next)
    };
    // Numbers below the oldest segment that the checkpoint does not cover: a start
    // with no checkpoint reads from the oldest segment, and there is no gap to see.
    if checkpoint.is_none() {
        if let Some(&oldest) = firsts.first() {
            marks::add(&mut skipped, 0, oldest);
        }
    }
    let shared = Arc::new(Shared {
        dir: dir.to_path_buf(),
        segment_bytes,
        durable: AtomicU64::new(durable),
        read: AtomicU64::new(read_from),
        segments: Mutex::new(firsts.iter().copied().collect()),
        skipped: Mutex::new(skipped),
        losses,
        spares: Mutex::new(Spares::default()),
        #[cfg(test)]
        failing_commits: AtomicU64::new(0),
        #[cfg(test)]
        commits_tried: AtomicU64::new(0),
        #[cfg(test)]
        syncs: AtomicU64::new(0),
        // What the log held at the start was written by an earlier run, and numbers
        // up to `next_seq` it did not hold are skipped, never acknowledged.
        #[cfg(test)]
        synced_end: AtomicU64::new(next_seq.max(durable)),
        spare_wanted: Condvar::new(),
        closed: AtomicBool::new(false),
    });
    let appender = Appender {
        shared: shared.clone(),
        file: None,
        // Not written to again, but the next segment's name goes above it.
        first: firsts.last().copied(),
        offset: 0,
        capacity: 0,
        next_seq,
        must_roll: false,
        buf: appender::new_buffer(),
        written_end,
        clean_mark: clean.is_some(),
    };
    let reader = Reader::new(shared.clone(), read_from)?;
    let preparer = Preparer::start(shared)?;
    Ok((appender, reader, preparer))
}

/// A bad entry with nothing intact after it at the end of the newest segment: the write
/// a stop cut short. Never acknowledged only if a clean stop recorded the end below it;
/// after a crash the disk cannot tell whether its sync had completed.
fn report_tail(segment: u64, entry: u64, clean: Option<u64>, losses: &Losses) {
    match clean {
        Some(clean_end) if entry >= clean_end => {
            losses.torn.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                entry,
                segment,
                "the write-ahead log ends in a partly written entry after the end a clean stop recorded; it was never acknowledged"
            );
        }
        // Below a clean end: damage, reported by the reader when it gets there.
        Some(_) => {}
        None => {
            losses.torn.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                entry,
                segment,
                "the write-ahead log ends in an entry that does not check out, with nothing intact after it: the write in progress when the server stopped without a clean shutdown; it was acknowledged only if its sync had completed, which the disk cannot tell. Its bytes stay in the segment until it is released"
            );
        }
    }
}

/// A log opened without its spare maker, so a test controls what is on disk: spares
/// are then made as a roll needs them.
#[cfg(test)]
pub(crate) fn open_for_tests(
    dir: &Path,
    floor: u64,
    checkpoint: Option<u64>,
    segment_bytes: u64,
) -> (Appender, Reader) {
    let (appender, reader, preparer) =
        open(dir, floor, checkpoint, segment_bytes).expect("the log opens");
    preparer.stop();
    (appender, reader)
}

/// Every durable entry from the reader's position, as (number, bytes); each must be
/// intact.
#[cfg(test)]
pub(crate) fn read_intact(reader: &mut Reader) -> Vec<(u64, Vec<u8>)> {
    let entries = reader.next_entries(|_| false).expect("the log reads");
    assert!(entries.iter().all(|e| e.intact), "{entries:?}");
    entries.into_iter().map(|e| (e.seq, e.bytes)).collect()
}

#[cfg(test)]
mod tests;

#[cfg(test)]
#[path = "tests/loss.rs"]
mod loss_tests;

#[cfg(test)]
#[path = "tests/sync.rs"]
mod sync_tests;
