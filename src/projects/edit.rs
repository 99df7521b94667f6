//! Adding a hashed key to a project in `projects.json` (`flagpost key new --label`: a
//! personal key, with its scopes if any, or a project secret key), the one change
//! flagpost itself makes to that file. The file is the
//! operator's: the new entry is spliced into its text where it belongs, so every other
//! byte (spacing, member order, other projects, plain keys) stays as it was, and the
//! file is replaced atomically (a temporary file beside it, fsync, rename, fsync of the
//! directory) with the old one's owner and mode, so a server watching it reads either
//! the old file or the new one, never a half-written one.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{hash_key, Error, PersonalKey, Projects};

/// PostHog's own limit on a personal key's label.
pub const MAX_LABEL_CHARS: usize = 40;

#[derive(Deserialize)]
struct Top<'a> {
    #[serde(borrow)]
    projects: Vec<&'a RawValue>,
}

/// Which of a project's key lists a new key joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyList {
    /// `personal_api_keys`: the read and management APIs, the console.
    Personal,
    /// `secret_api_keys`: the definitions feeds only.
    Secret,
}

impl KeyList {
    fn member(self) -> &'static str {
        match self {
            KeyList::Personal => "personal_api_keys",
            KeyList::Secret => "secret_api_keys",
        }
    }

    fn noun(self) -> &'static str {
        match self {
            KeyList::Personal => "personal key",
            KeyList::Secret => "secret key",
        }
    }
}

/// A key about to be stored: where, under which label, with which scopes (personal
/// keys only; none is every right).
pub struct NewKey<'a> {
    pub list: KeyList,
    pub label: &'a str,
    pub scopes: &'a [String],
}

/// Stores the SHA-256 of `key` with `label` in `project`'s `personal_api_keys` in the
/// projects file at `path` (see [`add_key`]).
pub fn add_hashed_key(path: &Path, project: u64, label: &str, key: &str) -> Result<(), Error> {
    let new = NewKey {
        list: KeyList::Personal,
        label,
        scopes: &[],
    };
    add_key(path, project, &new, key)
}

/// Stores the SHA-256 of `key` as `new` says in the projects file at `path`. Refused,
/// with the file untouched, when the file does not load as it is, when there is no such
/// project, when the project already has a key with that label in that list (labels are
/// how the activity log tells callers apart), when a scope is not one, or when the
/// project already has two secret keys (the current one and the next, for rotation).
pub fn add_key(path: &Path, project: u64, new: &NewKey<'_>, key: &str) -> Result<(), Error> {
    check_label(new.label)?;
    super::check_scopes(new.scopes).map_err(Error)?;
    let bytes = Projects::load_bytes(path)?;
    Projects::parse_file(path, &bytes)?;
    let text =
        std::str::from_utf8(&bytes).map_err(|_| Error(format!("{}: not UTF-8", path.display())))?;
    let spliced = splice(text, project, new, &hash_key(key))
        .map_err(|e| Error(format!("{}: {e}", path.display())))?;
    // What is written must load, with the new key in the right project and label.
    let check = Projects::parse_file(path, spliced.as_bytes())?;
    let landed = match new.list {
        KeyList::Personal => check
            .personal_key(key)
            .map(|(p, caller)| (p.id, caller.label)),
        KeyList::Secret => check.secret_key(key).map(|(p, label)| (p.id, label)),
    };
    if landed != Some((project, new.label.to_owned())) {
        return Err(Error("the new key did not land in its project".into()));
    }
    replace(path, spliced.as_bytes())
        .map_err(|e| Error(format!("{}: cannot rewrite: {e}", path.display())))
}

fn check_label(label: &str) -> Result<(), Error> {
    let chars = label.chars().count();
    if label.trim().is_empty() || chars > MAX_LABEL_CHARS || label.chars().any(char::is_control) {
        return Err(Error(format!(
            "--label must be 1 to {MAX_LABEL_CHARS} characters, not blank, without control characters"
        )));
    }
    Ok(())
}

/// Where `inner` starts within `outer`, of which it is a borrowed part.
fn offset(outer: &str, inner: &str) -> usize {
    inner.as_ptr() as usize - outer.as_ptr() as usize
}

