//! `flagpost backup` and `flagpost restore` against the real binary: a backup taken
//! while clients capture holds every event acknowledged before it was asked for, each
//! once, with persons intact; the admin socket is 0600; a non-empty destination, a
//! backup without its manifest and a file cut short are refused; a stopped database is
//! backed up directly.

use std::collections::HashSet;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::*;

const BATCH: usize = 20;

fn flagpost(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flagpost"))
        .args(args)
        .output()
        .expect("run flagpost")
}

fn text(out: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// Post batches until stopped; every uuid of a 200 goes into `acked`.
fn post_batches(server: std::net::SocketAddr, stop: &AtomicBool, acked: &Mutex<Vec<String>>) {
    post_batches_until(server, stop, BATCH, |uuids, answer| {
        if answer.is_some_and(|r| r.status == 200) {
            acked.lock().unwrap().extend(uuids);
        }
    });
}

/// A person made of two distinct ids with properties.
fn identify(server: &Server) -> Vec<String> {
    let uuids: Vec<String> = (0..2).map(|_| uuid::Uuid::now_v7().to_string()).collect();
    let batch = json!([
        {"event": "$pageview", "distinct_id": "anon-b", "uuid": uuids[0], "properties": {"$set_once": {"first_seen": "ad"}}},
        {"event": "$identify", "distinct_id": "ada@example.com", "uuid": uuids[1], "properties": {"$anon_distinct_id": "anon-b", "$set": {"email": "ada@example.com"}}},
    ]);
    let body = json!({"api_key": KEY_ONE, "batch": batch}).to_string();
    assert_eq!(server.post("/batch/", body).status, 200);
    uuids
}

fn assert_person(server: &Server) {
    let r = server.api("/api/projects/1/persons/?distinct_id=anon-b", PERSONAL_ONE);
    assert_eq!(r.status, 200, "{}", r.text());
    let person = &r.json()["results"][0];
    assert_eq!(
        person["properties"],
        json!({"first_seen": "ad", "email": "ada@example.com"})
    );
    let mut ids: Vec<&str> = person["distinct_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["ada@example.com", "anon-b"]);
}

/// The stored uuids of project 1, checked to be each stored once.
fn stored_once(server: &Server) -> HashSet<String> {
    let stored = server.settle(1);
    let ids: Vec<String> = stored
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    let unique: HashSet<String> = ids.iter().cloned().collect();
    assert_eq!(ids.len(), unique.len(), "an event is stored twice");
    unique
}

#[test]
fn a_backup_taken_while_capturing_restores_every_acknowledged_event_once() {
    let mut server = Server::start_with(&["--log-segment-mb", "1"]);
    let db = server.dir.join("db");
    let socket = db.join("admin.sock");
    let meta = std::fs::symlink_metadata(&socket).expect("the admin socket");
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);

    let mut before = identify(&server);
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (stop, acked, addr) = (stop.clone(), acked.clone(), server.addr);
            std::thread::spawn(move || post_batches(addr, &stop, &acked))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));

    let root = tempfile::tempdir().unwrap();
    let dest = root.path().join("backup");
    before.extend(acked.lock().unwrap().iter().cloned());
    let started = Instant::now();
    let out = flagpost(&["backup", "--db", path(&db), "--to", path(&dest)]);
    let took = started.elapsed();
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(stdout.contains("(taken by the running server)"), "{stdout}");
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let mut all: HashSet<String> = acked.lock().unwrap().iter().cloned().collect();
    all.extend(before.iter().cloned());

    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dest.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["running"], true);
    assert_eq!(manifest["format"], "flagpost-backup");
    let bytes: u64 = manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["bytes"].as_u64().unwrap())
        .sum();
    eprintln!(
        "backup of {} acknowledged events under load: command {} ms, server {} ms, compactor paused {} ms, {} bytes, {} files, checkpoint {} log end {}",
        before.len(),
        took.as_millis(),
        manifest["took_ms"],
        manifest["compactor_paused_ms"],
        bytes,
        manifest["files"].as_array().unwrap().len(),
        manifest["checkpoint"],
        manifest["log_end"]
    );

    // Into a destination that is not empty: refused, nothing changed.
    let again = flagpost(&["backup", "--db", path(&db), "--to", path(&dest)]);
    assert!(!again.status.success());
    assert_eq!(
        String::from_utf8_lossy(&again.stderr),
        format!(
            "flagpost: {} is not empty; give a new or empty directory\n",
            dest.display()
        )
    );
    assert_eq!(server.stop(), Some(0));
    assert!(!socket.exists(), "the socket is removed at a clean stop");

    // Restored into a new directory and served from there.
    let new_root = tempfile::tempdir().unwrap();
    fill_data_dir(new_root.path());
    let new_db = new_root.path().join("db");
    let out = flagpost(&["restore", "--from", path(&dest), "--db", path(&new_db)]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("next:"));
    let mut restored = Server::spawn(new_root.path(), &[]);
    let stored = stored_once(&restored);
    let lost: Vec<&String> = before.iter().filter(|u| !stored.contains(*u)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} events acknowledged before the backup are missing; log:\n{}",
        lost.len(),
        before.len(),
        restored.log()
    );
    let unknown = stored.iter().filter(|u| !all.contains(*u)).count();
    assert_eq!(unknown, 0, "stored events nobody acknowledged");
    assert_person(&restored);
    let log = restored.log();
    assert!(!log.contains(" ERROR ") && !log.contains(" WARN "), "{log}");
    assert_eq!(restored.stop(), Some(0));
}

