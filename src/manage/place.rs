//! Where the flag files live, seen from the service: the management API and the
//! console rewrite them, so a deployment that keeps them on a read-only path (the
//! layout before `--flags-dir`, with them in `/etc/flagpost/flags` under the unit's
//! `ProtectSystem=strict`) would fail every write with a 500. At start-up the server
//! says so once, naming the folder and what to do, and it names flag files left in
//! `<data dir>/flags` when `--flags-dir` points elsewhere, which are no longer served.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Where the docs say how to lay a deployment out and what to move.
const LAYOUT_DOCS: &str = "docs/operating.md, \"Where files live\"";

/// Whether the service cannot write `flags_dir`, and why: the folder, or the nearest
/// existing folder above it (the first write creates it), checked with `access(2)`,
/// which also answers a read-only mount.
pub fn unwritable(flags_dir: &Path) -> Option<String> {
    let existing = flags_dir.ancestors().find(|p| p.exists())?;
    let path = CString::new(existing.as_os_str().as_bytes()).ok()?;
    // SAFETY: a valid, NUL-terminated path; access reads it and nothing else.
    if unsafe { libc::access(path.as_ptr(), libc::W_OK) } == 0 {
        return None;
    }
    let why = std::io::Error::last_os_error();
    Some(format!(
        "the flags directory {} cannot be written ({}: {why}): the management API and the \
         console will fail to change flags; give the service a writable --flags-dir ({LAYOUT_DOCS})",
        flags_dir.display(),
        existing.display()
    ))
}

/// Flag files in `default_dir` (`<data dir>/flags`) that are not served because the
/// flags are read from `flags_dir` instead.
pub fn left_behind(default_dir: &Path, flags_dir: &Path) -> Option<String> {
    if same_dir(default_dir, flags_dir) {
        return None;
    }
    let mut files: Vec<String> = std::fs::read_dir(default_dir)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".json") && !name.starts_with('.'))
        .collect();
    if files.is_empty() {
        return None;
    }
    files.sort();
    Some(format!(
        "{} holds flag files that are not served ({}): flags are read from {} \
         (--flags-dir); move them there ({LAYOUT_DOCS})",
        default_dir.display(),
        files.join(", "),
        flags_dir.display()
    ))
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_left_in_the_data_dir_are_named() {
        let tmp = tempfile::tempdir().unwrap();
        let (old, new) = (
            tmp.path().join("data/flags"),
            tmp.path().join("state/flags"),
        );
        std::fs::create_dir_all(&old).unwrap();
        assert_eq!(left_behind(&old, &new), None, "an empty folder is fine");
        std::fs::write(old.join("2.json"), "{}").unwrap();
        std::fs::write(old.join("1.json"), "{}").unwrap();
        std::fs::write(old.join(".1.json.tmp"), "{}").unwrap();
        std::fs::write(old.join("README"), "").unwrap();
        let said = left_behind(&old, &new).unwrap();
        assert!(said.contains("(1.json, 2.json)"), "{said}");
        assert!(said.contains(&new.display().to_string()), "{said}");
        assert_eq!(left_behind(&old, &old), None, "the folder in use");
        assert_eq!(left_behind(&new, &old), None, "no such folder");
    }

    #[test]
    fn a_folder_that_is_or_will_be_writable_passes() {
        let tmp = tempfile::tempdir().unwrap();
        let flags = tmp.path().join("flags");
        assert_eq!(unwritable(&flags), None, "made by the first write");
        std::fs::create_dir(&flags).unwrap();
        assert_eq!(unwritable(&flags), None);
    }
}