/// `text` with the hashed key added to the project's list: after the list's last entry,
/// or as a new last member of the project when it has no list, separated as the entries
/// or members before it are (so a pretty-printed file stays pretty).
fn splice(text: &str, project: u64, new: &NewKey<'_>, hash: &str) -> Result<String, String> {
    let top: Top = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut found = None;
    for raw in top.projects {
        let members: BTreeMap<String, &RawValue> =
            serde_json::from_str(raw.get()).map_err(|e| e.to_string())?;
        let id = members.get("id").map(|v| v.get().parse::<u64>());
        if let Some(Ok(id)) = id {
            if id == project {
                found = Some((raw.get(), members));
            }
        }
    }
    let (object, members) = found.ok_or_else(|| format!("no project with id {project}"))?;
    let label = new.label;
    let label_json = serde_json::to_string(label).map_err(|e| e.to_string())?;
    let mut entry = format!("{{\"sha256\": \"{hash}\", \"label\": {label_json}");
    if !new.scopes.is_empty() {
        let scopes = serde_json::to_string(new.scopes).map_err(|e| e.to_string())?;
        entry.push_str(&format!(", \"scopes\": {}", scopes.replace(',', ", ")));
    }
    entry.push('}');
    let (member, noun) = (new.list.member(), new.list.noun());
    let (at, insert) = match members.get(member) {
        Some(list) => {
            let keys: Vec<PersonalKey> =
                serde_json::from_str(list.get()).map_err(|e| e.to_string())?;
            let taken = keys.iter().any(|k| match k {
                PersonalKey::Hashed(h) => h.label.as_deref() == Some(label),
                PersonalKey::Plain(_) => false,
            });
            if taken {
                return Err(format!(
                    "project {project} already has a {noun} labelled {label_json}; \
                     choose another label, or remove that key from the file first"
                ));
            }
            if new.list == KeyList::Secret && keys.len() >= super::MAX_SECRET_KEYS {
                return Err(format!(
                    "project {project} already has {} secret keys, the current one and the \
                     next; remove the one no longer used from \"secret_api_keys\" first",
                    keys.len()
                ));
            }
            let entries: Vec<&RawValue> =
                serde_json::from_str(list.get()).map_err(|e| e.to_string())?;
            let list_at = offset(text, list.get());
            match (entries.first(), entries.last()) {
                (Some(first), Some(last)) => {
                    let gap = spacing(&text[list_at + 1..offset(text, first.get())]);
                    let end = offset(text, last.get()) + last.get().len();
                    (end, format!(",{gap}{entry}"))
                }
                _ => (list_at + 1, entry),
            }
        }
        None => {
            let object_at = offset(text, object);
            let inner = &object[1..object.len() - 1];
            let gap = spacing(&inner[..inner.len() - inner.trim_start().len()]);
            let end = object_at + 1 + inner.trim_end().len();
            (end, format!(",{gap}\"{member}\": [{entry}]"))
        }
    };
    let mut out = String::with_capacity(text.len() + insert.len());
    out.push_str(&text[..at]);
    out.push_str(&insert);
    out.push_str(&text[at..]);
    Ok(out)
}

/// What goes between the comma and a new entry: the whitespace before the first one,
/// or one space where there is none.
fn spacing(before_first: &str) -> &str {
    match before_first {
        "" => " ",
        gap => gap,
    }
}