#[test]
fn a_stopped_database_is_backed_up_and_a_damaged_backup_is_refused() {
    let mut server = Server::start();
    let mut acked = identify(&server);
    for _ in 0..3 {
        let uuids: Vec<String> = (0..BATCH)
            .map(|_| uuid::Uuid::now_v7().to_string())
            .collect();
        let batch: Vec<_> = uuids
            .iter()
            .map(|u| json!({"event": "e", "distinct_id": u, "uuid": u}))
            .collect();
        let body = json!({"api_key": KEY_ONE, "batch": batch}).to_string();
        assert_eq!(server.post("/batch/", body).status, 200);
        acked.extend(uuids);
    }
    let stored = stored_once(&server);
    assert_eq!(stored.len(), acked.len());
    assert_eq!(server.stop(), Some(0));

    let db = server.dir.join("db");
    let root = tempfile::tempdir().unwrap();
    let dest = root.path().join("backup");
    let out = flagpost(&["backup", "--db", path(&db), "--to", path(&dest)]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        stdout.contains("(taken from the stopped database)"),
        "{stdout}"
    );

    // A copy with a file cut short, and one without its manifest: both refused.
    let refused = |damage: &dyn Fn(&Path), expect: &str| {
        let copy = root.path().join(format!("copy-{}", expect.len()));
        copy_dir(&dest, &copy);
        damage(&copy);
        let new_db = root.path().join(format!("new-{}", expect.len()));
        let out = flagpost(&["restore", "--from", path(&copy), "--db", path(&new_db)]);
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(stderr.contains(expect), "{stderr}");
        assert!(!new_db.exists(), "nothing written for a refused backup");
    };
    refused(
        &|copy: &Path| {
            let trees = copy.join("trees.bin");
            let len = std::fs::metadata(&trees).unwrap().len();
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&trees)
                .unwrap();
            file.set_len(len - 10).unwrap();
        },
        "bytes, the manifest says",
    );
    refused(
        &|copy: &Path| std::fs::remove_file(copy.join("manifest.json")).unwrap(),
        "has no manifest.json: the backup did not finish",
    );

    let new_root = tempfile::tempdir().unwrap();
    fill_data_dir(new_root.path());
    let new_db = new_root.path().join("db");
    let out = flagpost(&["restore", "--from", path(&dest), "--db", path(&new_db)]);
    assert!(out.status.success(), "{}", text(&out));
    let mut restored = Server::spawn(new_root.path(), &[]);
    let stored = stored_once(&restored);
    let acked: HashSet<String> = acked.into_iter().collect();
    assert_eq!(stored, acked);
    assert_person(&restored);
    assert_eq!(restored.stop(), Some(0));
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}
