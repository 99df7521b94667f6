//! The write-ahead log's files: numbered entries appended to segment files, each made
//! durable with one `fdatasync`, read back in order by the compactor.
//!
//! The log lives in `<db>/wal/`, beside sled's files. A segment is named after the
//! sequence number of its first entry (`00000000000000000042.log`) and is written from
//! the start; each entry is one frame:
//!
//! ```text
//! length u32 LE | crc32 u32 LE | sequence u64 LE | payload (length bytes)
//! ```
//!
//! The CRC covers the sequence number and the payload. A segment's entries are
//! numbered one up from its name, so a reader knows the end of the written part by
//! the first frame that is not the next entry: zeros, a torn write, or a frame left
//! from the file's earlier use.
//!
//! Segments are allocated before they are written: zero-filled by a background thread,
//! or recycled from segments the compactor has finished with, so the file's size never
//! changes while entries are appended and `fdatasync` writes only the data. (When
//! neither is ready, a segment is allocated with `posix_fallocate` on the spot.) sled's own flush woke
//! seven IO threads and took its global lock once per group commit; this log costs
//! one write and one `fdatasync` per group.
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
//! - After a failed write the writer continues in a new segment: numbers are skipped,
//!   never reused, and the failed entries, never acknowledged, may or may not be read.

pub mod record;
pub mod space;
pub mod writer;

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::sync::lock;

pub use record::Record;
pub use writer::Wal;

/// The log's directory inside the database directory.
pub const DIR_NAME: &str = "wal";
/// Ready segments kept beside the one being written, so a roll does not wait for one
/// to be zero-filled.
const SPARES: usize = 1;
const HEADER: usize = 16;
/// The write buffer's capacity kept between groups.
const BUFFER_KEPT: usize = 1024 * 1024;
const SEGMENT_SUFFIX: &str = ".log";
const SPARE_PREFIX: &str = "spare-";
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

fn segment_path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("{first:020}{SEGMENT_SUFFIX}"))
}

fn segment_first(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

fn checksum(seq: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_le_bytes());
    h.update(payload);
    h.finalize()
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
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
    /// Segments whose writing stopped short (the last one at a start, one abandoned
    /// after a failed write): a damaged frame at their end is that write, not damage.
    interrupted: Mutex<Vec<u64>>,
    spares: Mutex<Spares>,
    spare_wanted: Condvar,
    /// Test hook: how many of the next commits (and probes) fail, and how many were
    /// tried.
    #[cfg(test)]
    pub(crate) failing_commits: AtomicU64,
    #[cfg(test)]
    pub(crate) commits_tried: AtomicU64,
}

#[derive(Default)]
struct Spares {
    ready: Vec<PathBuf>,
    counter: u64,
    stop: bool,
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

