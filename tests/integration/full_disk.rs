//! A disk filled at once, on a real (size-limited tmpfs) filesystem the test mounts:
//! the server refuses events while it is full and heals by itself once space is back,
//! sled included, with every acknowledged event stored exactly once, before and after
//! a restart. And when the database, closed after a full disk, cannot be opened again
//! (it is damaged, so no amount of space heals it), the server gives up: `/_liveness`
//! answers 503 and the systemd watchdog is no longer fed, so systemd restarts it.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::util::*;

/// The filesystem's size: room for the database, the log and a few segments.
const DISK_MIB: u64 = 256;
/// Capture posters running throughout.
const CLIENTS: usize = 4;
/// Events per batch.
const BATCH: usize = 20;
/// How long the disk stays full.
const FULL_FOR: Duration = Duration::from_secs(2);
/// Capture must be accepted again within this long after space returns.
const HEAL_WITHIN: Duration = Duration::from_secs(10);

/// A tmpfs of `DISK_MIB` mounted on a fresh directory; unmounted on drop, also when
/// the test fails.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount() -> Tmpfs {
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "this test mounts a tmpfs and must run as root (.ci/run does)"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={DISK_MIB}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "mount -t tmpfs failed: {status}");
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// Take every free byte of the filesystem at `dir` in one go: `fallocate` of all but
/// a little, then writes until the disk refuses. Returns the file.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    // The server writes meanwhile, so an allocation of all that was free a moment
    // ago may fail: halve it and go on from where the file ends.
    let mut end: libc::off_t = 0;
    let mut want = flagpost::log::space::free_bytes(dir).unwrap() as libc::off_t;
    while want >= 64 * 1024 {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        // SAFETY: a valid open file descriptor, a non-negative offset and length.
        if unsafe { libc::posix_fallocate(fd, end, want) } == 0 {
            end += want;
        } else {
            want /= 2;
        }
    }
    assert!(end > 0, "nothing could be allocated");
    let chunk = vec![0u8; 64 * 1024];
    while file.write_all(&chunk).is_ok() {}
    path
}

/// What the posters were told: uuids answered 200, and the other statuses' counts.
#[derive(Default)]
struct Outcome {
    acked: Vec<String>,
    refused: HashMap<u16, usize>,
    /// Refusals without a Retry-After.
    without_retry_after: usize,
    /// Requests that got no answer at all.
    unanswered: usize,
    /// Their events' uuids: in flight at a kill, stored or not (both are right).
    unanswered_ids: Vec<String>,
}

fn post_batches(addr: std::net::SocketAddr, stop: &AtomicBool, out: &Mutex<Outcome>) {
    post_batches_until(addr, stop, BATCH, |uuids, answer| {
        let mut out = out.lock().unwrap();
        match answer {
            Some(r) if r.status == 200 => out.acked.extend(uuids),
            Some(r) => {
                *out.refused.entry(r.status).or_default() += 1;
                if r.header("retry-after").is_none() {
                    out.without_retry_after += 1;
                }
                drop(out);
                std::thread::sleep(Duration::from_millis(50));
            }
            None => {
                out.unanswered += 1;
                out.unanswered_ids.extend(uuids);
            }
        }
    });
}

/// [`CLIENTS`] threads posting batches to a server until [`Posters::finish`].
struct Posters {
    stop: Arc<AtomicBool>,
    outcome: Arc<Mutex<Outcome>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Posters {
    /// Start posting, and return once 20 batches were acknowledged.
    fn start(addr: std::net::SocketAddr) -> Posters {
        let stop = Arc::new(AtomicBool::new(false));
        let outcome = Arc::new(Mutex::new(Outcome::default()));
        let threads = (0..CLIENTS)
            .map(|_| {
                let (stop, out) = (stop.clone(), outcome.clone());
                std::thread::spawn(move || post_batches(addr, &stop, &out))
            })
            .collect();
        wait_for("events acknowledged before the fill", || {
            (outcome.lock().unwrap().acked.len() >= 20 * BATCH).then_some(())
        });
        Posters {
            stop,
            outcome,
            threads,
        }
    }

    /// How many requests were refused with `status` so far.
    fn refused(&self, status: u16) -> Option<usize> {
        self.outcome.lock().unwrap().refused.get(&status).copied()
    }

    /// Stop posting, wait for every poster, and say what they were told.
    fn finish(self) -> Outcome {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        std::mem::take(&mut *self.outcome.lock().unwrap())
    }
}

/// Stored uuids, each once, equal to `acked` (and any of `in_flight`, requests a kill
/// cut off after their events were written).
fn assert_stored_exactly_once(server: &Server, acked: &[String], in_flight: &[String], when: &str) {
    let stored = server.settle(1);
    let ids: Vec<&str> = stored.iter().map(|e| e["id"].as_str().unwrap()).collect();
    let unique: HashSet<&str> = ids.iter().copied().collect();
    assert_eq!(ids.len(), unique.len(), "{when}: an event is stored twice");
    let acked: HashSet<&str> = acked.iter().map(String::as_str).collect();
    let lost = acked.difference(&unique).count();
    let in_flight: HashSet<&str> = in_flight.iter().map(String::as_str).collect();
    let extra = unique
        .difference(&acked)
        .filter(|id| !in_flight.contains(*id))
        .count();
    let full_log = server.log();
    let log: Vec<&str> = full_log.lines().filter(|l| !l.contains(" INFO ")).collect();
    assert_eq!(
        (lost, extra),
        (0, 0),
        "{when}: acknowledged events lost, unacknowledged stored ({} acknowledged, {} stored); warnings and errors:\n{}",
        acked.len(),
        ids.len(),
        log.join("\n")
    );
}

fn metric(server: &Server, name: &str) -> String {
    let text = server.get("/metrics").text();
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("{name} not in /metrics"))
        .to_string()
}

