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
//! - A segment is created (renamed into place, directory synced) only after the
//!   previous one is synced, so a later segment never outlives an earlier entry.
//! - A segment is recycled only once the compactor's checkpoint past its last entry is
//!   itself durable in sled (see [`Reader::release`]).
//! - After a failed write the writer continues in a new segment: numbers are skipped,
//!   never reused, and the failed entries, never acknowledged, may or may not be read.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// The log's directory inside the database directory.
pub const DIR_NAME: &str = "wal";
/// A segment's size: a roll (one extra sync and a rename) every 16 MiB of events.
pub const SEGMENT_BYTES: u64 = 16 * 1024 * 1024;
/// Ready segments kept beside the one being written, so a roll does not wait for one
/// to be zero-filled.
const SPARES: usize = 1;
const HEADER: usize = 16;
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

/// What the writer, the compactor's reader and the spare maker share.
pub struct Shared {
    dir: PathBuf,
    segment_bytes: u64,
    /// The first sequence number not yet durable: every entry below it is synced.
    durable: AtomicU64,
    /// The next entry the reader will return (the compactor's position).
    read: AtomicU64,
    /// First sequence numbers of the segments in use, oldest first.
    segments: Mutex<VecDeque<u64>>,
    spares: Mutex<Spares>,
    spare_wanted: Condvar,
}

#[derive(Default)]
struct Spares {
    ready: Vec<PathBuf>,
    counter: u64,
    stop: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded data stays consistent at every point a panic could interrupt it.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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
            None => allocate(target, self.segment_bytes),
        }
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
    /// the tail, or damage anywhere else.
    Damaged,
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
        return Ok(Frame::Damaged);
    }
    let mut payload = vec![0u8; len as usize];
    file.read_exact_at(&mut payload, offset + HEADER as u64)?;
    if checksum(seq, &payload) != crc {
        return Ok(Frame::Damaged);
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

/// Find where a segment's entries end: the offset after the last one and the number
/// the next one would have.
fn segment_end(path: &Path, first: u64) -> io::Result<(u64, u64)> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let (mut offset, mut seq) = (0u64, first);
    loop {
        match read_frame(&file, offset, len, seq)? {
            Frame::Entry(payload) => {
                offset += (HEADER + payload.len()) as u64;
                seq += 1;
            }
            Frame::End => break,
            Frame::Damaged => {
                tracing::warn!(
                    entry = seq,
                    "the write-ahead log ends in a partly written entry (a stop during a write); it was never acknowledged and is overwritten"
                );
                break;
            }
        }
    }
    Ok((offset, seq))
}

/// Open the log in `dir` (created if missing). `floor` is the lowest sequence number
/// a new entry may take (above the compactor's checkpoint and any older log);
/// `checkpoint` is the last entry the compactor applied, where the reader starts.
pub fn open(
    dir: &Path,
    floor: u64,
    checkpoint: Option<u64>,
    segment_bytes: u64,
) -> io::Result<(Appender, Reader, Preparer)> {
    std::fs::create_dir_all(dir)?;
    let firsts = scan_dir(dir)?;
    let (current, offset, next) = match firsts.last() {
        Some(&first) => {
            let (offset, next) = segment_end(&segment_path(dir, first), first)?;
            (Some(first), offset, next)
        }
        None => (None, 0, floor),
    };
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
        spares: Mutex::new(Spares::default()),
        spare_wanted: Condvar::new(),
    });
    let file = match current {
        Some(first) => Some(
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(segment_path(dir, first))?,
        ),
        None => None,
    };
    let capacity = match &file {
        Some(f) => f.metadata()?.len(),
        None => 0,
    };
    let appender = Appender {
        shared: shared.clone(),
        file,
        offset,
        capacity,
        next_seq,
        // Continue in the last segment only where its entries end exactly at the
        // first free number; otherwise a new segment starts at the floor.
        must_roll: next < floor,
        buf: Vec::new(),
    };
    let reader = Reader::new(shared.clone(), read_from)?;
    let preparer = Preparer::start(shared)?;
    Ok((appender, reader, preparer))
}

/// Appends entries; owned by the log's writer thread.
pub struct Appender {
    shared: Arc<Shared>,
    file: Option<File>,
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
        if let Some(file) = &self.file {
            file.sync_data()?;
        }
        self.shared.durable.store(self.next_seq, Ordering::Release);
        Ok(())
    }

    /// Forget a group whose push or commit failed: its entries are never reported
    /// durable, and the next entry starts a new segment with a higher number.
    pub fn abandon(&mut self) {
        self.buf.clear();
        self.must_roll = true;
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
        let first = self.next_seq;
        let dir = &self.shared.dir;
        let path = segment_path(dir, first);
        if frame_len > self.shared.segment_bytes {
            // One outsized entry: a segment of its own size.
            allocate(&path, frame_len)?;
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
        self.offset = 0;
        self.must_roll = false;
        Ok(())
    }
}

