//! The reading end of the log, owned by the compactor: entries in order up to the
//! durable end, across segments; damaged entries returned marked for the quarantine
//! and reading going on after them; gaps in the numbers that no recorded skip explains
//! logged at ERROR and counted; and releasing the segments the compactor has finished
//! with.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::marks::{covering, uncovered};
use super::segment::{next_intact, read_frame, segment_path, sync_dir, Frame, HEADER};
use super::Shared;
use crate::support::sync::lock;

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
    /// The current segment holds nothing more to read (its end was found damaged).
    exhausted: bool,
    /// Numbers below this were already reported lost: a chunk read again after a
    /// seek back does not report or count them twice.
    reported: u64,
}

impl Reader {
    pub(super) fn new(shared: Arc<Shared>, next: u64) -> io::Result<Reader> {
        let mut reader = Reader {
            shared,
            file: None,
            offset: 0,
            next,
            pending_seek: None,
            exhausted: false,
            reported: 0,
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
        if first > seq {
            // The oldest segment starts above where reading should: deleted.
            self.report_gap(seq, first, None);
        }
        let reported = std::mem::replace(&mut self.reported, u64::MAX);
        self.open_segment(first)?;
        self.next = first;
        while self.next < seq {
            if self.read_one()?.is_none() {
                break;
            }
        }
        self.reported = reported;
        self.next = self.next.max(seq);
        self.publish();
        Ok(())
    }

    fn open_segment(&mut self, first: u64) -> io::Result<()> {
        let file = File::open(segment_path(&self.shared.dir, first))?;
        let len = file.metadata()?.len();
        self.file = Some((file, first, len));
        self.offset = 0;
        self.exhausted = false;
        Ok(())
    }

    fn publish(&self) {
        self.shared.read.store(self.next, Ordering::Release);
    }

    /// Count the entries from `seq` on as waiting again ([`Shared::depth`]): the
    /// compactor read them ahead of applying them.
    pub fn waiting_from(&self, seq: u64) {
        self.shared
            .read
            .store(seq.min(self.next), Ordering::Release);
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
        let Some((file, _, len)) = &self.file else {
            return Ok(None);
        };
        // A segment never holds a number its successor starts at or below: whole
        // frames of a write a crash cut short can follow the torn one.
        if self.exhausted || following.is_some_and(|f| f <= self.next) {
            return Ok(None);
        }
        let bytes = match read_frame(file, self.offset, *len, self.next)? {
            // Whole, but of a group whose sync failed: refused, never acknowledged.
            Frame::Entry(_) if self.skipped(self.next) => return self.bad_frame(None, following),
            Frame::Entry(bytes) => bytes,
            Frame::End => return self.bad_frame(None, following),
            Frame::Damaged(bytes) => return self.bad_frame(Some(bytes), following),
        };
        self.offset += (HEADER + bytes.len()) as u64;
        self.next += 1;
        Ok(Some(Entry {
            seq: self.next - 1,
            bytes,
            intact: true,
        }))
    }

    /// Whether `seq` is a number no acknowledged entry has ([`super::marks`]).
    fn skipped(&self, seq: u64) -> bool {
        covering(&lock(&self.shared.skipped), seq).is_some()
    }

    /// The frame where entry `next` should be is not it: `damaged` holds what a frame
    /// with its number but a wrong checksum claims (None for no such frame).
    fn bad_frame(
        &mut self,
        damaged: Option<Option<Vec<u8>>>,
        following: Option<u64>,
    ) -> io::Result<Option<Entry>> {
        let seq = self.next;
        if let Some(end) = covering(&lock(&self.shared.skipped), seq) {
            // A write that failed or was cut short: never acknowledged, and what
            // follows it in this segment was never written.
            self.next = end.min(following.unwrap_or(end)).max(seq);
            self.exhausted = true;
            return Ok(None);
        }
        let durable = self.shared.durable.load(Ordering::Acquire);
        let limit = following.unwrap_or(u64::MAX).min(durable);
        let Some((file, first, len)) = &self.file else {
            return Ok(None);
        };
        let (first, len) = (*first, *len);
        let after = next_intact(file, self.offset + 1, len, seq + 1, limit)?;
        let claimed = damaged.flatten();
        let Some((at, found)) = after else {
            // Nothing intact after it in this segment: what is left up to the next
            // segment (or the durable end) is lost; a damaged entry's bytes still go
            // to the quarantine.
            self.exhausted = true;
            let end = following.unwrap_or(durable);
            if let Some(bytes) = claimed {
                self.next += 1;
                self.report_damage(first, seq, seq + 1, &bytes);
                if following.is_none() {
                    self.report_gap(seq + 1, end, Some(first));
                    self.next = end.max(self.next);
                }
                return Ok(Some(Entry {
                    seq,
                    bytes,
                    intact: false,
                }));
            }
            if following.is_none() && seq < end {
                self.report_gap(seq, end, Some(first));
                self.next = end;
            }
            return Ok(None);
        };
        // Damage with intact entries after it: quarantine what lies between (the
        // damaged entry's own bytes when its length holds) and read on.
        let bytes = match claimed {
            Some(bytes) if self.offset + (HEADER + bytes.len()) as u64 <= at => bytes,
            _ => {
                let mut raw = vec![0u8; (at - self.offset) as usize];
                file.read_exact_at(&mut raw, self.offset)?;
                raw
            }
        };
        self.report_damage(first, seq, found, &bytes);
        self.offset = at;
        self.next = found;
        Ok(Some(Entry {
            seq,
            bytes,
            intact: false,
        }))
    }

    /// Entries `from..to` of `segment` are damaged; their bytes, returned as entry
    /// `from`, go to the quarantine.
    fn report_damage(&mut self, segment: u64, from: u64, to: u64, bytes: &[u8]) {
        if to <= self.reported {
            return;
        }
        self.reported = to;
        let events = super::record::frame_len(bytes);
        self.shared
            .losses
            .quarantined
            .fetch_add(to - from, Ordering::Relaxed);
        tracing::error!(
            segment,
            from,
            to = to - 1,
            events = ?events,
            "damaged write-ahead log entries (checksum mismatch) with intact entries after them: their bytes are moved to the quarantine and reading goes on"
        );
    }

    /// Numbers `from..to` are not in the log: lost unless a recorded skip explains
    /// them.
    fn report_gap(&mut self, from: u64, to: u64, segment: Option<u64>) {
        let from = from.max(self.reported);
        if from >= to {
            return;
        }
        self.reported = to;
        let missing = uncovered(&lock(&self.shared.skipped), from, to);
        for (a, b) in missing {
            self.shared
                .losses
                .missing
                .fetch_add(b - a, Ordering::Relaxed);
            tracing::error!(
                from = a,
                to = b - 1,
                entries = b - a,
                after_segment = ?segment,
                "write-ahead log entries missing: a segment was deleted or cut short; the events they held (number unknown) are lost"
            );
        }
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
        let current = self.file.as_ref().map(|(_, f, _)| *f);
        if first > self.next {
            // Numbers a failed write abandoned or a start skipped are recorded;
            // any others are lost.
            self.report_gap(self.next, first, current);
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
        for first in released {
            self.shared.retire(&segment_path(&self.shared.dir, first))?;
        }
        Ok(count)
    }

    /// At a clean stop, with the writer and its spare maker stopped and the compactor's
    /// checkpoint `applied` durable: the spares are deleted (a start would delete them),
    /// and so is every segment when `applied` covers every durable entry, since a start
    /// reads from above the checkpoint and numbers new entries above the clean stop's
    /// end. Otherwise segments are released as usual. Returns the segments deleted.
    pub fn release_at_stop(&self, applied: Option<u64>) -> io::Result<usize> {
        if !self.shared.closed.load(Ordering::Acquire) {
            return Ok(0);
        }
        let released = match applied {
            Some(applied) if applied.saturating_add(1) >= self.shared.durable_end() => {
                let segments: Vec<u64> = lock(&self.shared.segments).drain(..).collect();
                for &first in &segments {
                    remove_if_present(&segment_path(&self.shared.dir, first))?;
                }
                segments.len()
            }
            Some(applied) => self.release(applied)?,
            None => 0,
        };
        // After the release, which may have kept a segment as a spare.
        let spares = std::mem::take(&mut lock(&self.shared.spares).ready);
        for spare in spares {
            remove_if_present(&spare)?;
        }
        sync_dir(&self.shared.dir)?;
        Ok(released)
    }

    /// Whether [`Reader::release`] of `applied` would release a segment: the oldest
    /// is applied in full. The compactor makes its checkpoint durable before that.
    pub fn releasable(&self, applied: u64) -> bool {
        let segments = lock(&self.shared.segments);
        segments
            .get(1)
            .is_some_and(|&next| next <= applied.saturating_add(1))
    }
}

fn remove_if_present(path: &std::path::Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