/// Replaces the file at `path` with `bytes` atomically, keeping its owner and mode.
fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let old = fs::metadata(path)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut file = fs::File::create(&temp)?;
        file.write_all(bytes)?;
        fs::set_permissions(&temp, old.permissions())?;
        let new = file.metadata()?;
        if (new.uid(), new.gid()) != (old.uid(), old.gid()) {
            // The server may run as the file's owner and be unable to read a file
            // owned by whoever ran this command.
            std::os::unix::fs::chown(&temp, Some(old.uid()), Some(old.gid()))?;
        }
        file.sync_all()?;
        drop(file);
        fs::rename(&temp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&temp);
    }
    written?;
    crate::support::sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "ab";

    fn personal(label: &str) -> NewKey<'_> {
        NewKey {
            list: KeyList::Personal,
            label,
            scopes: &[],
        }
    }

    #[test]
    fn appends_to_a_list_as_its_entries_are_spaced() {
        let text = "{\"projects\": [\n  {\"id\": 1, \"api_key\": \"phc_a\",\n   \"personal_api_keys\": [\n      \"phx_plain\"\n   ]},\n  {\"id\": 2, \"api_key\": \"phc_b\"}\n]}\n";
        let out = splice(text, 1, &personal("ci"), HASH).unwrap();
        assert_eq!(
            out,
            "{\"projects\": [\n  {\"id\": 1, \"api_key\": \"phc_a\",\n   \"personal_api_keys\": [\n      \"phx_plain\",\n      {\"sha256\": \"ab\", \"label\": \"ci\"}\n   ]},\n  {\"id\": 2, \"api_key\": \"phc_b\"}\n]}\n"
        );
        let empty = "{\"projects\": [{\"id\": 1, \"api_key\": \"k\", \"personal_api_keys\": [ ]}]}";
        assert_eq!(
            splice(empty, 1, &personal("a \"b\""), HASH).unwrap(),
            "{\"projects\": [{\"id\": 1, \"api_key\": \"k\", \"personal_api_keys\": [{\"sha256\": \"ab\", \"label\": \"a \\\"b\\\"\"} ]}]}"
        );
    }

    #[test]
    fn adds_the_list_as_the_projects_last_member() {
        let text = "{\"projects\": [\n  {\n    \"id\": 2,\n    \"api_key\": \"phc_b\"\n  }\n]}";
        assert_eq!(
            splice(text, 2, &personal("ci"), HASH).unwrap(),
            "{\"projects\": [\n  {\n    \"id\": 2,\n    \"api_key\": \"phc_b\",\n    \"personal_api_keys\": [{\"sha256\": \"ab\", \"label\": \"ci\"}]\n  }\n]}"
        );
    }

    #[test]
    fn refuses_a_taken_label_and_an_unknown_project() {
        let text = r#"{"projects": [{"id": 1, "api_key": "k", "personal_api_keys": [{"sha256": "cd", "label": "ci"}]}]}"#;
        assert_eq!(
            splice(text, 1, &personal("ci"), HASH).unwrap_err(),
            "project 1 already has a personal key labelled \"ci\"; choose another label, \
             or remove that key from the file first"
        );
        assert_eq!(
            splice(text, 3, &personal("ci"), HASH).unwrap_err(),
            "no project with id 3"
        );
        assert!(check_label("").is_err());
        assert!(check_label("  ").is_err());
        assert!(check_label("a\nb").is_err());
        assert!(check_label(&"x".repeat(41)).is_err());
        assert!(check_label(&"é".repeat(40)).is_ok());
    }

    #[test]
    fn the_file_is_replaced_whole_with_its_mode_and_the_key_loads() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("projects.json");
        let text = "{\"projects\": [{\"id\": 1, \"api_key\": \"phc_a\"}]}\n";
        fs::write(&path, text).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        add_hashed_key(&path, 1, "ci", "phx_new_key").unwrap();
        let after = fs::read_to_string(&path).unwrap();
        assert!(!after.contains("phx_new_key"), "{after}");
        let projects = Projects::load(&path).unwrap();
        let (p, caller) = projects.personal_key("phx_new_key").unwrap();
        assert_eq!((p.id, caller.label.as_str()), (1, "ci"));
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        let err = add_hashed_key(&path, 1, "ci", "phx_other").unwrap_err();
        assert!(err
            .to_string()
            .contains("already has a personal key labelled \"ci\""));
        assert_eq!(fs::read_to_string(&path).unwrap(), after, "untouched");
        let left: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file left behind");
    }

    #[test]
    fn secret_keys_and_scopes_have_their_own_places() {
        let text = r#"{"projects": [{"id": 1, "api_key": "k"}]}"#;
        let scopes = ["feature_flag:read".to_owned(), "query:read".to_owned()];
        let read_only = NewKey {
            list: KeyList::Personal,
            label: "ro",
            scopes: &scopes,
        };
        assert_eq!(
            splice(text, 1, &read_only, HASH).unwrap(),
            r#"{"projects": [{"id": 1, "api_key": "k", "personal_api_keys": [{"sha256": "ab", "label": "ro", "scopes": ["feature_flag:read", "query:read"]}]}]}"#
        );
        let secret = |label| NewKey {
            list: KeyList::Secret,
            label,
            scopes: &[],
        };
        let one = splice(text, 1, &secret("a"), HASH).unwrap();
        assert_eq!(
            one,
            r#"{"projects": [{"id": 1, "api_key": "k", "secret_api_keys": [{"sha256": "ab", "label": "a"}]}]}"#
        );
        assert!(splice(&one, 1, &secret("a"), HASH)
            .unwrap_err()
            .contains("already has a secret key labelled \"a\""));
        let two = splice(&one, 1, &secret("b"), HASH).unwrap();
        assert!(splice(&two, 1, &secret("c"), HASH)
            .unwrap_err()
            .contains("already has 2 secret keys"));
    }
}
