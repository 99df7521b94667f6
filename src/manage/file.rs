//! A project's `flags/<id>.json` as the management API reads and rewrites it: parsed
//! with its members in file order, changed in memory, and replaced whole and atomically
//! (a temporary file in the same directory, fsync, rename, fsync of the directory), so
//! a crash at any instant leaves the old file or the new one, never a mixture. Only the
//! members a change touches differ; everything else is written back as it was read.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use super::error::Error;

/// A project's file, parsed, with the digest of the bytes it was read from.
#[derive(Debug, Clone)]
pub struct FlagFile {
    pub doc: Map<String, Value>,
    /// SHA-1 of the bytes read; `None` when there was no file.
    pub digest: Option<[u8; 20]>,
}

pub fn path(flags_dir: &Path, project: u64) -> PathBuf {
    flags_dir.join(format!("{project}.json"))
}

/// The temporary file of a write; one per project, since writes to a project are
/// serialized. Its extension keeps the reloader from reading it.
fn temp_path(flags_dir: &Path, project: u64) -> PathBuf {
    flags_dir.join(format!(".{project}.json.tmp"))
}

impl FlagFile {
    /// Reads the file; a missing one is an empty project.
    pub fn read(flags_dir: &Path, project: u64) -> Result<FlagFile, Error> {
        let path = path(flags_dir, project);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let doc = json!({"flags": [], "group_type_mapping": {}, "cohorts": {}});
                let Value::Object(doc) = doc else {
                    unreachable!("a literal object")
                };
                return Ok(FlagFile { doc, digest: None });
            }
            Err(e) => return Err(Error::Io(format!("{}: {e}", path.display()))),
        };
        let doc: Value = serde_json::from_slice(&bytes).map_err(|e| {
            Error::Io(format!(
                "{} is not valid JSON ({e}); fix it by hand first",
                path.display()
            ))
        })?;
        let Value::Object(doc) = doc else {
            return Err(Error::Io(format!(
                "{} is not a JSON object",
                path.display()
            )));
        };
        Ok(FlagFile {
            doc,
            digest: Some(crate::support::watch::digest(&bytes)),
        })
    }

    /// The file's flags, in file order.
    pub fn flags(&self) -> &[Value] {
        match self.doc.get("flags") {
            Some(Value::Array(a)) => a,
            _ => &[],
        }
    }

    pub fn flags_mut(&mut self) -> &mut Vec<Value> {
        let slot = self
            .doc
            .entry("flags")
            .or_insert_with(|| Value::Array(Vec::new()));
        if !slot.is_array() {
            *slot = Value::Array(Vec::new());
        }
        match slot {
            Value::Array(a) => a,
            _ => unreachable!("made an array above"),
        }
    }

    /// The position of the flag with `id`, deleted or not.
    pub fn position(&self, id: i64) -> Option<usize> {
        self.flags().iter().position(|f| flag_id(f) == Some(id))
    }

    /// The next id: one above the highest in the file, deleted flags included, so an id
    /// is never given to two flags.
    pub fn next_id(&self) -> i64 {
        self.flags().iter().filter_map(flag_id).max().unwrap_or(0) + 1
    }

    /// The file's cohorts object (created when absent or not an object).
    pub fn cohorts_mut(&mut self) -> &mut Map<String, Value> {
        object_mut(&mut self.doc, "cohorts")
    }

    pub fn cohorts(&self) -> Option<&Map<String, Value>> {
        self.doc.get("cohorts").and_then(Value::as_object)
    }

    /// The bytes written: two-space indented JSON ending in a newline, members in the
    /// order read, new ones appended; stable, so the file diffs well in version control.
    pub fn render(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(&self.doc).unwrap_or_default();
        out.push(b'\n');
        out
    }
}

/// `doc[name]` as an object, replacing anything else there.
pub fn object_mut<'a>(doc: &'a mut Map<String, Value>, name: &str) -> &'a mut Map<String, Value> {
    let slot = doc.entry(name).or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    match slot {
        Value::Object(m) => m,
        _ => unreachable!("made an object above"),
    }
}

pub fn flag_id(flag: &Value) -> Option<i64> {
    flag.get("id").and_then(Value::as_i64)
}

pub fn is_deleted(flag: &Value) -> bool {
    flag.get("deleted").and_then(Value::as_bool) == Some(true)
}

/// Replaces the project's file with `bytes`: written to a temporary file in the same
/// directory, flushed to disk, renamed over the file, and the directory flushed so the
/// rename itself survives a power loss.
pub fn write_atomically(flags_dir: &Path, project: u64, bytes: &[u8]) -> Result<(), Error> {
    let io = |what: &str, e: std::io::Error| Error::Io(format!("{what}: {e}"));
    fs::create_dir_all(flags_dir).map_err(|e| io("create the flags directory", e))?;
    let temp = temp_path(flags_dir, project);
    let mut file = fs::File::create(&temp).map_err(|e| io("create the temporary file", e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| io("write the temporary file", e))?;
    drop(file);
    fs::rename(&temp, path(flags_dir, project)).map_err(|e| io("rename", e))?;
    crate::support::sync_dir(flags_dir).map_err(|e| io("sync the flags directory", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_an_empty_project_and_writes_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = FlagFile::read(dir.path(), 7).unwrap();
        assert_eq!(file.digest, None);
        assert_eq!(file.next_id(), 1);
        file.flags_mut()
            .push(json!({"id": 4, "key": "a", "deleted": true}));
        file.doc.insert("extra".into(), json!({"kept": [1, 2]}));
        write_atomically(dir.path(), 7, &file.render()).unwrap();
        let text = fs::read_to_string(dir.path().join("7.json")).unwrap();
        assert!(
            text.starts_with("{\n  \"flags\": [\n    {\n      \"id\": 4,"),
            "{text}"
        );
        assert!(text.ends_with("}\n"));
        let again = FlagFile::read(dir.path(), 7).unwrap();
        assert_eq!(again.next_id(), 5, "deleted flags keep their ids");
        assert_eq!(again.doc["extra"], json!({"kept": [1, 2]}));
        assert_eq!(again.position(4), Some(0));
        assert!(is_deleted(&again.flags()[0]));
        assert!(!dir.path().join(".7.json.tmp").exists());
    }

    #[test]
    fn a_broken_file_is_refused_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("3.json"), "{\"flags\": [").unwrap();
        let err = FlagFile::read(dir.path(), 3).unwrap_err().to_string();
        assert!(err.contains("is not valid JSON"), "{err}");
        fs::write(dir.path().join("3.json"), "[]").unwrap();
        let err = FlagFile::read(dir.path(), 3).unwrap_err().to_string();
        assert!(err.ends_with("3.json is not a JSON object"), "{err}");
    }
}
