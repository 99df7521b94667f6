//! `flagpost backup` and `flagpost restore`: a consistent copy of a database taken
//! while the server keeps serving, and a new database made from it.
//!
//! sled 0.34 cannot be opened by two processes, so the running server takes the
//! backup itself. It listens on a Unix socket in the database directory
//! ([`socket`], `admin.sock`, mode 0600: only the service's user or root can connect;
//! replaced at start, removed at a clean stop); `flagpost backup --db DIR --to DEST`
//! asks it there for a backup into DEST (absent or empty; the server creates it).
//! With no server listening, the command opens the stopped database itself and does
//! the same.
//!
//! What a backup holds, and why it is consistent:
//! - `trees.bin`: every sled tree ([`trees`]). The compactor writes all its trees and
//!   its checkpoint in one transaction per step, and the ClickHouse sink writes its
//!   outbox in passes; both hold a [`Gate`](crate::support::sync::Gate) for each step or pass,
//!   and the backup takes both gates, so it reads the trees between steps, consistent
//!   with each other and with the checkpoint. Capture, `/decide` and the read API go
//!   on: capture appends to the log, which the compactor catches up on afterwards.
//! - `wal/`: the log's segments holding entries after the checkpoint, copied up to the
//!   log's durable end read after the trees ([`crate::log::copy`]), with the compactor
//!   still paused so no segment is recycled. Every event acknowledged before the backup
//!   was asked for is below that end (acknowledged means synced), so it is either
//!   applied in `trees.bin` or in `wal/`. A restored server applies the log from the
//!   checkpoint, as after any restart: the checkpoint and the deduplication window
//!   (a tree too) make that exactly once.
//! - `flag_activity/`: the management API's activity logs, append-only, each copied up
//!   to its last whole line.
//! - `manifest.json`, written last (synced, then renamed into place): the format, when,
//!   the checkpoint, the log's end, the pairs per tree, and every file's size and
//!   SHA-256. A backup without it did not finish; [`restore`] checks every file
//!   against it before writing anything.
//!
//! The compactor's pause lasts the trees' export and the log's copy; the manifest says
//! how long (`compactor_paused_ms`). The projects, flag files and GeoIP database live
//! in the data directory, outside the database: they are copied as plain files.

pub mod restore;
pub mod socket;
mod trees;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::OwnedRwLockWriteGuard;

use crate::log;
use crate::store::keys;

/// The manifest's name; its presence marks a finished backup.
pub const MANIFEST: &str = "manifest.json";
const FORMAT: &str = "flagpost-backup";
const VERSION: u32 = 1;
const TREES: &str = "trees.bin";
const ACTIVITY: &str = "flag_activity";

/// What a finished backup holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    /// The flagpost version that wrote it.
    pub flagpost: String,
    pub created_at: String,
    /// Taken by a running server, or from a stopped database.
    pub running: bool,
    /// The last log entry the compactor had applied; the restored server applies the
    /// copied log after it.
    pub checkpoint: Option<u64>,
    /// The first log entry not in the backup (taken from a running server).
    pub log_end: Option<u64>,
    /// Key-value pairs per sled tree.
    pub trees: BTreeMap<String, u64>,
    pub files: Vec<FileSum>,
    /// How long the compactor (and the sink) stood still.
    pub compactor_paused_ms: u64,
    pub took_ms: u64,
}

impl Manifest {
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }
}

/// A file of the backup, relative to its directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileSum {
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

/// The running server's parts a backup reads, and the gates that pause its writers.
pub struct Running {
    pub db_dir: PathBuf,
    pub store: std::sync::Arc<crate::store::live::Live>,
    pub log: std::sync::Arc<log::Shared>,
    pub compactor_gate: std::sync::Arc<crate::support::sync::Gate>,
    pub sink_gate: Option<std::sync::Arc<crate::support::sync::Gate>>,
}

/// The writers a backup keeps still, released as soon as the backup no longer needs
/// them.
pub struct Paused {
    pub sink: Option<OwnedRwLockWriteGuard<()>>,
    pub compactor: Option<OwnedRwLockWriteGuard<()>>,
}

/// Take a backup of the running server into `dest`, with its writers `paused`.
pub fn take_running(running: &Running, dest: &Path, paused: Paused) -> Result<Manifest, String> {
    let open = running
        .store
        .get()
        .ok_or("the database is being reopened after a write failure; try again")?;
    take(&running.db_dir, dest, &open.db, Some(&running.log), paused)
}

/// Take a backup of the stopped database at `db_dir` into `dest`.
pub fn take_stopped(db_dir: &Path, dest: &Path) -> Result<Manifest, String> {
    if !db_dir.join("db").is_file() {
        return Err(format!(
            "{} is not a flagpost database (it has no sled `db` file)",
            db_dir.display()
        ));
    }
    let db = crate::store::check::open(db_dir, crate::config::DEFAULT_CACHE_BYTES).map_err(|e| {
        if e.is_locked() {
            format!("{} is in use by a running server, but its admin socket did not answer; run the backup as the service's user or root", db_dir.display())
        } else {
            format!("cannot open {}: {e}", db_dir.display())
        }
    })?;
    let paused = Paused {
        sink: None,
        compactor: None,
    };
    take(db_dir, dest, &db, None, paused)
}

