//! Reloading the files the server reloads by itself (flag files, surveys, early access
//! features, `projects.json`). [`Seen`] remembers the file names, sizes and mtimes of the
//! last reload and, while a file is younger than [`SETTLE_TIME`], its content digest, so a
//! poller can ask "did anything change?" every few hundred milliseconds without reading
//! files that did not. [`Watched`] is what every reloader keeps around it: the lock that
//! keeps a SIGHUP and the poller from reloading at once, what the last reload saw, and
//! how many files were refused. [`list`] and [`project_id`] are the per-project
//! directories' layout, `<project id>.json`.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use sha1::{Digest, Sha1};

/// Extension of per-project files; other files in the directory (editor swap files) are
/// ignored.
const FILE_EXTENSION: &str = "json";

/// A file modified this recently may be rewritten within the same mtime tick at the same
/// size, which the cheap check cannot see; until then changes are confirmed by content.
const SETTLE_TIME: Duration = Duration::from_secs(2);

/// One file as the cheap change check sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stamp {
    name: OsString,
    modified: Option<SystemTime>,
    len: u64,
}

/// What the last reload of a set of files saw.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// `None` before the first reload, after [`Seen::forget`], or when the files could
    /// not be listed.
    stamps: Option<Vec<Stamp>>,
    digests: HashMap<OsString, [u8; 20]>,
    settled: bool,
}

impl Seen {
    /// Whether `files` (`None`: they could not be listed) differ from the last reload:
    /// other names, sizes or mtimes, or, for files changed in the last moments, other
    /// content.
    pub(crate) fn changed(&mut self, files: Option<&[PathBuf]>) -> bool {
        if files.map(stamps) != self.stamps {
            return true;
        }
        if self.settled {
            return false;
        }
        for path in files.unwrap_or_default() {
            let digest = fs::read(path).ok().map(|bytes| digest(&bytes));
            let name = path.file_name().map(OsString::from).unwrap_or_default();
            if digest.as_ref() != self.digests.get(&name) {
                return true;
            }
        }
        self.settled = settled(self.stamps.as_deref().unwrap_or_default());
        false
    }

    /// Starts a reload of `files`: stamps them before they are read, so a file changed
    /// after this point differs at the next check. Hand the stamps to [`Seen::finish`].
    pub(crate) fn begin(&mut self, files: &[PathBuf]) -> Vec<Stamp> {
        self.digests.clear();
        stamps(files)
    }

    /// Records the content of one file read by the reload.
    pub(crate) fn read(&mut self, path: &Path, bytes: &[u8]) {
        if let Some(name) = path.file_name() {
            self.digests.insert(name.to_owned(), digest(bytes));
        }
    }

    /// Ends a reload begun with [`Seen::begin`].
    pub(crate) fn finish(&mut self, stamps: Vec<Stamp>) {
        self.settled = settled(&stamps);
        self.stamps = Some(stamps);
    }

    /// The files could not be listed: the next check reloads once they can be.
    pub(crate) fn unlistable(&mut self) {
        self.stamps = None;
        self.settled = true;
    }

    /// Makes the next check report a change, as if every file had changed.
    pub(crate) fn forget(&mut self) {
        self.stamps = None;
    }
}

fn stamps(files: &[PathBuf]) -> Vec<Stamp> {
    files
        .iter()
        .map(|path| {
            let meta = fs::metadata(path).ok();
            Stamp {
                name: path.file_name().map(OsString::from).unwrap_or_default(),
                modified: meta.as_ref().and_then(|m| m.modified().ok()),
                len: meta.map_or(0, |m| m.len()),
            }
        })
        .collect()
}

/// True when every file is older than `SETTLE_TIME`.
fn settled(stamps: &[Stamp]) -> bool {
    let now = SystemTime::now();
    stamps.iter().all(|stamp| {
        stamp
            .modified
            .and_then(|m| now.duration_since(m).ok())
            .is_some_and(|age| age >= SETTLE_TIME)
    })
}

/// A file's content fingerprint, to tell a change from a rewrite of the same bytes.
pub fn digest(bytes: &[u8]) -> [u8; 20] {
    Sha1::digest(bytes).into()
}

/// A set of files reloaded as one, with `X` kept beside them under the same lock (the
/// flag rules keep the flags generated from other files there).
#[derive(Debug, Default)]
pub(crate) struct Watched<X = ()> {
    /// Serialises reloads (SIGHUP and the poller may race) and remembers what was seen.
    /// A panic mid-reload leaves at worst stale stamps, which only cause a reload.
    state: Mutex<(Seen, X)>,
    /// Files refused since start, for metrics.
    failures: AtomicU64,
}

