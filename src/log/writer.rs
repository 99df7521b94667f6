//! The write-ahead log: accepted events become durable here before any 2xx is sent.
//!
//! One writer thread owns every append. Requests hand it their encoded records over a
//! bounded channel and wait; the writer takes everything that has queued up, writes it
//! to the log's segment file ([`crate::log`]) as a few entries, calls `fdatasync` once
//! for the whole group, and answers all of them. Under load the groups grow, so one
//! sync is shared by many requests (group commit). A dedicated thread keeps the
//! blocking sync off the reactor.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::record::encode_frame;
use super::{Appender, Preparer};

/// Requests waiting for the writer. A full queue means the disk cannot keep up: new
/// requests get 503 with Retry-After rather than an ever-growing backlog in memory.
const QUEUE_CAPACITY: usize = 8192;
/// A group stops growing here, so one fsync never waits on an unbounded amount of data.
const MAX_GROUP_BYTES: usize = 64 * 1024 * 1024;
/// A log entry holds at most this many records, and is closed once it reaches this
/// many bytes (a group may span several entries): the compactor reads whole entries,
/// so this bounds what one of its steps holds beyond its chunk size.
const ENTRY_MAX_RECORDS: usize = 512;
const ENTRY_MAX_BYTES: usize = 64 * 1024;
/// After a failed write the writer answers groups with [`Error::Storage`] without
/// touching the disk for a while, then tries again: a disk that keeps failing is tried
/// a few times a second, not once per request (each try starts a segment and logs an
/// error). The pause doubles with each failure in a row, up to the maximum.
const FIRST_BACKOFF: Duration = Duration::from_millis(if cfg!(test) { 300 } else { 50 });
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Why an append was not acknowledged. Nothing here was made durable by this call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The queue is full: retry later.
    Overloaded,
    /// The storage failed (disk full, I/O error); retry later.
    Storage,
    /// The log is shutting down.
    Closed,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Error::Overloaded => "the write-ahead log is overloaded",
            Error::Storage => "the write-ahead log cannot write to disk",
            Error::Closed => "the write-ahead log is closed",
        })
    }
}

impl std::error::Error for Error {}

enum Job {
    Append {
        records: Vec<Vec<u8>>,
        reply: oneshot::Sender<Result<(), Error>>,
    },
    /// After a failure: check whether the disk takes writes again.
    Probe,
    /// Write what is queued ahead of this, then stop.
    Stop,
}

/// Counters the writer keeps for metrics and readiness.
#[derive(Debug, Default)]
pub struct Stats {
    pub appended_records: AtomicU64,
    pub groups: AtomicU64,
    /// The latest flush's duration in microseconds (all of them go to the histogram).
    pub last_flush_micros: AtomicU64,
    /// False after a failed write until the next one succeeds.
    pub writable: AtomicBool,
}

/// The handle requests append through.
#[derive(Clone)]
pub struct Wal {
    tx: mpsc::Sender<Job>,
    stats: Arc<Stats>,
}

/// The writer thread.
pub struct Writer {
    thread: JoinHandle<()>,
    tx: mpsc::Sender<Job>,
    preparer: Preparer,
    shared: Arc<super::Shared>,
}

impl Writer {
    /// Write everything queued so far (or refuse it, in the pause after a failed
    /// write), then stop the thread and wait for it. Appends that come later fail with
    /// [`Error::Closed`].
    pub fn stop(self) {
        // A full queue is drained by the writer, so this waits at most one group.
        if self.tx.blocking_send(Job::Stop).is_ok() && self.thread.join().is_err() {
            tracing::error!("write-ahead log writer panicked");
        }
        self.preparer.stop();
        self.shared.close();
    }
}

/// Told the duration of every fsync, for a latency histogram.
pub type FlushObserver = Box<dyn Fn(std::time::Duration) + Send>;

