//! `flagpost check --db DIR`: inspect a stopped database and say what is damaged.
//! sled is opened with its panics caught (a damaged file can make it panic rather
//! than fail), every tree is read through, every event block decoded, and the
//! write-ahead log's files checked for damage and gaps ([`crate::log::check`]).
//! Opening runs sled's recovery, as a start would; nothing else is written.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use crate::support::hex;

use super::{block, keys, Trees};

pub use crate::log::check::Report;

/// Delete the snapshot files sled started and never finished (`snap.<lsn>.generating`).
/// sled writes a snapshot under that name and renames it into place once synced, but
/// counts a leftover one (a write that failed on a full disk) as the newest snapshot,
/// finds it empty and refuses to open. A leftover was never renamed into place, so the
/// previous snapshot and sled's log, both kept until a rename succeeds, hold everything.
fn remove_unfinished_snapshots(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => {
                    tracing::warn!(file = %entry.path().display(), "removed a snapshot sled did not finish writing")
                }
                Err(e) => {
                    tracing::warn!(file = %entry.path().display(), error = %e, "cannot remove a snapshot sled did not finish writing")
                }
            }
        }
    }
}

/// Open the sled database at `dir`, turning a panic inside sled into an error that
/// names the database and what to do. sled's own errors stay sled's, so a caller can
/// tell a lock held by another server ([`super::Error::is_locked`]) from damage.
pub fn open(dir: &Path, cache_bytes: u64) -> Result<sled::Db, super::Error> {
    remove_unfinished_snapshots(dir);
    let opened = catch_unwind(AssertUnwindSafe(|| {
        sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .open()
    }));
    match opened {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(e)) => Err(super::Error::Sled(e)),
        Err(panic) => Err(super::Error::Damaged(damaged(dir, &panic_text(&*panic)))),
    }
}

/// What [`open`]'s error tells an operator running `check`.
fn open_problem(dir: &Path, e: super::Error) -> String {
    match e {
        super::Error::Damaged(message) => message,
        e if e.is_locked() => format!(
            "the database at {} is in use by a running server: stop it first",
            dir.display()
        ),
        e => format!("cannot open the database at {}: {e}", dir.display()),
    }
}

/// The message for a database sled could not read.
pub fn damaged(dir: &Path, why: &str) -> String {
    format!(
        "the database at {} is damaged: sled failed reading it ({why}). Stop the service, run `flagpost check --db {}` to see what is damaged, then restore the directory from a backup or move it aside to start empty",
        dir.display(),
        dir.display()
    )
}

pub fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_string())
}

/// Check the stopped database at `dir`.
pub fn check(dir: &Path) -> Report {
    let mut report = Report::default();
    if !dir.join("conf").exists() {
        report.problems.push(format!(
            "{} is not a flagpost database (no conf file)",
            dir.display()
        ));
        return report;
    }
    let db = match open(dir, 64 * 1024 * 1024) {
        Ok(db) => db,
        Err(e) => {
            report.problems.push(open_problem(dir, e));
            return report;
        }
    };
    let files = match block::Files::open(dir) {
        Ok(files) => files,
        Err(e) => {
            report
                .problems
                .push(format!("cannot read the event block files: {e}"));
            return report;
        }
    };
    let read = catch_unwind(AssertUnwindSafe(|| read_trees(&db, &files, &mut report)));
    if let Err(panic) = read {
        report.problems.push(damaged(dir, &panic_text(&*panic)));
        return report;
    }
    read_runs(&db, dir, &mut report);
    let trees = Trees::open_to_read(&db, dir).ok();
    if let Some(t) = &trees {
        read_event_index(t, &mut report);
    }
    let checkpoint = trees
        .and_then(|t| t.meta.get(keys::CHECKPOINT_KEY).ok().flatten())
        .and_then(|v| keys::seq(&v));
    let wal = dir.join(crate::log::DIR_NAME);
    if wal.exists() {
        match crate::log::check::check(&wal, checkpoint) {
            Ok(log) => {
                report.notes.extend(log.notes);
                report.problems.extend(log.problems);
            }
            Err(e) => report
                .problems
                .push(format!("cannot read the log in {}: {e}", wal.display())),
        }
    }
    report
}

