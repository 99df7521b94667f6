//! The appending end of the log, owned by the writer thread ([`super::writer`]): frames
//! entries into a buffer, writes them as one group and hands out what syncs it
//! ([`Appender::write`], [`Appender::synced`]; [`Appender::commit`] does both at
//! once), and rolls to a new segment when the current one is full or a write failed.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::segment::{checksum, segment_path, sync_dir, HEADER};
use super::Shared;
use crate::support::sync::lock;

/// The write buffer's capacity kept between groups.
const BUFFER_KEPT: usize = 1024 * 1024;
/// Open file descriptions of the current segment for the syncs of groups in flight
/// ([`Appender::write`]): the most groups the writer keeps in flight at once. The
/// disk here took 7,200 syncs a second one at a time, 26,400 four at a time
/// (`benches/fsync_probe.py`); capture ran fastest with four of 2, 3 and 4.
pub(super) const SYNC_FILES: usize = 4;

/// Appends entries; owned by the log's writer thread.
pub struct Appender {
    pub(super) shared: Arc<Shared>,
    /// The segment being written, and its first number.
    pub(super) file: Option<File>,
    /// More open file descriptions of that segment, one for each group whose sync may
    /// be in flight, taken in turn ([`Appender::write`] says why separate ones).
    pub(super) sync_files: Vec<Arc<File>>,
    /// Groups written so far, to take the sync descriptions in turn.
    pub(super) groups: usize,
    pub(super) first: Option<u64>,
    /// Where the next frame goes in `file`, and the file's size.
    pub(super) offset: u64,
    pub(super) capacity: u64,
    pub(super) next_seq: u64,
    /// Set after a failed write: the next entry starts a new segment.
    pub(super) must_roll: bool,
    /// Frames framed but not yet written to `file`.
    pub(super) buf: Vec<u8>,
    /// The number after the last entry known written and synced (None in a log that
    /// has held nothing): a new segment named above it records the numbers between
    /// as skipped.
    pub(super) written_end: Option<u64>,
    /// A clean stop's record of the log's end is on disk: it holds until a segment
    /// after that end is made, and is removed then, so a later crash is not taken
    /// for a clean stop.
    pub(super) clean_mark: bool,
}

impl Appender {
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The number the next entry will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Add one entry; returns its sequence number. It is durable after the next
    /// successful [`Appender::commit`]. On an error nothing of the open group is
    /// durable; call [`Appender::abandon`].
    pub fn push(&mut self, payload: &[u8]) -> io::Result<u64> {
        let frame_len = (HEADER + payload.len()) as u64;
        if !self.fits(frame_len) {
            self.roll(frame_len)?;
        }
        let seq = self.next_seq;
        self.buf
            .extend_from_slice(&(payload.len() as u32).to_le_bytes());
        self.buf
            .extend_from_slice(&checksum(seq, payload).to_le_bytes());
        self.buf.extend_from_slice(&seq.to_le_bytes());
        self.buf.extend_from_slice(payload);
        self.next_seq += 1;
        Ok(seq)
    }

    /// Whether frames of `bytes` in all go into the current segment without a roll.
    /// The writer lets syncs in flight finish before a group that does not fit, so
    /// that a roll (which syncs the segment and publishes the durable end) never
    /// runs ahead of a sync still in flight.
    pub fn fits(&self, bytes: u64) -> bool {
        !self.must_roll && self.file.is_some() && bytes <= self.room()
    }

    fn room(&self) -> u64 {
        self.capacity
            .saturating_sub(self.offset + self.buf.len() as u64)
    }

    /// Write what was pushed, without syncing it. Returns the number after the last
    /// entry written and the file description that syncs them; once that sync and
    /// every earlier group's succeeded, [`Appender::synced`] makes them durable.
    ///
    /// Each group whose sync may be in flight gets its own open file description of
    /// the segment (not a `dup` of one), opened before anything was written to it.
    /// Linux reports a writeback error once per file description (errseq): with one
    /// description shared by concurrent syncs, a later group's sync could take the
    /// report of an error in an earlier group's pages and the earlier sync return
    /// success, acknowledging data that never reached the disk. A description opened
    /// before the group's pages were written sees every error on them, whichever sync
    /// caused the writeback; an error in another group's pages fails it too, which
    /// errs on the safe side. The writer keeps at most `SYNC_FILES` groups in flight
    /// and finishes them in order, so the one taken in turn is never in use.
    pub fn write(&mut self) -> io::Result<(u64, Option<Arc<File>>)> {
        self.write_buffered()?;
        let file = match self.sync_files.len() {
            0 => None,
            n => Some(self.sync_files[self.groups % n].clone()),
        };
        self.groups = self.groups.wrapping_add(1);
        // A large group's buffer is not kept for the small ones that follow.
        if self.buf.capacity() > BUFFER_KEPT {
            self.buf = Vec::new();
        }
        Ok((self.next_seq, file))
    }

    /// The syncs of every group written up to `end` succeeded: their entries are
    /// durable, and the reader may return them.
    pub fn synced(&mut self, end: u64) {
        self.shared.durable.store(end, Ordering::Release);
        self.note_synced(end);
    }

    /// The durable end was moved to `end` (by the ledger of groups in flight, which
    /// publishes it): a later segment records the numbers above it as skipped.
    pub(super) fn note_synced(&mut self, end: u64) {
        self.written_end = Some(end);
    }

