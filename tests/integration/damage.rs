//! Damage to a stopped server's write-ahead log, as an operator could meet it: a byte
//! flipped inside the newest segment, a segment deleted. The backlog the compactor has
//! not applied yet is written with the log's own appender while the server is stopped
//! (the files are what the server writes), so the test knows exactly which events each
//! entry holds; after restarts, exactly the events of the damaged or deleted entries
//! are missing, each other event is stored once, and the loss is counted and logged.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use flagpost::log::record::{encode_frame, Record};

use crate::util::*;

const SEGMENT_MB: u64 = 1;
const ENTRIES: usize = 600;
const PER_ENTRY: usize = 20;

/// One entry the test appended: its number and its events' uuids.
struct Written {
    seq: u64,
    uuids: Vec<String>,
}

/// Append a backlog to the stopped server's log, as its writer would, and stop cleanly.
fn append_backlog(db: &Path) -> Vec<Written> {
    let (mut log, _reader, preparer) =
        flagpost::log::open(&db.join("wal"), 1, None, SEGMENT_MB * 1024 * 1024).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let mut written = Vec::new();
    for entry in 0..ENTRIES {
        let mut uuids = Vec::new();
        let records: Vec<Vec<u8>> = (0..PER_ENTRY)
            .map(|i| {
                let uuid = uuid::Uuid::now_v7();
                uuids.push(uuid.to_string());
                let data = serde_json::json!({
                    "event": "backlog", "distinct_id": format!("d{entry}"),
                    "properties": {"i": i, "pad": "p".repeat(200)}, "uuid": uuid.to_string(),
                });
                Record {
                    project: 1,
                    received_at: now,
                    timestamp: now,
                    sent_at: None,
                    uuid,
                    historical: false,
                    ip: None,
                    event: "backlog".into(),
                    distinct_id: format!("d{entry}"),
                    data: data.to_string().into_bytes(),
                }
                .encode()
            })
            .collect();
        let seq = log
            .push(&encode_frame(records.iter().map(Vec::as_slice)))
            .unwrap();
        written.push(Written { seq, uuids });
    }
    log.commit().unwrap();
    log.mark_clean().unwrap();
    preparer.stop();
    written
}

/// Segment files, first number -> path, oldest first.
fn segments(db: &Path) -> BTreeMap<u64, std::path::PathBuf> {
    std::fs::read_dir(db.join("wal"))
        .unwrap()
        .filter_map(|e| {
            let path = e.unwrap().path();
            let name = path
                .file_name()?
                .to_str()?
                .strip_suffix(".log")?
                .to_string();
            Some((name.parse().ok()?, path))
        })
        .collect()
}

/// (number, offset) of each entry in a segment.
fn frames(path: &Path, first: u64) -> Vec<(u64, u64)> {
    let bytes = std::fs::read(path).unwrap();
    let (mut at, mut seq, mut out) = (0usize, first, Vec::new());
    while at + 16 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let found = u64::from_le_bytes(bytes[at + 8..at + 16].try_into().unwrap());
        if len == 0 || found != seq {
            break;
        }
        out.push((seq, at as u64));
        at += 16 + len;
        seq += 1;
    }
    out
}

/// Start on the damaged database, and check it holds exactly `expected`, once each,
/// now and after another restart.
fn restart_and_check(dir: &Path, expected: &[String]) -> (String, String) {
    let server = Server::spawn(dir, &["--log-segment-mb", "1"]);
    let stored = uuids(&server.settle(1));
    assert_eq!(stored.len(), expected.len(), "{}", server.log());
    assert_eq!(stored, sorted(expected));
    let metrics = server.get("/metrics").text();
    let log = server.log();
    let mut server = server;
    assert_eq!(server.stop(), Some(0));
    let server = Server::spawn(dir, &["--log-segment-mb", "1"]);
    assert_eq!(uuids(&server.settle(1)), sorted(expected));
    (log, metrics)
}