impl Wal {
    /// Start the writer on an open log (see [`super::open`]).
    pub fn start(
        appender: Appender,
        preparer: Preparer,
        on_flush: FlushObserver,
    ) -> std::io::Result<(Wal, Writer)> {
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let stats = Arc::new(Stats {
            writable: AtomicBool::new(true),
            ..Stats::default()
        });
        let writer_stats = stats.clone();
        let shared = appender.shared().clone();
        let thread = std::thread::Builder::new()
            .name("wal-writer".into())
            .spawn(move || run(appender, rx, &writer_stats, &on_flush))?;
        let writer = Writer {
            thread,
            tx: tx.clone(),
            preparer,
            shared,
        };
        Ok((Wal { tx, stats }, writer))
    }

    /// Append records in order; resolves once they are fsync'd.
    pub async fn append(&self, records: Vec<Vec<u8>>) -> Result<(), Error> {
        if records.is_empty() {
            return Ok(());
        }
        let (reply, done) = oneshot::channel();
        self.tx
            .try_send(Job::Append { records, reply })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => Error::Overloaded,
                mpsc::error::TrySendError::Closed(_) => Error::Closed,
            })?;
        done.await.map_err(|_| Error::Closed)?
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// After a failed write, ask the writer to check the disk once its pause is over,
    /// so the log is seen writable again without waiting for an event to try it.
    /// Asks nothing when the log is writable or the queue is full.
    pub fn probe(&self) {
        if !self.stats.writable.load(Ordering::Relaxed) {
            let _ = self.tx.try_send(Job::Probe);
        }
    }

    /// Requests queued for the writer right now.
    pub fn queued(&self) -> usize {
        QUEUE_CAPACITY - self.tx.capacity()
    }
}

/// One append waiting in the current group.
struct Pending {
    records: Vec<Vec<u8>>,
    reply: oneshot::Sender<Result<(), Error>>,
}

fn run(mut log: Appender, mut rx: mpsc::Receiver<Job>, stats: &Stats, on_flush: &FlushObserver) {
    let mut stopping = false;
    // After a failure: until when groups are refused, and the pause that was set.
    let mut backoff: Option<(Instant, Duration)> = None;
    while !stopping {
        let mut group = Vec::new();
        let mut bytes = 0usize;
        let mut probe = false;
        let mut next = rx.blocking_recv();
        while let Some(job) = next {
            match job {
                Job::Append { records, reply } => {
                    bytes += records.iter().map(Vec::len).sum::<usize>();
                    group.push(Pending { records, reply });
                }
                Job::Probe => probe = true,
                Job::Stop => {
                    stopping = true;
                    break;
                }
            }
            if bytes >= MAX_GROUP_BYTES {
                break;
            }
            next = rx.try_recv().ok();
        }
        if group.is_empty() && !probe {
            // Every sender is gone, or a stop with nothing queued.
            break;
        }
        let result = match backoff {
            Some((until, _)) if Instant::now() < until => Err(Error::Storage),
            _ => {
                let result = match group.is_empty() {
                    false => write_group(&mut log, &mut group, stats, on_flush),
                    true => log.probe().map_err(|e| {
                        log.abandon();
                        storage_error(e)
                    }),
                };
                backoff = match (result, backoff) {
                    (Ok(()), None) => None,
                    (Ok(()), Some(_)) => {
                        tracing::info!("the write-ahead log writes again");
                        None
                    }
                    (Err(_), None) => Some((Instant::now() + FIRST_BACKOFF, FIRST_BACKOFF)),
                    (Err(_), Some((_, last))) => {
                        let next = (last * 2).min(MAX_BACKOFF);
                        Some((Instant::now() + next, next))
                    }
                };
                result
            }
        };
        stats.writable.store(result.is_ok(), Ordering::Relaxed);
        for pending in group {
            // A requester that went away (client disconnected) needs no answer.
            let _ = pending.reply.send(result);
        }
        if rx.is_empty() {
            crate::support::idle::idle();
        }
    }
    if stopping {
        if let Err(e) = log.mark_clean() {
            tracing::warn!(error = %e, "cannot record the write-ahead log's clean stop; the next start cannot tell a segment cut short from a torn write");
        }
    }
}