    /// Write what was pushed and sync it; every entry pushed so far is then durable.
    pub fn commit(&mut self) -> io::Result<()> {
        let (end, file) = self.write()?;
        self.shared.before_sync(end)?;
        if let Some(file) = file {
            file.sync_data()?;
        }
        self.synced(end);
        Ok(())
    }

    /// Forget a group whose push or commit failed: its entries are never reported
    /// durable, and the next entry starts a new segment with a higher number. The
    /// writer calls it only once no sync is in flight, so what is durable is known.
    pub fn abandon(&mut self) {
        self.buf.clear();
        self.must_roll = true;
        let Some(first) = self.first else {
            return;
        };
        // Its numbers and the failed group's are recorded as skipped at the next roll.
        if self.file.is_some() && first >= self.shared.durable.load(Ordering::Acquire) {
            // Nothing in this segment was ever durable: it holds the failed group and
            // nothing else, and the reader never opens it. Retire it now, so a disk that
            // keeps failing does not leave a segment behind for every failed group.
            // Its number stays used: the next segment is named above it.
            self.file = None;
            self.sync_files.clear();
            match self.shared.retire(&segment_path(&self.shared.dir, first)) {
                Ok(()) => lock(&self.shared.segments).retain(|&f| f != first),
                Err(e) => {
                    tracing::warn!(error = %e, segment = first, "cannot retire a log segment left by a failed write");
                }
            }
        }
    }

    /// At a clean stop, after the last commit: record where the log ends, so that a
    /// start can tell a segment cut short or deleted later from a write a crash cut
    /// short.
    pub fn mark_clean(&mut self) -> io::Result<()> {
        if let Some(end) = self.written_end {
            super::marks::write_clean(&self.shared.dir, end)?;
            self.clean_mark = true;
        }
        Ok(())
    }

    /// Whether the disk takes writes again after a failure, without writing an entry:
    /// sync the open segment, or the log's directory when none is open. The segment
    /// is synced through a description opened now: the failure was reported on
    /// another one, and each description is told of an error once, so one that has
    /// not been told yet would fail this probe for the same old error.
    pub fn probe(&mut self) -> io::Result<()> {
        #[cfg(test)]
        self.shared.injected_failure()?;
        match (&self.file, self.first) {
            (Some(_), Some(first)) => {
                File::open(segment_path(&self.shared.dir, first))?.sync_data()
            }
            _ => sync_dir(&self.shared.dir),
        }
    }

    /// Numbers between the last written entry and `first` will never be used:
    /// recorded before the segment named `first` takes an entry, so a reader tells
    /// the gap from a loss.
    fn record_skip(&mut self, first: u64) -> io::Result<()> {
        use super::marks::{add, append_skipped, uncovered};
        let Some(end) = self.written_end.filter(|&end| end < first) else {
            return Ok(());
        };
        let mut skipped = lock(&self.shared.skipped);
        if uncovered(&skipped, end, first).is_empty() {
            return Ok(());
        }
        append_skipped(&self.shared.dir, end, first)?;
        if self.must_roll {
            // A failed write's numbers, never acknowledged (not a start's jump).
            let failed = uncovered(&skipped, end, self.next_seq.min(first));
            let count: u64 = failed.iter().map(|(a, b)| b - a).sum();
            let losses = &self.shared.losses;
            losses.skipped.fetch_add(count, Ordering::Relaxed);
        }
        add(&mut skipped, end, first);
        Ok(())
    }

    fn write_buffered(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let Some(file) = &self.file else {
            return Err(io::Error::other("log has no open segment"));
        };
        file.write_all_at(&self.buf, self.offset)?;
        self.offset += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// Finish the current segment (write and sync it) and continue in a new one named
    /// after the next entry, big enough for a frame of `frame_len` bytes.
    fn roll(&mut self, frame_len: u64) -> io::Result<()> {
        if !self.must_roll {
            self.write_buffered()?;
            if let Some(file) = &self.file {
                file.sync_data()?;
            }
        }
        // Entries synced above are durable even if what follows fails.
        let durable = self.next_seq;
        if !self.must_roll && self.file.is_some() {
            self.written_end = Some(durable);
        }
        // Names only go up, even past a segment that got no entry.
        let first = self.next_seq.max(self.first.map_or(0, |f| f + 1));
        self.record_skip(first)?;
        let dir = &self.shared.dir;
        if self.clean_mark {
            super::marks::remove_clean(dir)?;
            self.clean_mark = false;
        }
        let path = segment_path(dir, first);
        if frame_len > self.shared.segment_bytes {
            // One outsized entry: a segment of its own size.
            self.shared.allocate_into(&path, frame_len)?;
        } else {
            self.shared.take_spare(&path)?;
        }
        sync_dir(dir)?;
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        self.capacity = file.metadata()?.len();
        // Opened before anything is written, so each sees every writeback error of
        // the segment's pages (see `write`).
        self.sync_files = (0..SYNC_FILES)
            .map(|_| File::open(&path).map(Arc::new))
            .collect::<io::Result<_>>()?;
        lock(&self.shared.segments).push_back(first);
        if !self.must_roll {
            self.shared.durable.store(durable, Ordering::Release);
        }
        self.file = Some(file);
        self.first = Some(first);
        self.next_seq = first;
        self.offset = 0;
        self.must_roll = false;
        Ok(())
    }
}
