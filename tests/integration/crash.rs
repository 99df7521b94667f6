//! Crash safety: clients ingest continuously while the server is killed with SIGKILL
//! at random moments and restarted. Every event that got a 2xx must be stored exactly
//! once, and the store must open every time.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::json;

use crate::util::*;

const KILLS: usize = 12;
const CLIENTS: usize = 4;
const EVENTS_PER_REQUEST: usize = 10;

/// A small deterministic generator, seeded per run and printed, so a failure can be
/// replayed with the same kill moments.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[test]
fn acknowledged_events_survive_random_kills_exactly_once() {
    let seed = std::env::var("FLAGPOST_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("crash test seed {seed} (FLAGPOST_CRASH_SEED={seed} replays it)");
    let mut rng = Lcg(seed);
    let acked: Mutex<HashSet<String>> = Mutex::new(HashSet::new());
    // Small log segments, so kills also land around segment changes.
    let mut server = Server::start_with(&["--log-segment-mb", "1"]);
    let mut sent_while_killed = 0usize;
    for cycle in 0..KILLS {
        let stop = AtomicBool::new(false);
        let addr = server.addr;
        let unacknowledged = std::thread::scope(|s| {
            let clients: Vec<_> = (0..CLIENTS)
                .map(|c| {
                    let (stop, acked) = (&stop, &acked);
                    s.spawn(move || {
                        let mut failed = 0;
                        while !stop.load(Ordering::Relaxed) {
                            let ids: Vec<String> = (0..EVENTS_PER_REQUEST).map(|_| uuid::Uuid::now_v7().to_string()).collect();
                            let batch: Vec<_> = ids
                                .iter()
                                .map(|id| json!({"event": "crash", "uuid": id,
                                                 "properties": {"distinct_id": format!("c{c}"), "$set": {"cycle": cycle}}}))
                                .collect();
                            let body = json!({"api_key": KEY_ONE, "batch": batch}).to_string();
                            match try_send(addr, Req::post("/batch/", body)) {
                                Some(r) if r.status == 200 => acked.lock().unwrap().extend(ids),
                                _ => {
                                    // Killed mid-request, or refused while restarting.
                                    failed += 1;
                                    std::thread::sleep(Duration::from_millis(5));
                                }
                            }
                        }
                        failed
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(100 + rng.next() % 500));
            server.kill();
            std::thread::sleep(Duration::from_millis(50));
            stop.store(true, Ordering::Relaxed);
            clients
                .into_iter()
                .map(|c| c.join().unwrap())
                .sum::<usize>()
        });
        sent_while_killed += unacknowledged;
        // The store must open again after every kill.
        server = server.restart_hard();
        assert_eq!(server.get("/_readiness").status, 200, "cycle {cycle}");
    }
    let acked = acked.into_inner().unwrap();
    let events = server.settle(1);
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for e in &events {
        *counts.entry(e["id"].as_str().unwrap()).or_insert(0) += 1;
    }
    let doubled: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(doubled.is_empty(), "stored more than once: {doubled:?}");
    let lost: Vec<_> = acked
        .iter()
        .filter(|id| !counts.contains_key(id.as_str()))
        .collect();
    // On a loss, the server's warnings and errors say where (a skipped range, a gap, a
    // quarantined entry, a storage error).
    let log = server.log();
    let noteworthy: Vec<&str> = log.lines().filter(|l| !l.contains(" INFO ")).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged events lost, e.g. {:?}; the server's warnings and errors:\n{}",
        lost.len(),
        lost.first(),
        noteworthy.join("\n")
    );
    eprintln!(
        "crash test: {KILLS} kills survived; {} events acknowledged, all found once; {} events stored in all \
         (the rest were in flight at a kill); {sent_while_killed} requests failed around kills",
        acked.len(),
        events.len()
    );
    assert!(
        acked.len() >= KILLS * CLIENTS * EVENTS_PER_REQUEST,
        "too little traffic to mean anything"
    );
}

/// Reserve 600 MiB less than is free now, then take 1.2 GiB: the server must refuse
/// new events with 503 and Retry-After, report not ready, and accept again by itself
/// once the space is back.
#[test]
fn a_full_disk_refuses_events_and_recovers_by_itself() {
    let tmp = data_dir();
    let free_mib = flagpost::log::space::free_bytes(tmp.path()).unwrap() / (1024 * 1024);
    assert!(
        free_mib >= 3000,
        "the disk-full test needs 3 GB free in the temporary directory; {free_mib} MiB are"
    );
    let reserve = (free_mib - 600).to_string();
    let server = Server::spawn(tmp.path(), &["--min-free-disk-mb", &reserve]);
    let event =
        |name: &str| json!({"api_key": KEY_ONE, "event": name, "distinct_id": "d"}).to_string();
    assert_eq!(server.post("/capture/", event("before")).status, 200);

    let filler = tmp.path().join("filler");
    let file = std::fs::File::create(&filler).unwrap();
    let size: libc::off_t = 1200 * 1024 * 1024;
    // SAFETY: a valid open file descriptor and a positive length.
    let rc = unsafe { libc::posix_fallocate(std::os::fd::AsRawFd::as_raw_fd(&file), 0, size) };
    assert_eq!(rc, 0, "posix_fallocate");
    eprintln!(
        "reserve {reserve} MiB, free now {} MiB",
        flagpost::log::space::free_bytes(tmp.path()).unwrap() / 1048576
    );
    // Until the guard's next measurement events are still accepted, and stored.
    let mut accepted = Vec::new();
    let mut attempt = 0;
    let (refused, refused_name) = wait_for("events to be refused", || {
        attempt += 1;
        let name = format!("while-filling-{attempt}");
        let r = server.post("/capture/", event(&name));
        if r.status == 200 {
            accepted.push(name);
            return None;
        }
        Some((r, name))
    });
    assert_eq!(refused.header("retry-after"), Some("5"));
    assert_eq!(refused.json()["code"], "unavailable");
    assert_eq!(server.get("/_readiness").status, 503);
    assert!(
        server.log().contains("disk nearly full"),
        "{}",
        server.log()
    );

    drop(file);
    std::fs::remove_file(&filler).unwrap();
    wait_for("events to be accepted again", || {
        (server.post("/capture/", event("after")).status == 200).then_some(())
    });
    assert_eq!(server.get("/_readiness").status, 200);
    let names: Vec<String> = server
        .settle(1)
        .iter()
        .map(|e| e["event"].as_str().unwrap().to_string())
        .collect();
    assert!(names.contains(&"before".to_string()) && names.contains(&"after".to_string()));
    assert!(
        accepted.iter().all(|n| names.contains(n)),
        "every acknowledged event stored"
    );
    assert!(
        !names.contains(&refused_name),
        "the refused event was not stored"
    );
    assert_eq!(refused.status, 503);
}

/// Persons across kills while the compactor folds them into runs: each request brings
/// new persons and changes older ones with `$set`. A cycle sends until a fold of the
/// persons has finished since it began (a new run on disk), then kills the server at a
/// moment the seed chooses: as soon as the next fold is seen under way (a run being
/// made), or after a few more acknowledged requests. Every cycle so folds at least once
/// and is killed among folds, however slow the machine: what is waited for is the fold,
/// never a length of time. After the kills, every distinct id whose event got a 2xx has
/// its person, holding what its last acknowledged event set or what a later one did.
#[test]
fn persons_survive_random_kills_while_they_are_folded() {
    kills_while_folded(&[]);
}

/// The same with the persons' runs split into parts of a few dozen persons, so each
/// fold replaces many runs through one manifest and is killed among those switches.
/// (Which parts a fold keeps is tested in `src/store/layered/tests/parts.rs`: these
/// changes fall in every range, so most folds here rewrite every part.)
#[test]
fn persons_survive_random_kills_while_their_split_runs_are_folded() {
    let part_bytes = std::ffi::OsStr::new("32768");
    let (parts, _) = kills_while_folded(&[("FLAGPOST_TABLE_PART_BYTES", part_bytes)]);
    assert!(parts.len() > 4, "the persons' runs in parts: {parts:?}");
}

/// Run the kill cycles on a server with `env`; the runs the persons' manifest names at
/// the end, and the servers' logs.
fn kills_while_folded(env: &[(&str, &std::ffi::OsStr)]) -> (Vec<String>, String) {
    const FOLD_KILLS: usize = 8;
    const NEW_PER_REQUEST: u64 = 40;
    /// A cycle still without a fold after this many acknowledged requests fails: its
    /// delta is then tens of times the size that makes a fold due.
    const MAX_REQUESTS_PER_CYCLE: usize = 1000;
    let seed = std::env::var("FLAGPOST_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("fold crash test seed {seed} (FLAGPOST_CRASH_SEED={seed} replays its choices)");
    let mut rng = Lcg(seed);
    let mut server = Server::start_env(&[], env);
    let tables = server.dir.join("db/tables");
    // Distinct id -> the value its last acknowledged event set.
    let mut acked: HashMap<String, u64> = HashMap::new();
    let (mut persons, mut seq) = (0u64, 0u64);
    let mut killed_mid_fold = 0;
    let mut logs = String::new();
    for cycle in 0..FOLD_KILLS {
        let (stop, done) = (AtomicBool::new(false), AtomicBool::new(false));
        let requests = AtomicUsize::new(0);
        let addr = server.addr;
        let (before, _) = persons_runs(&tables);
        // Half the cycles are killed as the next fold runs (or, should it be over too
        // fast to be seen, once it has finished); the others a few requests after one.
        let into_next_fold = rng.next().is_multiple_of(2);
        let extra = (rng.next() % 4) as usize;
        let mut changes = Lcg(rng.next());
        std::thread::scope(|s| {
            let client = s.spawn(|| {
                while !stop.load(Ordering::Relaxed)
                    && requests.load(Ordering::Relaxed) < MAX_REQUESTS_PER_CYCLE
                {
                    // Paced, so the compactor keeps up and the check after stays short.
                    std::thread::sleep(Duration::from_millis(40));
                    let mut set: Vec<(String, u64)> = Vec::new();
                    for n in persons..persons + NEW_PER_REQUEST {
                        seq += 1;
                        set.push((format!("p{n}"), seq));
                    }
                    for _ in 0..10.min(persons) {
                        seq += 1;
                        set.push((format!("p{}", changes.next() % persons), seq));
                    }
                    let batch: Vec<_> = set
                        .iter()
                        .map(|(id, v)| {
                            json!({"event": "fold", "distinct_id": id,
                                   "properties": {"$set": {"v": v, "cycle": cycle}}})
                        })
                        .collect();
                    let body = json!({"api_key": KEY_ONE, "batch": batch}).to_string();
                    match try_send(addr, Req::post("/batch/", body)) {
                        Some(r) if r.status == 200 => {
                            persons += NEW_PER_REQUEST;
                            for (id, v) in set {
                                acked.insert(id, v);
                            }
                            requests.fetch_add(1, Ordering::Relaxed);
                        }
                        // Killed: the cycle is over.
                        _ => break,
                    }
                }
                done.store(true, Ordering::Relaxed);
            });
            let mut folded_at = None;
            loop {
                let (finished, making) = persons_runs(&tables);
                let sent = requests.load(Ordering::Relaxed);
                if folded_at.is_none() && finished > before {
                    folded_at = Some((sent, finished));
                }
                if let Some((at, first)) = folded_at {
                    let due = match into_next_fold {
                        true => finished > first,
                        false => sent >= at + extra,
                    };
                    if making || due {
                        killed_mid_fold += usize::from(making);
                        eprintln!(
                            "cycle {cycle}: a fold after {at} requests, killed after {sent}{}",
                            if making { " during the next fold" } else { "" }
                        );
                        break;
                    }
                }
                if done.load(Ordering::Relaxed) {
                    stop.store(true, Ordering::Relaxed);
                    panic!(
                        "cycle {cycle}: no fold of the persons after {sent} acknowledged requests; the server's log:\n{}",
                        server.log()
                    );
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            server.kill();
            stop.store(true, Ordering::Relaxed);
            client.join().unwrap();
        });
        logs.push_str(&server.log());
        server = server.restart_hard_env(env);
        assert_eq!(server.get("/_readiness").status, 200, "cycle {cycle}");
    }
    server.settle(1);
    let mut wrong = Vec::new();
    for (id, v) in &acked {
        let r = server.api(
            &format!("/api/projects/1/persons/?distinct_id={id}"),
            PERSONAL_ONE,
        );
        assert_eq!(r.status, 200);
        let stored = r.json()["results"][0]["properties"]["v"].as_u64();
        if stored.is_none_or(|s| s < *v) {
            wrong.push((id.clone(), *v, stored));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} persons lost or behind, e.g. {:?}; the server's warnings and errors:\n{}",
        wrong.len(),
        acked.len(),
        wrong.first(),
        server
            .log()
            .lines()
            .filter(|l| !l.contains(" INFO "))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Each cycle saw a fold finish, and a finished run is the table's until a later
    // one replaces it: at least one generation a cycle.
    let (generation, _) = persons_runs(&tables);
    eprintln!(
        "fold crash test: {FOLD_KILLS} kills ({killed_mid_fold} during a fold), {} persons acknowledged, all found; persons' run generation {generation}",
        acked.len()
    );
    assert!(
        generation >= FOLD_KILLS as u64,
        "generation {generation} after {FOLD_KILLS} cycles that each saw a fold"
    );
    logs.push_str(&server.log());
    (manifest_runs(&tables.join("persons.manifest")), logs)
}

/// The run files a manifest names (none when it cannot be read).
fn manifest_runs(path: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .skip(1)
        .filter(|l| !l.starts_with("end "))
        .filter_map(|l| Some(l.split_once(' ')?.1.to_owned()))
        .collect()
}

/// The newest finished run of the persons in `tables` (the newest its manifest names,
/// or without one the newest `.run`), and whether a run of a later generation is being
/// made (a fold under way).
fn persons_runs(tables: &std::path::Path) -> (u64, bool) {
    let generation = |file: &str, suffix: &str| {
        file.strip_prefix("persons.")?
            .strip_suffix(suffix)?
            .parse::<u64>()
            .ok()
    };
    let named = manifest_runs(&tables.join("persons.manifest"));
    let mut finished = named
        .iter()
        .filter_map(|f| generation(f, ".part").or_else(|| generation(f, ".run")))
        .max()
        .unwrap_or(0);
    let mut making = Vec::new();
    for entry in std::fs::read_dir(tables).into_iter().flatten() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if let Some(g) = generation(&name, ".run.new") {
            making.push(g);
        } else if let Some(g) = generation(&name, ".part").filter(|_| !named.contains(&name)) {
            making.push(g);
        } else if let Some(g) = generation(&name, ".run").filter(|_| named.is_empty()) {
            finished = finished.max(g);
        }
    }
    (finished, making.iter().any(|&g| g > finished))
}