    /// The first sequence number not yet durable.
    pub fn durable_end(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn spare_path(&self, spares: &mut Spares) -> PathBuf {
        spares.counter += 1;
        self.dir
            .join(format!("{SPARE_PREFIX}{}.tmp", spares.counter))
    }

    /// A ready segment file, renamed to `target`. Made here if none is ready.
    fn take_spare(&self, target: &Path) -> io::Result<()> {
        let ready = {
            let mut spares = lock(&self.spares);
            let ready = spares.ready.pop();
            self.spare_wanted.notify_one();
            ready
        };
        match ready {
            Some(path) => std::fs::rename(path, target),
            // None ready (the disk is busy, or the log grows faster than the compactor
            // frees segments): allocate one now rather than wait for zeros to be
            // written. Its first syncs cost a little more, marking blocks written.
            None => self.allocate_into(target, self.segment_bytes),
        }
    }

    /// Allocate a file under a spare's name, then rename it to `target`: a crash
    /// midway leaves a spare, removed at the next start, never an empty segment.
    fn allocate_into(&self, target: &Path, len: u64) -> io::Result<()> {
        let tmp = {
            let mut spares = lock(&self.spares);
            self.spare_path(&mut spares)
        };
        if let Err(e) = allocate(&tmp, len) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(tmp, target)
    }

    /// A segment no longer in use: kept as a spare when one is wanted and it has the
    /// usual size, deleted otherwise.
    fn retire(&self, path: &Path) -> io::Result<()> {
        {
            let mut spares = lock(&self.spares);
            let size = std::fs::metadata(path).map(|m| m.len()).ok();
            if spares.ready.len() < SPARES && size == Some(self.segment_bytes) {
                let spare = self.spare_path(&mut spares);
                std::fs::rename(path, &spare)?;
                spares.ready.push(spare);
                return Ok(());
            }
        }
        std::fs::remove_file(path)
    }
}

/// A new empty file at `path`, replacing any there.
fn create(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(path)
}

/// Create a file of `len` bytes with its blocks allocated (they read as zeros) and
/// sync it, so writing into it never needs more space.
fn allocate(path: &Path, len: u64) -> io::Result<()> {
    let file = create(path)?;
    let len = libc::off_t::try_from(len).map_err(io::Error::other)?;
    // SAFETY: a valid open descriptor and a non-negative length.
    let rc = unsafe { libc::posix_fallocate(std::os::fd::AsRawFd::as_raw_fd(&file), 0, len) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    file.sync_all()
}

/// Write a zero-filled file of `len` bytes and sync it, so its blocks are allocated
/// and written before the log uses it: a sync then writes only data.
fn zero_fill(path: &Path, len: u64) -> io::Result<()> {
    let file = create(path)?;
    let mut at = 0u64;
    while at < len {
        let n = (len - at).min(ZEROS.len() as u64) as usize;
        file.write_all_at(&ZEROS[..n], at)?;
        at += n as u64;
    }
    file.sync_all()
}

/// One frame read from a segment.
enum Frame {
    Entry(Vec<u8>),
    /// Not the expected entry: the end of what this segment holds.
    End,
    /// The expected entry's header, but not its bytes: a write a crash cut short at
    /// the tail, or damage anywhere else. The bytes it claims, if the file holds them.
    Damaged(Option<Vec<u8>>),
}

fn read_frame(file: &File, offset: u64, file_len: u64, seq: u64) -> io::Result<Frame> {
    if offset + HEADER as u64 > file_len {
        return Ok(Frame::End);
    }
    let mut header = [0u8; HEADER];
    file.read_exact_at(&mut header, offset)?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as u64;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    let found = u64::from_le_bytes(header[8..16].try_into().unwrap_or([0; 8]));
    if len == 0 || found != seq {
        return Ok(Frame::End);
    }
    if offset + HEADER as u64 + len > file_len {
        return Ok(Frame::Damaged(None));
    }
    let mut payload = vec![0u8; len as usize];
    file.read_exact_at(&mut payload, offset + HEADER as u64)?;
    if checksum(seq, &payload) != crc {
        return Ok(Frame::Damaged(Some(payload)));
    }
    Ok(Frame::Entry(payload))
}

/// The segments on disk, oldest first; spares left by an earlier run are removed.
fn scan_dir(dir: &Path) -> io::Result<Vec<u64>> {
    let mut firsts = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if let Some(first) = segment_first(&name) {
            firsts.push(first);
        } else if name.starts_with(SPARE_PREFIX) {
            std::fs::remove_file(entry.path())?;
        }
    }
    firsts.sort_unstable();
    Ok(firsts)
}

/// The number the entry after a segment's last would have, and whether the segment
/// ends in a partly written entry.
fn segment_end(path: &Path, first: u64) -> io::Result<(u64, bool)> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let (mut offset, mut seq) = (0u64, first);
    loop {
        match read_frame(&file, offset, len, seq)? {
            Frame::Entry(payload) => {
                offset += (HEADER + payload.len()) as u64;
                seq += 1;
            }
            Frame::End => return Ok((seq, false)),
            Frame::Damaged(_) => return Ok((seq, true)),
        }
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
    // The end of the log: where the last segment holding an entry ends. Segments
    // after it hold none (a crash between making one and writing to it); they stay
    // until released, and new ones are named above them.
    let mut end = None;
    for &first in firsts.iter().rev() {
        let (next, torn) = segment_end(&segment_path(dir, first), first)?;
        if next == first && !torn {
            continue;
        }
        if torn {
            tracing::warn!(
                entry = next,
                "the write-ahead log ends in a partly written entry (a stop during a write); it was never acknowledged"
            );
        }
        end = Some((first, next));
        break;
    }
    let next = end.map_or(floor, |(_, next)| next);
    let next_seq = next.max(floor);
    // Where the compactor resumes; if the log holds nothing from there on, at the
    // first entry still to be written.
    let read_from = checkpoint.map_or(0, |c| c.saturating_add(1));
    let (read_from, durable) = if read_from >= next {
        (next_seq, next_seq)
    } else {
        (read_from, next)
    };
    let shared = Arc::new(Shared {
        dir: dir.to_path_buf(),
        segment_bytes,
        durable: AtomicU64::new(durable),
        read: AtomicU64::new(read_from),
        segments: Mutex::new(firsts.iter().copied().collect()),
        interrupted: Mutex::new(end.map(|(first, _)| first).into_iter().collect()),
        spares: Mutex::new(Spares::default()),
        #[cfg(test)]
        failing_commits: AtomicU64::new(0),
        #[cfg(test)]
        commits_tried: AtomicU64::new(0),
        spare_wanted: Condvar::new(),
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
        buf: Vec::new(),
    };
    let reader = Reader::new(shared.clone(), read_from)?;
    let preparer = Preparer::start(shared)?;
    Ok((appender, reader, preparer))
}

/// Appends entries; owned by the log's writer thread.
pub struct Appender {
    shared: Arc<Shared>,
    /// The segment being written, and its first number.
    file: Option<File>,
    first: Option<u64>,
    /// Where the next frame goes in `file`, and the file's size.
    offset: u64,
    capacity: u64,
    next_seq: u64,
    /// Set after a failed write: the next entry starts a new segment.
    must_roll: bool,
    /// Frames framed but not yet written to `file`.
    buf: Vec<u8>,
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
        self.write_buffered()?;
        // A failing sync, after the frames reached the file.
        #[cfg(test)]
        self.injected_failure()?;
        if let Some(file) = &self.file {
            file.sync_data()?;
        }
        self.shared.durable.store(self.next_seq, Ordering::Release);
        // A large group's buffer is not kept for the small ones that follow.
        if self.buf.capacity() > BUFFER_KEPT {
            self.buf = Vec::new();
        }
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
        if self.file.is_some() && first >= self.shared.durable.load(Ordering::Acquire) {
            // Nothing in this segment was ever durable: it holds the failed group and
            // nothing else, and the reader never opens it. Retire it now, so a disk that
            // keeps failing does not leave a segment behind for every failed group.
            // Its number stays used: the next segment is named above it.
            self.file = None;
            match self.shared.retire(&segment_path(&self.shared.dir, first)) {
                Ok(()) => {
                    lock(&self.shared.segments).retain(|&f| f != first);
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, segment = first, "cannot retire a log segment left by a failed write");
                }
            }
        }
        // A segment already retired (a roll after it failed too) is not in use.
        if !lock(&self.shared.segments).contains(&first) {
            return;
        }
        let mut interrupted = lock(&self.shared.interrupted);
        if !interrupted.contains(&first) {
            interrupted.push(first);
        }
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
        // Names only go up, even past a segment that got no entry.
        let first = self.next_seq.max(self.first.map_or(0, |f| f + 1));
        let dir = &self.shared.dir;
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
    fn new(shared: Arc<Shared>, next: u64) -> io::Result<Reader> {
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

/// Keeps zero-filled segments ready on its own thread, so a roll rarely waits. The
/// thread stops when this is dropped.
pub struct Preparer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Preparer {
    fn start(shared: Arc<Shared>) -> io::Result<Preparer> {
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("wal-segments".into())
            .spawn(move || prepare_loop(&s))?;
        Ok(Preparer {
            shared,
            thread: Some(thread),
        })
    }

    /// Stop the thread and wait for it.
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for Preparer {
    fn drop(&mut self) {
        lock(&self.shared.spares).stop = true;
        self.shared.spare_wanted.notify_all();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("log segment preparer panicked");
            }
        }
    }
}

fn prepare_loop(shared: &Shared) {
    let mut failing = false;
    loop {
        let path = {
            let mut spares = lock(&shared.spares);
            while !spares.stop && spares.ready.len() >= SPARES {
                spares = shared
                    .spare_wanted
                    .wait(spares)
                    .unwrap_or_else(|p| p.into_inner());
            }
            if spares.stop {
                return;
            }
            shared.spare_path(&mut spares)
        };
        match zero_fill(&path, shared.segment_bytes) {
            Ok(()) => {
                failing = false;
                let mut spares = lock(&shared.spares);
                spares.ready.push(path);
            }
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                if !std::mem::replace(&mut failing, true) {
                    tracing::error!(error = %e, "cannot prepare a log segment; retrying");
                }
                // Wait before retrying, or for a stop.
                let spares = lock(&shared.spares);
                if spares.stop {
                    return;
                }
                let _ = shared
                    .spare_wanted
                    .wait_timeout(spares, std::time::Duration::from_secs(1));
            }
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