#[test]
#[ignore = "needs root to mount a tmpfs (.ci/run runs as root)"]
fn a_disk_filled_at_once_heals_without_a_restart() {
    let disk = Tmpfs::mount();
    fill_data_dir(disk.path());
    let mut server = Server::spawn(
        disk.path(),
        &["--min-free-disk-mb", "16", "--log-segment-mb", "4"],
    );
    let posters = Posters::start(server.addr);

    let filler = fill(disk.path());
    std::thread::sleep(FULL_FOR);
    let refused_while_full = posters.refused(503);
    assert!(
        refused_while_full.is_some(),
        "nothing was refused while the disk was full"
    );
    assert_eq!(server.get("/_readiness").status, 503);
    assert_eq!(server.get("/_liveness").status, 200);
    std::fs::remove_file(&filler).unwrap();
    let freed = Instant::now();

    // Healed by itself: capture, readiness, the compactor.
    let mut probes = Vec::new();
    let mut probe = || {
        let uuid = uuid::Uuid::now_v7().to_string();
        let body = json!({"api_key": KEY_ONE, "event": "probe", "distinct_id": uuid, "uuid": uuid});
        let ok = server.post("/capture/", body.to_string()).status == 200;
        if ok {
            probes.push(uuid);
        }
        ok
    };
    while !probe() {
        assert!(
            freed.elapsed() < HEAL_WITHIN,
            "capture still refused {HEAL_WITHIN:?} after space returned:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let healed = freed.elapsed();
    wait_for("readiness", || {
        (server.get("/_readiness").status == 200).then_some(())
    });
    assert_eq!(
        metric(&server, "flagpost_compactor_healthy"),
        "flagpost_compactor_healthy 1"
    );
    eprintln!(
        "capture accepted again {} ms after space returned",
        healed.as_millis()
    );

    std::thread::sleep(Duration::from_millis(500));
    let outcome = posters.finish();
    assert_eq!(outcome.unanswered, 0, "requests went unanswered");
    assert_eq!(
        outcome.without_retry_after, 0,
        "a refusal had no Retry-After"
    );
    let statuses: Vec<u16> = outcome.refused.keys().copied().collect();
    assert_eq!(statuses, vec![503], "refusals other than 503");
    // The probe answered 200 was acknowledged too.
    let mut acked = outcome.acked;
    acked.extend(probes);
    assert_stored_exactly_once(&server, &acked, &[], "after healing");
    // Which write meets the full disk first is a race: sled's (sled then keeps the
    // error and is reopened) or the event block files' (the step fails and is
    // retried; sled may never see the disk full). Either way it healed above.
    let log = server.log();
    let sled_failed = log.contains("the database keeps failing to write");
    let blocks_failed = log.contains("error=event block files: No space left on device");
    assert!(
        sled_failed || blocks_failed,
        "no write met the full disk:\n{log}"
    );
    if sled_failed {
        assert!(
            log.contains("database reopened"),
            "sled kept its write error and was never reopened:\n{log}"
        );
    }

    assert_eq!(
        server.stop(),
        Some(0),
        "SIGTERM after healing:\n{}",
        server.log()
    );
    let restarted = Server::spawn(disk.path(), &["--min-free-disk-mb", "16"]);
    assert_stored_exactly_once(&restarted, &acked, &[], "after a restart");
    drop(restarted);
}

/// The reopen patience the give-up test sets (`FLAGPOST_TEST_REOPEN_PATIENCE_MS`).
const PATIENCE: Duration = Duration::from_secs(2);
/// Past the patience, the server must have given up within this long.
const GIVE_UP_MARGIN: Duration = Duration::from_secs(5);
/// The watchdog interval the test announces (`WATCHDOG_USEC`): the server pings every
/// half interval while it is alive.
const WATCHDOG: Duration = Duration::from_millis(200);

/// A service manager's notify socket, heard on a thread: every datagram with when it
/// arrived.
struct NotifySocket {
    _dir: tempfile::TempDir,
    path: PathBuf,
    heard: Arc<Mutex<Vec<(Instant, String)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl NotifySocket {
    fn bind() -> NotifySocket {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let (heard, stop) = (
            Arc::new(Mutex::new(Vec::new())),
            Arc::new(AtomicBool::new(false)),
        );
        let (sink, stopped) = (heard.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = [0; 256];
            while !stopped.load(Ordering::Relaxed) {
                if let Ok(n) = socket.recv(&mut buf) {
                    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                    sink.lock().unwrap().push((Instant::now(), text));
                }
            }
        });
        NotifySocket {
            _dir: dir,
            path,
            heard,
            stop,
            thread: Some(thread),
        }
    }

    /// When each WATCHDOG=1 heard so far arrived.
    fn pings(&self) -> Vec<Instant> {
        let heard = self.heard.lock().unwrap();
        heard
            .iter()
            .filter(|(_, m)| m == "WATCHDOG=1")
            .map(|(at, _)| *at)
            .collect()
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Overwrite sled's `conf` file in place with as many bytes of text that is not a sled
/// configuration: sled then refuses to open the database with a corruption error (it
/// does not panic). Same length, so no space is needed on the full disk.
fn damage_conf(conf: &Path, len: usize) {
    let mut file = std::fs::OpenOptions::new().write(true).open(conf).unwrap();
    file.write_all(&vec![b'x'; len]).unwrap();
    file.sync_all().unwrap();
}

#[test]
#[ignore = "needs root to mount a tmpfs (.ci/run runs as root)"]
fn a_database_that_cannot_be_reopened_fails_liveness_and_starves_the_watchdog() {
    let disk = Tmpfs::mount();
    fill_data_dir(disk.path());
    let notify = NotifySocket::bind();
    let usec = WATCHDOG.as_micros().to_string();
    let patience = PATIENCE.as_millis().to_string();
    let mut server = Server::spawn_env(
        disk.path(),
        &["--min-free-disk-mb", "16", "--log-segment-mb", "4"],
        &[
            ("NOTIFY_SOCKET", notify.path.as_os_str()),
            ("WATCHDOG_USEC", usec.as_ref()),
            ("FLAGPOST_TEST_REOPEN_PATIENCE_MS", patience.as_ref()),
        ],
    );
    let posters = Posters::start(server.addr);
    assert!(!notify.pings().is_empty(), "no WATCHDOG=1 while healthy");
    // Once an event is stored, the event block file in use is made whole (its space
    // taken), so blocks still fit on the full disk and the write that meets it is
    // sled's, the one this test is about.
    server.wait_for_events(1, 1);

    // sled reads `conf` only when it opens the database, so damaging it while open is
    // the same as damaging it once the compactor has closed it, and leaves no window for
    // a reopen to succeed first (one can while the disk is still full).
    let conf = disk.path().join("db/conf");
    let good_conf = std::fs::read(&conf).unwrap();
    damage_conf(&conf, good_conf.len());
    let filled = Instant::now();
    let filler = fill(disk.path());
    wait_for(
        "the compactor to close the database that fails writing",
        || {
            server
                .log()
                .contains(
                    "the database keeps failing to write; reopening it once it can write again",
                )
                .then_some(())
        },
    );
    let recovering = Instant::now();
    std::fs::remove_file(&filler).unwrap();
    let r = server.get("/_liveness");
    assert_eq!(
        (r.status, r.text()),
        (200, "ok".to_string()),
        "gave up before the patience ran out:\n{}",
        server.log()
    );

    let dead = loop {
        let r = server.get("/_liveness");
        if r.status != 200 {
            assert_eq!(
                (r.status, r.text()),
                (503, "a component failed; restart".to_string())
            );
            break Instant::now();
        }
        assert!(
            recovering.elapsed() < PATIENCE + GIVE_UP_MARGIN,
            "/_liveness still 200 {:?} after the database was closed:\n{}",
            PATIENCE + GIVE_UP_MARGIN,
            server.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // The reopen's first failure came after the fill began.
    assert!(
        dead - filled >= PATIENCE,
        "gave up {:?} after the fill began, before the patience of {PATIENCE:?}",
        dead - filled
    );
    eprintln!(
        "/_liveness failed {} ms after the database was closed",
        (dead - recovering).as_millis()
    );

    // The ping in flight as liveness flipped may still arrive; none after that, for
    // more than two watchdog intervals.
    let quiet_from = dead + WATCHDOG / 2;
    std::thread::sleep(WATCHDOG / 2 + 3 * WATCHDOG);
    let pings = notify.pings();
    // Fed while the database was closed and being reopened, up to the give-up.
    assert!(
        pings
            .iter()
            .any(|&at| at > recovering && at < recovering + PATIENCE / 2),
        "the watchdog stopped while the database was being reopened"
    );
    assert!(
        pings
            .iter()
            .any(|&at| at > dead - 2 * WATCHDOG && at <= dead),
        "the watchdog stopped before /_liveness failed"
    );
    let late: Vec<Duration> = pings
        .iter()
        .filter(|&&at| at > quiet_from)
        .map(|&at| at - dead)
        .collect();
    assert_eq!(
        late,
        Vec::<Duration>::new(),
        "WATCHDOG=1 after /_liveness failed"
    );

    let log = server.log();
    for line in [
        "the database cannot be reopened; /_liveness fails so the service is restarted error=storage: Read corrupted data",
        "not alive: the systemd watchdog is no longer fed, so the service is restarted",
    ] {
        assert!(log.contains(line), "no {line:?} in the log:\n{log}");
    }
    assert!(
        !log.contains("database reopened"),
        "reopened after all:\n{log}"
    );

    let outcome = posters.finish();
    assert_eq!(outcome.unanswered, 0, "requests went unanswered");
    let statuses: Vec<u16> = outcome.refused.keys().copied().collect();
    assert_eq!(statuses, vec![503], "refusals other than 503");

    // What systemd does next: kill it (the watchdog), and here the damage is repaired
    // before the restart. Everything acknowledged is in the write-ahead log.
    server.kill();
    std::fs::write(&conf, &good_conf).unwrap();
    let restarted = Server::spawn(disk.path(), &["--min-free-disk-mb", "16"]);
    assert_stored_exactly_once(&restarted, &outcome.acked, &[], "after the restart");
    drop(restarted);
}

/// Killed (SIGKILL) while the disk is full, three times, each restart after space
/// returned: the events acknowledged before each fill are all stored, once.
#[test]
#[ignore = "needs root to mount a tmpfs (.ci/run runs as root)"]
fn kills_while_the_disk_is_full_lose_nothing_acknowledged() {
    let disk = Tmpfs::mount();
    fill_data_dir(disk.path());
    let args = ["--min-free-disk-mb", "16", "--log-segment-mb", "1"];
    let mut server = Server::spawn(disk.path(), &args);
    let (mut acked, mut in_flight): (Vec<String>, Vec<String>) = Default::default();
    for round in 0..3 {
        let posters = Posters::start(server.addr);
        let filler = fill(disk.path());
        std::thread::sleep(Duration::from_millis(300 + 200 * round));
        server.kill();
        let outcome = posters.finish();
        std::fs::remove_file(&filler).unwrap();
        // Each round puts something at stake: a round that acknowledged nothing would
        // pass whatever the restart lost.
        assert!(
            outcome.acked.len() >= 20 * BATCH,
            "round {round}: only {} events acknowledged",
            outcome.acked.len()
        );
        acked.extend(outcome.acked);
        // The space guard measures once a second: a kill before it saw the fill can
        // cut off a request whose events were already written.
        in_flight.extend(outcome.unanswered_ids);
        server = Server::spawn(disk.path(), &args);
        assert_stored_exactly_once(&server, &acked, &in_flight, &format!("after kill {round}"));
    }
}

/// A server started on a full disk stops at once and says so, naming the database and
/// what to do, rather than blaming the directory.
#[test]
#[ignore = "needs root to mount a tmpfs (.ci/run runs as root)"]
fn a_start_on_a_full_disk_says_the_disk_is_full() {
    let disk = Tmpfs::mount();
    fill_data_dir(disk.path());
    let filler = fill(disk.path());
    let out = Command::new(env!("CARGO_BIN_EXE_flagpost"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--min-free-disk-mb",
            "0",
        ])
        .arg("--data-dir")
        .arg(disk.path().join("data"))
        .arg("--db")
        .arg(disk.path().join("db"))
        .output()
        .unwrap();
    std::fs::remove_file(&filler).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let expected = format!(
        "flagpost: database {}: the disk is full; free space on its disk and start again \
         (under systemd the service is restarted by itself); nothing acknowledged is lost\n",
        disk.path().join("db").display()
    );
    assert!(stderr.ends_with(&expected), "{stderr}");
}