/// Read every tree through; read and decode every event block.
fn read_trees(db: &sled::Db, files: &block::Files, report: &mut Report) {
    for name in db.tree_names() {
        let label = String::from_utf8_lossy(&name).into_owned();
        let tree = match db.open_tree(&name) {
            Ok(tree) => tree,
            Err(e) => {
                report
                    .problems
                    .push(format!("tree {label}: cannot open: {e}"));
                continue;
            }
        };
        let is_events = name == super::EVENTS_TREE.as_bytes();
        let (mut keys_read, mut events, mut bad_blocks) = (0u64, 0u64, 0u64);
        for item in tree.iter() {
            match item {
                Ok((key, value)) => {
                    keys_read += 1;
                    if is_events {
                        let bytes = files.resolve(&value).map_err(|e| e.to_string());
                        let decoded = bytes.and_then(|b| {
                            block::Block::decode(&b).ok_or_else(|| "it does not decode".into())
                        });
                        match decoded {
                            Ok(b) => events += b.heads().len() as u64,
                            Err(why) => {
                                bad_blocks += 1;
                                report.problems.push(format!(
                                    "tree {label}: the event block at key {}: {why}",
                                    hex(&key)
                                ));
                            }
                        }
                    }
                }
                Err(e) => {
                    report.problems.push(format!(
                        "tree {label}: read failed after {keys_read} keys: {e}"
                    ));
                    break;
                }
            }
        }
        match is_events {
            true => report.notes.push(format!(
                "tree {label}: {keys_read} blocks, {events} events, {bad_blocks} damaged"
            )),
            false => report.notes.push(format!("tree {label}: {keys_read} keys")),
        }
    }
}

/// Read the layered tables' runs through ([`super::layered`]).
fn read_runs(db: &sled::Db, dir: &Path, report: &mut Report) {
    let tables = match super::layered::open_all(db, dir, &super::LAYERED_TABLES, false) {
        Ok(tables) => tables,
        Err(e) => {
            report.problems.push(format!("tables' journal: {e}"));
            return;
        }
    };
    for table in tables {
        let name = table.name();
        report.notes.push(format!(
            "table {name}: {} recent changes in the journal",
            table.delta_len()
        ));
        match table.verify() {
            None => report
                .notes
                .push(format!("table {name}: no run yet (all in its tree)")),
            Some(Ok(entries)) => report
                .notes
                .push(format!("table {name}: run of {entries} keys read through")),
            Some(Err(e)) => report.problems.push(format!("table {name}: {e}")),
        }
    }
}

/// Read the event index's runs through and say what it covers ([`super::event_index`]).
/// Nothing there is lost data: an index that does not read is built again at start.
fn read_event_index(trees: &Trees, report: &mut Report) {
    let index = &trees.event_index;
    let s = index.status();
    if let Some(why) = &s.set_aside {
        report.notes.push(format!(
            "event index: set aside, built again when the server starts ({why})"
        ));
        return;
    }
    let (distinct_ids, names) = match index.verify() {
        Ok(counted) => counted,
        Err(e) => {
            report.notes.push(format!(
                "event index: a run does not read ({e}); remove the database's event_index/ to build it again"
            ));
            return;
        }
    };
    let uncovered = trees
        .events
        .iter()
        .keys()
        .filter_map(|k| k.ok().and_then(|k| keys::block_id(&k)))
        .filter(|&id| id >= s.covered)
        .count();
    report.notes.push(format!(
        "event index: {} runs, {distinct_ids} distinct ids and {names} event names, {} blocks, {} bytes; {uncovered} blocks stored since, indexed when the server starts",
        s.runs, s.blocks, s.bytes
    ));
}

/// While serving: a panic inside sled names the database and what to do. On sled's
/// own threads (which catch it and leave the database refusing every later write)
/// the process exits with status 70, so the service manager restarts it and the
/// message is the last thing logged; on a thread that opens or reads the database the
/// caller's `catch_unwind` turns it into an error.
pub fn report_sled_panics(dir: &Path) {
    let dir = dir.to_path_buf();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let in_sled = info.location().is_some_and(|l| l.file().contains("/sled-"));
        if !in_sled {
            return previous(info);
        }
        let why = format!("{} at {}", panic_text(info.payload()), location(info));
        tracing::error!("{}", damaged(&dir, &why));
        let thread = std::thread::current();
        if thread.name().is_some_and(|n| n.starts_with("sled-")) {
            eprintln!("flagpost: {}", damaged(&dir, &why));
            std::process::exit(70);
        }
    }));
}

fn location(info: &std::panic::PanicHookInfo<'_>) -> String {
    info.location()
        .map_or_else(String::new, |l| format!("{}:{}", l.file(), l.line()))
}

/// `flagpost check --db DIR`: print what the check found; an error if anything is
/// damaged.
pub fn run(dir: &Path) -> Result<(), String> {
    let report = check(dir);
    for note in &report.notes {
        println!("ok: {note}");
    }
    for problem in &report.problems {
        println!("error: {problem}");
    }
    match report.problems.len() {
        0 => Ok(()),
        n => Err(format!(
            "the database at {} has {n} problem(s)",
            dir.display()
        )),
    }
}
