//! A segment file on disk: its name, the frame of each entry (length, CRC-32, sequence
//! number, payload), reading one frame back, finding where a segment's entries end,
//! and making files whose blocks are allocated before they are written.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A frame's header: length u32 LE, crc32 u32 LE, sequence u64 LE.
pub(super) const HEADER: usize = 16;
const SEGMENT_SUFFIX: &str = ".log";
/// Files being made into segments (or kept for reuse) start with this.
pub(super) const SPARE_PREFIX: &str = "spare-";
/// Zeros to fill segments with, aligned for direct (`O_DIRECT`) writes, which need the
/// buffer, offsets and lengths aligned to the device's block (4 KiB covers the usual
/// 512 and 4096).
#[repr(C, align(4096))]
struct Zeros([u8; 64 * 1024]);
static ZEROS: Zeros = Zeros([0; 64 * 1024]);
const DIRECT_ALIGN: u64 = 4096;

pub(super) fn segment_path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("{first:020}{SEGMENT_SUFFIX}"))
}

pub(super) fn segment_first(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

pub(super) fn checksum(seq: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_le_bytes());
    h.update(payload);
    h.finalize()
}

pub(super) use crate::support::sync_dir;

/// A new empty file at `path`, replacing any there.
pub(super) fn create(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(path)
}

/// Create a file of `len` bytes with its blocks allocated (they read as zeros) and
/// sync it, so writing into it never needs more space.
pub(super) fn allocate(path: &Path, len: u64) -> io::Result<()> {
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
///
/// The zeros bypass the page cache (`O_DIRECT`) where the filesystem allows it: copied
/// through the cache they cost as much CPU as the log's own writes while ingest is
/// fastest (a fifth of the server's samples under `/batch/` load), and they would
/// push the pages the compactor is about to read out of memory. Where direct writes
/// are refused (tmpfs, an unaligned size), they go through the cache.
pub(crate) fn zero_fill(path: &Path, len: u64) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    if len.is_multiple_of(DIRECT_ALIGN) {
        let direct = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .and_then(|file| write_zeros(&file, len));
        match direct {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            done => return done,
        }
    }
    write_zeros(&create(path)?, len)
}

/// Write `len` zeros from the start of `file`, then sync it, data and size.
fn write_zeros(file: &File, len: u64) -> io::Result<()> {
    let mut at = 0u64;
    while at < len {
        let n = (len - at).min(ZEROS.0.len() as u64) as usize;
        file.write_all_at(&ZEROS.0[..n], at)?;
        at += n as u64;
    }
    file.sync_all()
}

/// One frame read from a segment.
pub(super) enum Frame {
    Entry(Vec<u8>),
    /// Not the expected entry: the end of what this segment holds.
    End,
    /// The expected entry's header, but not its bytes: a write a crash cut short at
    /// the tail, or damage anywhere else. The bytes it claims, if the file holds them.
    Damaged(Option<Vec<u8>>),
}

pub(super) fn read_frame(file: &File, offset: u64, file_len: u64, seq: u64) -> io::Result<Frame> {
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
pub(super) fn scan_dir(dir: &Path) -> io::Result<Vec<u64>> {
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

/// Where a segment's entries end, read over damage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SegmentEnd {
    /// The number after the segment's last intact entry.
    pub next: u64,
    /// An entry that does not check out with nothing intact after it: the number it
    /// claims (a write cut short, or damage; the caller tells which).
    pub bad_tail: Option<u64>,
}

/// Where a segment's entries end: a damaged entry followed by intact ones is passed
/// over (damage, for the reader to quarantine), so only the last intact entry counts.
pub(super) fn segment_end(path: &Path, first: u64) -> io::Result<SegmentEnd> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let (mut offset, mut seq) = (0u64, first);
    loop {
        let damaged = match read_frame(&file, offset, len, seq)? {
            Frame::Entry(payload) => {
                offset += (HEADER + payload.len()) as u64;
                seq += 1;
                continue;
            }
            Frame::End => false,
            Frame::Damaged(_) => true,
        };
        match next_intact(&file, offset + 1, len, seq, u64::MAX)? {
            Some((at, found)) => (offset, seq) = (at, found),
            None => {
                return Ok(SegmentEnd {
                    next: seq,
                    bad_tail: damaged.then_some(seq),
                })
            }
        }
    }
}

/// The first intact frame at or after `offset` whose number is in `from..limit`: its
/// offset and number. Reads the rest of the segment at once, so it is called only at
/// damage or where a segment's entries seem to end; a segment never holds an intact
/// frame numbered above its own entries except after damage (numbers only go up, and
/// recycled segments hold lower ones).
pub(super) fn next_intact(
    file: &File,
    offset: u64,
    len: u64,
    from: u64,
    limit: u64,
) -> io::Result<Option<(u64, u64)>> {
    if offset >= len || from >= limit {
        return Ok(None);
    }
    let mut rest = vec![0u8; (len - offset) as usize];
    file.read_exact_at(&mut rest, offset)?;
    let word = |at: usize| u32::from_le_bytes([rest[at], rest[at + 1], rest[at + 2], rest[at + 3]]);
    let mut at = 0usize;
    while at + HEADER <= rest.len() {
        let seq = u64::from_le_bytes(rest[at + 8..at + 16].try_into().unwrap_or([0; 8]));
        if (from..limit).contains(&seq) {
            let frame_len = word(at) as usize;
            let end = at + HEADER + frame_len;
            if frame_len > 0
                && end <= rest.len()
                && checksum(seq, &rest[at + HEADER..end]) == word(at + 4)
            {
                return Ok(Some((offset + at as u64, seq)));
            }
        }
        at += 1;
    }
    Ok(None)
}
