//! A disk filled at once, on a real (size-limited tmpfs) filesystem the test mounts:
//! the server refuses events while it is full and heals by itself once space is back,
//! sled included, with every acknowledged event stored exactly once, before and after
//! a restart.

use std::collections::{HashMap, HashSet};
use std::io::Write;
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
}

fn post_batches(addr: std::net::SocketAddr, stop: &AtomicBool, out: &Mutex<Outcome>) {
    while !stop.load(Ordering::Relaxed) {
        let uuids: Vec<String> = (0..BATCH)
            .map(|_| uuid::Uuid::now_v7().to_string())
            .collect();
        let batch: Vec<_> = uuids
            .iter()
            .map(|u| json!({"event": "e", "distinct_id": u, "uuid": u}))
            .collect();
        let body = json!({"api_key": KEY_ONE, "batch": batch}).to_string();
        let resp = try_send(addr, Req::post("/batch/", body));
        let mut out = out.lock().unwrap();
        match resp {
            Some(r) if r.status == 200 => out.acked.extend(uuids),
            Some(r) => {
                *out.refused.entry(r.status).or_default() += 1;
                if r.header("retry-after").is_none() {
                    out.without_retry_after += 1;
                }
                drop(out);
                std::thread::sleep(Duration::from_millis(50));
            }
            None => out.unanswered += 1,
        }
    }
}

/// Stored uuids, each once, equal to `acked`.
fn assert_stored_exactly_once(server: &Server, acked: &[String], when: &str) {
    let stored = server.settle(1);
    let ids: Vec<&str> = stored.iter().map(|e| e["id"].as_str().unwrap()).collect();
    let unique: HashSet<&str> = ids.iter().copied().collect();
    assert_eq!(ids.len(), unique.len(), "{when}: an event is stored twice");
    let acked: HashSet<&str> = acked.iter().map(String::as_str).collect();
    let lost = acked.difference(&unique).count();
    let extra = unique.difference(&acked).count();
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
    let stop = Arc::new(AtomicBool::new(false));
    let outcome = Arc::new(Mutex::new(Outcome::default()));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (stop, out, addr) = (stop.clone(), outcome.clone(), server.addr);
            std::thread::spawn(move || post_batches(addr, &stop, &out))
        })
        .collect();
    wait_for("events acknowledged before the fill", || {
        (outcome.lock().unwrap().acked.len() >= 20 * BATCH).then_some(())
    });

    let filler = fill(disk.path());
    std::thread::sleep(FULL_FOR);
    let refused_while_full = outcome.lock().unwrap().refused.get(&503).copied();
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
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let outcome = Arc::try_unwrap(outcome).ok().unwrap().into_inner().unwrap();
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
    assert_stored_exactly_once(&server, &acked, "after healing");
    let log = server.log();
    assert!(
        log.contains("database reopened"),
        "sled was never reopened:\n{log}"
    );

    assert_eq!(
        server.stop(),
        Some(0),
        "SIGTERM after healing:\n{}",
        server.log()
    );
    let restarted = Server::spawn(disk.path(), &["--min-free-disk-mb", "16"]);
    assert_stored_exactly_once(&restarted, &acked, "after a restart");
    drop(restarted);
}