impl<X> Watched<X> {
    /// Reloads the files `listing` found (or could not list): `pass` reads them.
    pub(crate) fn reload<R>(
        &self,
        listing: io::Result<Vec<PathBuf>>,
        pass: impl FnOnce(&mut Pass<'_, X>) -> R,
    ) -> R {
        let mut state = self.lock();
        self.run(&mut state, listing, pass)
    }

    /// Like [`Watched::reload`], but only when the files changed since the last reload;
    /// `None` when they did not.
    pub(crate) fn reload_if_changed<R>(
        &self,
        listing: io::Result<Vec<PathBuf>>,
        pass: impl FnOnce(&mut Pass<'_, X>) -> R,
    ) -> Option<R> {
        let mut state = self.lock();
        if !state.0.changed(listing.as_deref().ok()) {
            return None;
        }
        Some(self.run(&mut state, listing, pass))
    }

    /// Changes what is kept beside the files; when `change` says it changed anything, the
    /// next check reloads, as a changed file would.
    pub(crate) fn update(&self, change: impl FnOnce(&mut X) -> bool) -> bool {
        let mut state = self.lock();
        let changed = change(&mut state.1);
        if changed {
            state.0.forget();
        }
        changed
    }

    /// Files refused since start.
    pub(crate) fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, (Seen, X)> {
        crate::support::sync::lock(&self.state)
    }

    fn run<R>(
        &self,
        state: &mut (Seen, X),
        listing: io::Result<Vec<PathBuf>>,
        pass: impl FnOnce(&mut Pass<'_, X>) -> R,
    ) -> R {
        let (seen, extra) = state;
        let stamps = listing.as_deref().ok().map(|files| seen.begin(files));
        let result = pass(&mut Pass {
            files: listing.as_deref(),
            seen,
            extra,
            failures: &self.failures,
        });
        match stamps {
            Some(stamps) => seen.finish(stamps),
            // The poller reloads once the files can be listed again.
            None => seen.unlistable(),
        }
        result
    }
}

/// One reload under way.
pub(crate) struct Pass<'a, X> {
    /// The files to read, or why they could not be listed.
    pub(crate) files: Result<&'a [PathBuf], &'a io::Error>,
    seen: &'a mut Seen,
    /// What is kept beside the files.
    pub(crate) extra: &'a X,
    failures: &'a AtomicU64,
}

impl<X> Pass<'_, X> {
    /// Records the content of one file read, so a rewrite is told from a change.
    pub(crate) fn read(&mut self, path: &Path, bytes: &[u8]) {
        self.seen.read(path, bytes);
    }

    /// Counts one file refused.
    pub(crate) fn failed(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }
}

/// The `*.json` files of the directory, sorted by name for deterministic reports.
pub(crate) fn list(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let is_json = path.extension().is_some_and(|ext| ext == FILE_EXTENSION);
        if is_json && path.is_file() {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// One line of what a reload could not use, and the project whose file it is about
/// (`None` for a file named for no project, or the folder itself).
pub type Problem = (Option<i64>, String);

/// `<id>.json` with `id` written canonically, so `01.json` and `1.json` cannot both claim
/// project 1.
pub(crate) fn project_id(path: &Path) -> Option<i64> {
    let stem = path.file_stem()?.to_str()?;
    let id: i64 = stem.parse().ok()?;
    (id.to_string() == stem).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One reload of `files` as the reloaders do it.
    fn reload(seen: &mut Seen, files: &[PathBuf]) {
        let stamps = seen.begin(files);
        for path in files {
            if let Ok(bytes) = fs::read(path) {
                seen.read(path, &bytes);
            }
        }
        seen.finish(stamps);
    }

    #[test]
    fn a_rewrite_in_the_same_tick_at_the_same_size_is_seen_by_content() {
        let dir = tempfile::tempdir().unwrap();
        let files = [dir.path().join("projects.json")];
        let mut seen = Seen::default();
        assert!(seen.changed(Some(&files)), "never reloaded");
        fs::write(&files[0], "a").unwrap();
        reload(&mut seen, &files);
        assert!(!seen.changed(Some(&files)));
        fs::write(&files[0], "b").unwrap();
        assert!(seen.changed(Some(&files)));
        reload(&mut seen, &files);
        assert!(!seen.changed(Some(&files)));
        fs::remove_file(&files[0]).unwrap();
        assert!(
            seen.changed(Some(&files)),
            "a removed file changes its stamp"
        );
        reload(&mut seen, &files);
        assert!(!seen.changed(Some(&files)));
        seen.forget();
        assert!(seen.changed(Some(&files)));
        seen.unlistable();
        assert!(!seen.changed(None), "still unlistable");
        assert!(seen.changed(Some(&files)), "listable again");
    }
}
