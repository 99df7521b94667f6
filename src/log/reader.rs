//! The reading end of the log, owned by the compactor: entries in order up to the
//! durable end, across segments, with damaged entries reported rather than skipped
//! silently; and releasing the segments the compactor has finished with.

use std::fs::File;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::segment::{read_frame, segment_path, Frame, HEADER};
use super::Shared;
use crate::sync::lock;

/// One entry read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub seq: u64,
    pub bytes: Vec<u8>,
    /// False when its checksum did not match: damage on the disk. Its bytes are for an
    /// operator to inspect, never to apply.
    pub intact: bool,
}

/// Reads entries in order for the compactor, up to the durable end.
pub struct Reader {
    shared: Arc<Shared>,
    /// The segment being read, its first number and size.
    file: Option<(File, u64, u64)>,
    offset: u64,
    /// The next entry to return.
    next: u64,
    /// A seek that failed, tried again before anything more is read.
    pending_seek: Option<u64>,
}

impl Reader {
    pub(super) fn new(shared: Arc<Shared>, next: u64) -> io::Result<Reader> {
        let mut reader = Reader {
            shared,
            file: None,
            offset: 0,
            next,
            pending_seek: None,
        };
        reader.seek(next)?;
        Ok(reader)
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The number of the next entry [`Reader::next_entries`] returns.
    pub fn position(&self) -> u64 {
        self.pending_seek.unwrap_or(self.next)
    }

    /// Position at entry `seq`: in the last segment that starts at or before it. The
    /// compactor reads a failed chunk again from its first entry. If this fails, the
    /// next read tries it again first.
    pub fn seek(&mut self, seq: u64) -> io::Result<()> {
        self.pending_seek = Some(seq);
        self.position_at(seq)?;
        self.pending_seek = None;
        Ok(())
    }

    fn position_at(&mut self, seq: u64) -> io::Result<()> {
        let first = {
            let segments = lock(&self.shared.segments);
            segments
                .iter()
                .rev()
                .find(|&&f| f <= seq)
                .or(segments.front())
                .copied()
        };
        self.file = None;
        self.offset = 0;
        self.next = seq;
        let Some(first) = first else {
            return Ok(());
        };
        self.open_segment(first)?;
        self.next = first;
        while self.next < seq {
            if self.read_one()?.is_none() {
                break;
            }
        }
        self.next = self.next.max(seq);
        self.publish();
        Ok(())
    }

    fn open_segment(&mut self, first: u64) -> io::Result<()> {
        let file = File::open(segment_path(&self.shared.dir, first))?;
        let len = file.metadata()?.len();
        self.file = Some((file, first, len));
        self.offset = 0;
        Ok(())
    }

    fn publish(&self) {
        self.shared.read.store(self.next, Ordering::Release);
    }

    /// The first number of the segment after the current one, if there is one yet.
    fn following_segment(&self) -> Option<u64> {
        let current = self.file.as_ref().map(|(_, first, _)| *first);
        lock(&self.shared.segments)
            .iter()
            .copied()
            .find(|&f| current.is_none_or(|c| f > c))
    }

    /// The next entry of the current segment, if it holds it.
    fn read_one(&mut self) -> io::Result<Option<Entry>> {
        let following = self.following_segment();
        let Some((file, first, len)) = &self.file else {
            return Ok(None);
        };
        // A segment never holds a number its successor starts at or below: whole
        // frames of a write a crash cut short can follow the torn one.
        if following.is_some_and(|f| f <= self.next) {
            return Ok(None);
        }
        let seq = self.next;
        let bytes = match read_frame(file, self.offset, *len, seq)? {
            Frame::Entry(bytes) => bytes,
            Frame::End => return Ok(None),
            Frame::Damaged(bytes) => {
                if lock(&self.shared.interrupted).contains(first) {
                    // The write that was cut short (never acknowledged).
                    return Ok(None);
                }
                // Synced entries do not tear: this is damage on the disk. Skip just
                // this entry when what follows it is where the next one should be.
                let after = bytes
                    .as_ref()
                    .map(|b| self.offset + (HEADER + b.len()) as u64);
                let skippable = match after {
                    Some(after) => {
                        following == Some(seq + 1)
                            || matches!(read_frame(file, after, *len, seq + 1)?, Frame::Entry(_))
                    }
                    None => false,
                };
                match (bytes, after) {
                    (Some(bytes), Some(after)) if skippable => {
                        tracing::error!(
                            entry = seq,
                            segment = first,
                            "damaged write-ahead log entry (checksum mismatch): skipped, its bytes moved to the quarantine"
                        );
                        self.offset = after;
                        self.next += 1;
                        return Ok(Some(Entry {
                            seq,
                            bytes,
                            intact: false,
                        }));
                    }
                    _ => {
                        tracing::error!(
                            entry = seq,
                            segment = first,
                            "damaged write-ahead log entry (checksum mismatch): the rest of its segment is skipped"
                        );
                        return Ok(None);
                    }
                }
            }
        };
        self.offset += (HEADER + bytes.len()) as u64;
        self.next += 1;
        Ok(Some(Entry {
            seq,
            bytes,
            intact: true,
        }))
    }

    /// Durable entries in order, from the reader's position, until `enough` says the
    /// entries so far are enough. After an I/O error, what was read before it is
    /// returned, and the error comes back at the next call.
    pub fn next_entries(
        &mut self,
        mut enough: impl FnMut(&Entry) -> bool,
    ) -> io::Result<Vec<Entry>> {
        if let Some(seq) = self.pending_seek {
            self.seek(seq)?;
        }
        let mut out = Vec::new();
        let result = self.read_into(&mut out, &mut enough);
        self.publish();
        match result {
            Err(e) if out.is_empty() => Err(e),
            _ => Ok(out),
        }
    }

    fn read_into(
        &mut self,
        out: &mut Vec<Entry>,
        enough: &mut impl FnMut(&Entry) -> bool,
    ) -> io::Result<()> {
        while self.next < self.shared.durable.load(Ordering::Acquire) {
            match self.read_one()? {
                Some(entry) => {
                    let done = enough(&entry);
                    out.push(entry);
                    if done {
                        return Ok(());
                    }
                }
                None => {
                    if !self.advance_segment()? {
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }

    /// The current segment holds no more: move to the next one. Entries the writer
    /// abandoned after a failed write leave a gap in the numbers, skipped here.
    fn advance_segment(&mut self) -> io::Result<bool> {
        let Some(first) = self.following_segment() else {
            return Ok(false);
        };
        if first > self.next {
            // Numbers a failed write abandoned, or skipped at a restart.
            tracing::debug!(from = self.next, to = first - 1, "log numbers skipped");
        }
        self.open_segment(first)?;
        self.next = self.next.max(first);
        Ok(true)
    }

    /// The compactor's checkpoint `applied` is durable: segments whose every entry is
    /// at or below it are recycled as spares or deleted. Returns how many.
    pub fn release(&self, applied: u64) -> io::Result<usize> {
        let mut released = Vec::new();
        {
            let mut segments = lock(&self.shared.segments);
            while segments.len() >= 2 && segments[1] <= applied.saturating_add(1) {
                if let Some(first) = segments.pop_front() {
                    released.push(first);
                }
            }
        }
        let count = released.len();
        lock(&self.shared.interrupted).retain(|f| !released.contains(f));
        for first in released {
            self.shared.retire(&segment_path(&self.shared.dir, first))?;
        }
        Ok(count)
    }

    /// Segments that hold nothing the reader still needs: everything before its
    /// current segment. The compactor makes its checkpoint durable before releasing.
    pub fn releasable(&self) -> bool {
        let current = self.file.as_ref().map(|(_, first, _)| *first);
        let segments = lock(&self.shared.segments);
        match (segments.front(), current) {
            (Some(&oldest), Some(current)) => oldest < current,
            _ => false,
        }
    }
}