fn write_group(
    log: &mut Appender,
    group: &mut [Pending],
    stats: &Stats,
    on_flush: &FlushObserver,
) -> Result<(), Error> {
    let written = append_entries(log, group).and_then(|count| {
        let started = Instant::now();
        log.commit()?;
        Ok((count, started.elapsed()))
    });
    let (count, took) = match written {
        Ok(done) => done,
        Err(e) => {
            log.abandon();
            return Err(storage_error(e));
        }
    };
    on_flush(took);
    stats
        .last_flush_micros
        .store(took.as_micros() as u64, Ordering::Relaxed);
    stats.groups.fetch_add(1, Ordering::Relaxed);
    stats.appended_records.fetch_add(count, Ordering::Relaxed);
    Ok(())
}

/// Frame the group's records as log entries, in order; returns how many records.
fn append_entries(log: &mut Appender, group: &mut [Pending]) -> std::io::Result<u64> {
    let mut count = 0u64;
    let mut entry: Vec<Vec<u8>> = Vec::new();
    let mut entry_bytes = 0usize;
    for pending in group.iter_mut() {
        for record in pending.records.drain(..) {
            entry_bytes += record.len();
            entry.push(record);
            count += 1;
            if entry.len() >= ENTRY_MAX_RECORDS || entry_bytes >= ENTRY_MAX_BYTES {
                log.push(&encode_frame(entry.iter().map(Vec::as_slice)))?;
                entry.clear();
                entry_bytes = 0;
            }
        }
    }
    if !entry.is_empty() {
        log.push(&encode_frame(entry.iter().map(Vec::as_slice)))?;
    }
    Ok(count)
}