fn uuids(events: &[serde_json::Value]) -> Vec<String> {
    let mut ids: Vec<String> = events
        .iter()
        .filter(|e| e["event"] == "backlog")
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

fn sorted(ids: &[String]) -> Vec<String> {
    let mut ids = ids.to_vec();
    ids.sort();
    ids
}

/// A stopped server with a backlog of the test's entries; returns its temp dir.
fn stopped_with_backlog() -> (tempfile::TempDir, Vec<Written>) {
    let tmp = data_dir();
    let mut server = Server::spawn(tmp.path(), &["--log-segment-mb", "1"]);
    server.settle(1);
    assert_eq!(server.stop(), Some(0));
    let written = append_backlog(&tmp.path().join("db"));
    (tmp, written)
}

fn metric(metrics: &str, name: &str) -> Option<u64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn a_flipped_byte_in_the_newest_segment_loses_only_that_entry() {
    let (tmp, written) = stopped_with_backlog();
    let db = tmp.path().join("db");
    let segs = segments(&db);
    let (&first, path) = segs.iter().next_back().unwrap();
    let entries = frames(path, first);
    assert!(
        entries.len() >= 10,
        "{} entries in the newest",
        entries.len()
    );
    let (seq, offset) = entries[entries.len() / 2];
    let file = OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(&[0xAA; 8], offset + 16 + 100).unwrap();
    drop(file);
    let damaged = written.iter().find(|w| w.seq == seq).unwrap();
    let expected: Vec<String> = written
        .iter()
        .filter(|w| w.seq != seq)
        .flat_map(|w| w.uuids.clone())
        .collect();
    assert_eq!(expected.len(), ENTRIES * PER_ENTRY - damaged.uuids.len());
    let (log, metrics) = restart_and_check(tmp.path(), &expected);
    assert!(log.contains("damaged write-ahead log entries"), "{log}");
    assert!(!log.contains("never acknowledged"), "{log}");
    assert_eq!(
        metric(&metrics, "flagpost_log_entries_quarantined_total"),
        Some(1)
    );
    assert_eq!(
        metric(&metrics, "flagpost_log_entries_missing_total"),
        Some(0)
    );
    assert_eq!(metric(&metrics, "flagpost_log_entries_torn_total"), Some(0));
}

#[test]
fn a_deleted_segment_is_logged_and_counted_with_its_numbers() {
    for which in ["middle", "newest"] {
        let (tmp, written) = stopped_with_backlog();
        let db = tmp.path().join("db");
        let segs = segments(&db);
        let firsts: Vec<u64> = segs.keys().copied().collect();
        // The backlog's segments: those above the server's own first segment.
        assert!(firsts.len() >= 4, "{firsts:?}");
        let index = match which {
            "middle" => firsts.len() - 2,
            _ => firsts.len() - 1,
        };
        let gone = firsts[index];
        let end = firsts.get(index + 1).copied().unwrap_or(u64::MAX);
        std::fs::remove_file(&segs[&gone]).unwrap();
        let lost: Vec<&Written> = written
            .iter()
            .filter(|w| (gone..end).contains(&w.seq))
            .collect();
        assert!(!lost.is_empty());
        let expected: Vec<String> = written
            .iter()
            .filter(|w| !(gone..end).contains(&w.seq))
            .flat_map(|w| w.uuids.clone())
            .collect();
        let (log, metrics) = restart_and_check(tmp.path(), &expected);
        assert!(
            log.contains("write-ahead log entries missing"),
            "{which}: {log}"
        );
        assert!(log.contains(&format!("from={gone}")), "{which}: {log}");
        assert_eq!(
            metric(&metrics, "flagpost_log_entries_missing_total"),
            Some(lost.len() as u64),
            "{which}"
        );
    }
}

fn check_db(db: &Path) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flagpost"))
        .args(["check", "--db"])
        .arg(db)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// `flagpost check --db` on a stopped server: clean, then with an entry damaged and a
/// segment deleted, each named with its numbers, exit 1.
#[test]
fn check_db_names_damaged_and_missing_log_entries() {
    let (tmp, _written) = stopped_with_backlog();
    let db = tmp.path().join("db");
    let (code, out) = check_db(&db);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("ok: tree event_blocks: "), "{out}");
    assert!(!out.contains("error:"), "{out}");
    let segs = segments(&db);
    let firsts: Vec<u64> = segs.keys().copied().collect();
    let newest = *firsts.last().unwrap();
    let (seq, offset) = frames(&segs[&newest], newest)[3];
    let file = OpenOptions::new().write(true).open(&segs[&newest]).unwrap();
    file.write_all_at(&[0xAA; 8], offset + 16 + 100).unwrap();
    drop(file);
    let gone = firsts[firsts.len() - 2];
    std::fs::remove_file(&segs[&gone]).unwrap();
    let (code, out) = check_db(&db);
    assert_eq!(code, Some(1), "{out}");
    let errors: Vec<&str> = out.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(
        errors,
        [
            format!(
                "error: log entries {gone} to {} ({} entries): missing between segment {} and segment {newest}",
                newest - 1,
                newest - gone,
                firsts[firsts.len() - 3]
            ),
            format!(
                "error: log entries {seq} to {seq} (1 entries): damaged (segment {newest}); the compactor quarantines them"
            ),
        ],
        "{out}"
    );
}

/// An event block file damaged while the server is stopped: `check --db` names the
/// block and exits 1; a start skips that block with a warning and serves every other
/// event.
#[test]
fn a_damaged_block_file_is_named_and_its_other_blocks_still_read() {
    let tmp = data_dir();
    let mut server = Server::spawn(tmp.path(), &[]);
    let batch = |name: &str, day: &str| {
        let events: Vec<serde_json::Value> = (0..5)
            .map(|i| {
                serde_json::json!({"event": name, "distinct_id": format!("u{i}"),
                    "timestamp": format!("{day}T10:00:0{i}Z"), "properties": {"i": i}})
            })
            .collect();
        let body = serde_json::json!({"api_key": KEY_ONE, "batch": events});
        assert_eq!(server.post("/batch/", body.to_string()).status, 200);
        server.settle(1);
    };
    // Months apart, so never one block: the first chunk's block is the file's first.
    batch("damaged", "2026-01-01");
    batch("intact", "2026-06-01");
    assert_eq!(server.stop(), Some(0));
    let db = tmp.path().join("db");
    let (code, out) = check_db(&db);
    assert_eq!(code, Some(0), "{out}");

    let blocks: Vec<_> = std::fs::read_dir(db.join("blocks"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(blocks.len(), 1, "{blocks:?}");
    let file = OpenOptions::new().write(true).open(&blocks[0]).unwrap();
    file.write_all_at(&[0x55; 4], 20).unwrap();
    drop(file);

    let (code, out) = check_db(&db);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("the event block at key")
            && out.contains("0000000000.blk does not hold the block's bytes at offset 0"),
        "{out}"
    );
    assert!(out.contains("1 damaged"), "{out}");

    let server = Server::spawn(tmp.path(), &[]);
    let stored = server.settle(1);
    let names = |name: &str| stored.iter().filter(|e| e["event"] == name).count();
    assert_eq!((names("damaged"), names("intact")), (0, 5));
    assert!(
        server.log().contains("event block skipped"),
        "{}",
        server.log()
    );
}
