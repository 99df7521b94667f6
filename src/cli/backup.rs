//! `flagpost backup` and `flagpost restore` (see `flagpost::backup`): flags, and the
//! report each prints.

use std::path::PathBuf;

use argh::FromArgs;
use flagpost::backup::{self, socket, Manifest};

use super::or_env;

#[derive(FromArgs)]
/// Copy a database, consistently, while its server keeps serving: the running server
/// (found through DIR/admin.sock) writes the backup; with no server running, the
/// database is read directly. Run as the service's user or root.
#[argh(subcommand, name = "backup")]
pub(super) struct Backup {
    /// database directory [env FLAGPOST_DB, default ./var/db]
    #[argh(option)]
    db: Option<PathBuf>,
    /// directory to write the backup into; must not exist or be empty (the server's user must be able to create it)
    #[argh(option)]
    to: PathBuf,
}

#[derive(FromArgs)]
/// Check a backup against its manifest and make a new database from it.
#[argh(subcommand, name = "restore")]
pub(super) struct Restore {
    /// the backup's directory
    #[argh(option)]
    from: PathBuf,
    /// the new database directory; must not exist or be empty
    #[argh(option)]
    db: PathBuf,
}

pub(super) fn backup(args: Backup) -> Result<(), String> {
    let db = or_env(args.db, "FLAGPOST_DB")?.unwrap_or_else(|| "var/db".into());
    let manifest = match socket::request(&db, &args.to)? {
        socket::Asked::Done(manifest) => *manifest,
        socket::Asked::NoServer => backup::take_stopped(&db, &args.to)?,
    };
    let source = match manifest.running {
        true => "taken by the running server",
        false => "taken from the stopped database",
    };
    let mut out = super::Stdout::default();
    out.line(format_args!(
        "backup written to {} ({source})",
        args.to.display()
    ))?;
    summary(&mut out, &manifest)?;
    if manifest.running {
        out.line(format_args!(
            "  compactor paused {} ms; took {} ms",
            manifest.compactor_paused_ms, manifest.took_ms
        ))?;
    }
    out.line(format_args!(
        "restore with: flagpost restore --from {} --db NEWDIR",
        args.to.display()
    ))
}

pub(super) fn restore(args: Restore) -> Result<(), String> {
    let manifest = backup::restore::restore(&args.from, &args.db)?;
    let mut out = super::Stdout::default();
    out.line(format_args!(
        "restored {} into {}",
        args.from.display(),
        args.db.display()
    ))?;
    summary(&mut out, &manifest)?;
    out.line(format_args!("next:"))?;
    out.line(format_args!("  1. stop the server if it runs, and make {} its --db (FLAGPOST_DB, or move the directory into place), owned by its user: sudo chown -R flagpost:flagpost {}", args.db.display(), args.db.display()))?;
    out.line(format_args!("  2. start it: it applies the copied write-ahead log after the checkpoint, then serves as the backup left off"))
}

fn summary(out: &mut super::Stdout, m: &Manifest) -> Result<(), String> {
    let pairs: u64 = m.trees.values().sum();
    let segments = m.files.iter().filter(|f| f.path.ends_with(".log")).count();
    let checkpoint = m.checkpoint.map_or("none".into(), |c| c.to_string());
    let end = m
        .log_end
        .map_or(String::new(), |e| format!(", log entries below {e}"));
    out.line(format_args!(
        "  {} trees, {pairs} keys; {segments} log segment(s) from checkpoint {checkpoint}{end}; {} files, {} bytes",
        m.trees.len(),
        m.files.len(),
        m.bytes()
    ))
}