/// Reads entries in order for the compactor, up to the durable end.
pub struct Reader {
    shared: Arc<Shared>,
    /// The segment being read, its first number and size.
    file: Option<(File, u64, u64)>,
    offset: u64,
    /// The next entry to return.
    next: u64,
}

impl Reader {
    fn new(shared: Arc<Shared>, next: u64) -> io::Result<Reader> {
        let mut reader = Reader {
            shared,
            file: None,
            offset: 0,
            next,
        };
        reader.seek(next)?;
        Ok(reader)
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The number of the next entry [`Reader::next_entries`] returns.
    pub fn position(&self) -> u64 {
        self.next
    }

    /// Position at entry `seq`: in the last segment that starts at or before it. The
    /// compactor reads a failed chunk again from its first entry.
    pub fn seek(&mut self, seq: u64) -> io::Result<()> {
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
        let Some(first) = first else {
            return Ok(());
        };
        self.open_segment(first)?;
        self.next = first;
        while self.next < seq {
            match self.read_one()? {
                Some(_) => {}
                None => break,
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

    /// The next entry of the current segment, if it holds it.
    fn read_one(&mut self) -> io::Result<Option<Vec<u8>>> {
        let Some((file, first, len)) = &self.file else {
            return Ok(None);
        };
        match read_frame(file, self.offset, *len, self.next)? {
            Frame::Entry(payload) => {
                self.offset += (HEADER + payload.len()) as u64;
                self.next += 1;
                Ok(Some(payload))
            }
            Frame::End => Ok(None),
            Frame::Damaged => {
                // Synced entries do not tear: this is damage on the disk.
                tracing::error!(
                    entry = self.next,
                    segment = first,
                    "damaged write-ahead log entry (checksum mismatch); the rest of its segment is skipped"
                );
                Ok(None)
            }
        }
    }

    /// Durable entries in order, from the reader's position, until `enough` says the
    /// entries so far are enough. Returns (sequence number, payload) pairs.
    pub fn next_entries(
        &mut self,
        mut enough: impl FnMut(&[u8]) -> bool,
    ) -> io::Result<Vec<(u64, Vec<u8>)>> {
        let mut out = Vec::new();
        while self.next < self.shared.durable.load(Ordering::Acquire) {
            let seq = self.next;
            match self.read_one()? {
                Some(payload) => {
                    let done = enough(&payload);
                    out.push((seq, payload));
                    if done {
                        break;
                    }
                }
                None => {
                    if !self.advance_segment()? {
                        break;
                    }
                }
            }
        }
        self.publish();
        Ok(out)
    }

    /// The current segment holds no more: move to the next one. Entries the writer
    /// abandoned after a failed write leave a gap in the numbers, skipped here.
    fn advance_segment(&mut self) -> io::Result<bool> {
        let current = self.file.as_ref().map(|(_, first, _)| *first);
        let next = {
            let segments = lock(&self.shared.segments);
            segments
                .iter()
                .copied()
                .find(|&f| current.is_none_or(|c| f > c))
        };
        let Some(first) = next else {
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
        for first in released {
            let path = segment_path(&self.shared.dir, first);
            let keep = {
                let mut spares = lock(&self.shared.spares);
                let size = std::fs::metadata(&path).map(|m| m.len()).ok();
                if spares.ready.len() < SPARES && size == Some(self.shared.segment_bytes) {
                    let spare = self.shared.spare_path(&mut spares);
                    std::fs::rename(&path, &spare)?;
                    spares.ready.push(spare);
                    true
                } else {
                    false
                }
            };
            if !keep {
                std::fs::remove_file(&path)?;
            }
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

/// Keeps zero-filled segments ready on its own thread, so a roll rarely waits.
pub struct Preparer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    failed: Arc<AtomicBool>,
}

impl Preparer {
    fn start(shared: Arc<Shared>) -> io::Result<Preparer> {
        let failed = Arc::new(AtomicBool::new(false));
        let (s, f) = (shared.clone(), failed.clone());
        let thread = std::thread::Builder::new()
            .name("wal-segments".into())
            .spawn(move || prepare_loop(&s, &f))?;
        Ok(Preparer {
            shared,
            thread: Some(thread),
            failed,
        })
    }

    /// Stop the thread and wait for it.
    pub fn stop(mut self) {
        lock(&self.shared.spares).stop = true;
        self.shared.spare_wanted.notify_all();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("log segment preparer panicked");
            }
        }
    }

    /// Whether the last attempt to make a spare failed (the disk is full, say).
    pub fn failing(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }
}

fn prepare_loop(shared: &Shared, failed: &AtomicBool) {
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
                failed.store(false, Ordering::Relaxed);
                let mut spares = lock(&shared.spares);
                spares.ready.push(path);
            }
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                if !failed.swap(true, Ordering::Relaxed) {
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

#[cfg(test)]
#[path = "log_tests.rs"]
mod tests;
