//! Change detection for the files the server reloads by itself (flag files, surveys,
//! early access features, `projects.json`): [`Seen`] remembers the file names, sizes and
//! mtimes of the last reload and, while a file is younger than [`SETTLE_TIME`], its
//! content digest, so a poller can ask "did anything change?" every few hundred
//! milliseconds without reading files that did not.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use sha1::{Digest, Sha1};

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
    pub(crate) fn read(&mut self, path: &std::path::Path, bytes: &[u8]) {
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
