//! The appending end of the log, owned by the writer thread ([`super::writer`]): frames
//! entries into a buffer, writes and syncs them as one group ([`Appender::commit`]),
//! and rolls to a new segment when the current one is full or a write failed.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::segment::{checksum, segment_path, sync_dir, HEADER};
use super::Shared;
use crate::support::sync::lock;

/// The write buffer's capacity when made: past the blocks mimalloc packs into shared
/// pages (up to 64 KiB with version 2, 512 KiB with 3), so it has a page of its own and
/// never grows through the sizes between.
const BUFFER_START: usize = crate::support::reuse::START_BYTES;
/// The write buffer's capacity kept between groups, at most.
const BUFFER_KEPT: usize = 4 * 1024 * 1024;

/// Appends entries; owned by the log's writer thread.
pub struct Appender {
    pub(super) shared: Arc<Shared>,
    /// The segment being written, and its first number.
    pub(super) file: Option<File>,
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
        let room = self
            .capacity
            .saturating_sub(self.offset + self.buf.len() as u64);
        if self.must_roll || self.file.is_none() || frame_len > room {
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

    /// Write what was pushed and sync it; every entry pushed so far is then durable.
    pub fn commit(&mut self) -> io::Result<()> {
        let group = self.buf.len();
        self.write_buffered()?;
        self.sync_segment()?;
        self.shared.set_durable(self.next_seq);
        self.written_end = Some(self.next_seq);
        self.buf = kept_buffer(std::mem::take(&mut self.buf), group);
        Ok(())
    }

    /// Forget a group whose push or commit failed: its entries are never reported
    /// durable, and the next entry starts a new segment with a higher number.
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
    /// sync the open segment, or the log's directory when none is open.
    pub fn probe(&mut self) -> io::Result<()> {
        #[cfg(test)]
        self.injected_failure()?;
        match &self.file {
            Some(file) => file.sync_data(),
            None => sync_dir(&self.shared.dir),
        }
    }

    /// Sync what was written to the open segment: the one call that makes entries
    /// durable, so tests see every such sync here (a failure injected after the write,
    /// and how far each sync that returned reached).
    fn sync_segment(&self) -> io::Result<()> {
        #[cfg(test)]
        self.injected_failure()?;
        if let Some(file) = &self.file {
            file.sync_data()?;
            #[cfg(test)]
            self.shared.synced(self.next_seq);
        }
        Ok(())
    }

    #[cfg(test)]
    fn injected_failure(&self) -> io::Result<()> {
        let shared = &self.shared;
        shared.commits_tried.fetch_add(1, Ordering::SeqCst);
        let failing = shared.failing_commits.load(Ordering::SeqCst);
        if failing > 0 {
            shared.failing_commits.store(failing - 1, Ordering::SeqCst);
            return Err(io::Error::other("injected failure"));
        }
        Ok(())
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
            self.sync_segment()?;
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
        lock(&self.shared.segments).push_back(first);
        if !self.must_roll {
            self.shared.set_durable(durable);
        }
        self.file = Some(file);
        self.first = Some(first);
        self.next_seq = first;
        self.offset = 0;
        self.must_roll = false;
        Ok(())
    }
}

/// A new write buffer, made at [`BUFFER_START`] capacity.
pub(super) fn new_buffer() -> Vec<u8> {
    Vec::with_capacity(BUFFER_START)
}

/// The buffer to keep after a group of `group` bytes was written from `buf`: `buf`
/// itself, cleared, so the next group writes into resident pages, unless it grew past
/// [`BUFFER_KEPT`] or the group used under a quarter of a capacity above
/// [`BUFFER_START`] (the ingest slowed down): then a new one, so a burst's buffer is not
/// kept through the quiet after it.
fn kept_buffer(mut buf: Vec<u8>, group: usize) -> Vec<u8> {
    let capacity = buf.capacity();
    if capacity > BUFFER_KEPT || (capacity > BUFFER_START && group < capacity / 4) {
        return new_buffer();
    }
    buf.clear();
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_s_buffer_is_kept_up_to_its_bound() {
        let mut buf = new_buffer();
        let at = buf.as_ptr();
        buf.extend_from_slice(&[1; 1000]);
        let kept = kept_buffer(buf, 1000);
        assert!(kept.is_empty());
        assert_eq!((kept.as_ptr(), kept.capacity()), (at, BUFFER_START));
        // A busy group grows it; the next one of about its size keeps it.
        let mut buf = kept;
        buf.resize(3 * BUFFER_START, 1);
        let grown = buf.capacity();
        let kept = kept_buffer(buf, 3 * BUFFER_START);
        assert_eq!(kept.capacity(), grown);
    }

    #[test]
    fn a_huge_group_then_a_small_one_leaves_the_buffer_under_its_bound() {
        let mut buf = new_buffer();
        buf.resize(3 * BUFFER_KEPT, 1);
        let after_huge = kept_buffer(buf, 3 * BUFFER_KEPT);
        assert!(after_huge.capacity() <= BUFFER_KEPT);
        // A burst's buffer, then a quiet group: back to the starting capacity.
        let mut buf = after_huge;
        buf.resize(BUFFER_KEPT, 1);
        let after_small = kept_buffer(buf, 100);
        assert_eq!(after_small.capacity(), BUFFER_START);
    }
}