fn storage_error(e: std::io::Error) -> Error {
    tracing::error!(error = %e, "write-ahead log write failed; answering 503 until it recovers");
    Error::Storage
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log;

    const SEGMENT: u64 = 256 * 1024;

    fn start(dir: &std::path::Path, floor: u64) -> (Wal, Writer) {
        let (wal, writer, _) = start_with_hooks(dir, floor);
        (wal, writer)
    }

    /// [`start`], with the log's shared state for its test hooks (failing syncs).
    fn start_with_hooks(dir: &std::path::Path, floor: u64) -> (Wal, Writer, Arc<log::Shared>) {
        let (appender, _, preparer) = log::open(dir, floor, None, SEGMENT).unwrap();
        let shared = appender.shared().clone();
        let (wal, writer) = Wal::start(appender, preparer, Box::new(|_| {})).unwrap();
        (wal, writer, shared)
    }

    /// Every entry in the log, with its number, read as the compactor reads.
    fn read_all(dir: &std::path::Path) -> Vec<(u64, Vec<u8>)> {
        let (_, mut reader) = log::open_for_tests(dir, 0, None, SEGMENT);
        log::read_intact(&mut reader)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_in_order_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, writer) = start(dir.path(), 1);
        let mut tasks = Vec::new();
        for i in 0..50u32 {
            let wal = wal.clone();
            tasks.push(tokio::spawn(async move {
                wal.append(vec![
                    format!("{i}-a").into_bytes(),
                    format!("{i}-b").into_bytes(),
                ])
                .await
            }));
        }
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert_eq!(wal.stats().appended_records.load(Ordering::Relaxed), 100);
        tokio::task::spawn_blocking(move || writer.stop())
            .await
            .unwrap();
        assert_eq!(wal.append(vec![b"late".to_vec()]).await, Err(Error::Closed));

        let values: Vec<String> = read_all(dir.path())
            .iter()
            .flat_map(|(_, frame)| {
                crate::log::record::decode_frame(frame)
                    .unwrap()
                    .into_iter()
                    .map(|r| String::from_utf8(r.to_vec()).unwrap())
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(values.len(), 100);
        // Each request's records stay adjacent and in the order given.
        for pair in values.chunks(2) {
            let (a, b) = (&pair[0], &pair[1]);
            assert!(a.ends_with("-a") && b.ends_with("-b"));
            assert_eq!(a.trim_end_matches("-a"), b.trim_end_matches("-b"));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn entries_are_numbered_from_the_floor_up_across_segments() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, writer) = start(dir.path(), 7_000);
        // Big enough records that a group spans several entries, and the log several
        // segments.
        let record = vec![b'r'; ENTRY_MAX_BYTES / 2];
        for _ in 0..20 {
            wal.append(vec![record.clone(); 5]).await.unwrap();
        }
        tokio::task::spawn_blocking(move || writer.stop())
            .await
            .unwrap();
        let segments = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension() == Some("log".as_ref()))
            .count();
        assert!(segments >= 3, "{segments} segments");
        let seqs: Vec<u64> = read_all(dir.path()).iter().map(|(s, _)| *s).collect();
        assert!(seqs.len() >= 60, "{seqs:?}");
        let expected: Vec<u64> = (7_000..7_000 + seqs.len() as u64).collect();
        assert_eq!(seqs, expected);
    }

    /// A failing disk is tried again after a pause that doubles, not by every group:
    /// appends in the pause are refused without a write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_a_failed_write_the_disk_is_tried_again_only_after_a_pause() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, writer, shared) = start_with_hooks(dir.path(), 1);
        let tried = || shared.commits_tried.load(Ordering::SeqCst);
        shared.failing_commits.store(2, Ordering::SeqCst);
        assert_eq!(wal.append(vec![b"a".to_vec()]).await, Err(Error::Storage));
        assert_eq!(tried(), 1);
        assert!(!wal.stats().writable.load(Ordering::SeqCst));
        // Within the pause: refused, the disk untouched.
        assert_eq!(wal.append(vec![b"b".to_vec()]).await, Err(Error::Storage));
        assert_eq!(tried(), 1);
        // After it: tried, failing again; the next pause is twice as long.
        std::thread::sleep(FIRST_BACKOFF + Duration::from_millis(50));
        assert_eq!(wal.append(vec![b"c".to_vec()]).await, Err(Error::Storage));
        assert_eq!(tried(), 2);
        std::thread::sleep(FIRST_BACKOFF + Duration::from_millis(50));
        assert_eq!(wal.append(vec![b"d".to_vec()]).await, Err(Error::Storage));
        assert_eq!(tried(), 2);
        // A probe in the pause does not touch the disk either.
        wal.probe();
        std::thread::sleep(FIRST_BACKOFF);
        assert_eq!(tried(), 2);
        // The disk works again: written, and the next append goes straight through.
        assert_eq!(wal.append(vec![b"e".to_vec()]).await, Ok(()));
        assert!(wal.stats().writable.load(Ordering::SeqCst));
        assert_eq!(wal.append(vec![b"f".to_vec()]).await, Ok(()));
        assert_eq!(tried(), 4);
        tokio::task::spawn_blocking(move || writer.stop())
            .await
            .unwrap();
        // Only what was acknowledged is in the log, and no segment was left behind
        // by the failed writes.
        let values: Vec<Vec<u8>> = read_all(dir.path())
            .iter()
            .flat_map(|(_, frame)| {
                let records = crate::log::record::decode_frame(frame).unwrap();
                records.into_iter().map(<[u8]>::to_vec).collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(values, [b"e".to_vec(), b"f".to_vec()]);
        let segments = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension() == Some("log".as_ref()))
            .count();
        assert_eq!(segments, 1);
    }

    /// With no event to try it, a probe finds the disk working again once the pause
    /// after a failure is over.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_probe_after_the_pause_finds_the_disk_working_again() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, writer, shared) = start_with_hooks(dir.path(), 1);
        let writable = || wal.stats().writable.load(Ordering::SeqCst);
        // Writable: a probe asks nothing.
        wal.probe();
        shared.failing_commits.store(1, Ordering::SeqCst);
        assert_eq!(wal.append(vec![b"a".to_vec()]).await, Err(Error::Storage));
        assert_eq!(shared.commits_tried.load(Ordering::SeqCst), 1);
        assert!(!writable());
        std::thread::sleep(FIRST_BACKOFF + Duration::from_millis(50));
        wal.probe();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !writable() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(writable());
        assert_eq!(shared.commits_tried.load(Ordering::SeqCst), 2);
        assert_eq!(wal.append(vec![b"b".to_vec()]).await, Ok(()));
        tokio::task::spawn_blocking(move || writer.stop())
            .await
            .unwrap();
    }
}
