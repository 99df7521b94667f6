//! Files edge mode keeps under `<db>/upstream/` written whole or not at all: a
//! temporary file in the same folder, fsync'd, renamed over the name, and the folder
//! fsync'd, so a crash at any instant leaves the old file or the new one, never part
//! of either. The recordings spool and the cached upstream answers use it.

use std::io::Write;
use std::path::Path;

/// Suffix of a file being written; one left by a crash is never read, and is removed
/// by [`remove_leftovers`].
pub const PARTIAL: &str = ".partial";

/// Write `parts` one after another as the file `dir/name`, durably.
pub fn write_whole(dir: &Path, name: &str, parts: &[&[u8]]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let temp = dir.join(format!("{name}{PARTIAL}"));
    let written = (|| {
        let mut file = std::fs::File::create(&temp)?;
        for part in parts {
            file.write_all(part)?;
        }
        file.sync_all()?;
        std::fs::rename(&temp, dir.join(name))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written?;
    crate::support::sync_dir(dir)
}

/// Remove a file durably; one already gone is not an error.
pub fn remove(dir: &Path, name: &str) -> std::io::Result<()> {
    match std::fs::remove_file(dir.join(name)) {
        Ok(()) => crate::support::sync_dir(dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Remove the temporary files a crash left in `dir`.
pub fn remove_leftovers(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().ends_with(PARTIAL) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_files_replaced_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a/b");
        write_whole(&sub, "f", &[b"one", b" two"]).unwrap();
        assert_eq!(std::fs::read(sub.join("f")).unwrap(), b"one two");
        write_whole(&sub, "f", &[b"three"]).unwrap();
        assert_eq!(std::fs::read(sub.join("f")).unwrap(), b"three");
        std::fs::write(sub.join(format!("g{PARTIAL}")), b"torn").unwrap();
        remove_leftovers(&sub);
        remove(&sub, "f").unwrap();
        remove(&sub, "f").unwrap();
        assert_eq!(std::fs::read_dir(&sub).unwrap().count(), 0);
    }
}