fn take(
    db_dir: &Path,
    dest: &Path,
    db: &sled::Db,
    running: Option<&log::Shared>,
    mut paused: Paused,
) -> Result<Manifest, String> {
    let started = Instant::now();
    prepare_dest(db_dir, dest)?;
    let io = |what: &str, e: io::Error| format!("{what}: {e}");
    let meta = db
        .open_tree("meta")
        .map_err(|e| format!("cannot read the database: {e}"))?;
    let checkpoint = meta
        .get(keys::CHECKPOINT_KEY)
        .map_err(|e| format!("cannot read the checkpoint: {e}"))?
        .and_then(|v| keys::seq(&v));
    let files = crate::store::block::Files::open(db_dir)
        .map_err(|e| io("cannot read the event block files", e))?;
    let trees = trees::export(db, db_dir, &files, &dest.join(TREES))
        .map_err(|e| io("cannot write trees.bin", e))?;
    paused.sink = None;
    let from = checkpoint.map_or(0, |c| c.saturating_add(1));
    let copied = match running {
        Some(shared) => log::copy::copy_live(shared, from, dest),
        None => log::copy::copy_stopped(db_dir, from, dest),
    }
    .map_err(|e| io("cannot copy the write-ahead log", e))?;
    paused.compactor = None;
    let compactor_paused_ms = match running {
        Some(_) => started.elapsed().as_millis() as u64,
        None => 0,
    };
    let mut files = vec![TREES.to_string()];
    files.extend(copied.files);
    files.extend(copy_activity(db_dir, dest).map_err(|e| io("cannot copy flag_activity", e))?);
    let mut sums = Vec::with_capacity(files.len());
    for path in files {
        sums.push(sum(dest, &path).map_err(|e| io(&format!("cannot read back {path}"), e))?);
    }
    let manifest = Manifest {
        format: FORMAT.into(),
        version: VERSION,
        flagpost: env!("CARGO_PKG_VERSION").into(),
        created_at: now_rfc3339(),
        running: running.is_some(),
        checkpoint,
        log_end: copied.end,
        trees,
        files: sums,
        compactor_paused_ms,
        took_ms: started.elapsed().as_millis() as u64,
    };
    write_manifest(dest, &manifest).map_err(|e| io("cannot write manifest.json", e))?;
    Ok(manifest)
}

/// `dest` must be absent or an empty directory, and outside the database.
fn prepare_dest(db_dir: &Path, dest: &Path) -> Result<(), String> {
    let inside = match (db_dir.canonicalize(), dest.parent().map(Path::canonicalize)) {
        (Ok(db), Some(Ok(parent))) => parent.starts_with(db),
        _ => false,
    };
    if inside {
        return Err(format!(
            "{} is inside the database directory; choose a directory outside it",
            dest.display()
        ));
    }
    empty_dir(dest)
}

/// Create `dir` (mode 0700) or accept it if it is an empty directory.
pub(crate) fn empty_dir(dir: &Path) -> Result<(), String> {
    match std::fs::read_dir(dir).map(|mut entries| entries.next().is_none()) {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!(
            "{} is not empty; give a new or empty directory",
            dir.display()
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))
        }
        Err(e) => Err(format!("cannot use {}: {e}", dir.display())),
    }
}

/// Copy each activity log up to its last whole line (one being appended may end in a
/// part of one, which a reader skips but an append would join).
fn copy_activity(db_dir: &Path, dest: &Path) -> io::Result<Vec<String>> {
    let dir = db_dir.join(ACTIVITY);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let out = dest.join(ACTIVITY);
    std::fs::create_dir_all(&out)?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry?;
        if !entry.file_type()?.is_file() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let bytes = std::fs::read(entry.path())?;
        let whole = bytes
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |at| at + 1);
        write_synced(&out.join(&name), &bytes[..whole])?;
        files.push(format!("{ACTIVITY}/{name}"));
    }
    File::open(&out)?.sync_all()?;
    files.sort();
    Ok(files)
}

/// Size and SHA-256 of `path` in `dir`.
fn sum(dir: &Path, path: &str) -> io::Result<FileSum> {
    let mut file = File::open(dir.join(path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut bytes = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
    let sha256 = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(FileSum {
        path: path.to_string(),
        bytes,
        sha256,
    })
}

fn write_manifest(dest: &Path, manifest: &Manifest) -> io::Result<()> {
    let text = serde_json::to_vec_pretty(manifest).map_err(io::Error::other)?;
    let tmp = dest.join("manifest.json.tmp");
    write_synced(&tmp, &text)?;
    std::fs::rename(&tmp, dest.join(MANIFEST))?;
    File::open(dest)?.sync_all()
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
