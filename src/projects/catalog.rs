//! Per-project JSON files beside the flag files, one directory per kind:
//! `DIR/surveys/<project id>.json` and `DIR/early_access/<project id>.json`. A
//! [`Catalog`] parses each file once into a [`Document`] and publishes all projects in one
//! atomic swap, as `flags::Rules` does for flag files, with the same reload lock and
//! change detection ([`crate::support::watch`]: file names, sizes, mtimes, then content while a
//! file is fresh) driven by the same poller and SIGHUP. A file that fails to parse keeps that project's previous version and
//! is logged with the file, the item and the field at fault.

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::support::watch::{list, project_id, Pass, Problem, Watched};

/// Larger files are refused unread: these are hand-written lists of a few dozen items,
/// and each is parsed and held in memory whole.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// What one file of a catalog parses into.
pub trait Document: Sized + Send + Sync + 'static {
    /// The directory's kind, for logs ("surveys").
    const KIND: &'static str;
    /// Parses and validates one file's bytes. Errors name the item and field.
    fn parse(bytes: &[u8]) -> Result<Self, FileError>;
}

/// Why a file was not used: the file, the item in it (`survey "abc"`), the field path
/// within the item, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    pub file: Option<PathBuf>,
    pub item: Option<String>,
    pub field: String,
    pub message: String,
}

impl FileError {
    /// An error about the whole file, or about `field` of it.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> FileError {
        FileError {
            file: None,
            item: None,
            field: field.into(),
            message: message.into(),
        }
    }

    /// An error about `field` of one item, e.g. `survey "abc"`.
    pub fn in_item(item: String, field: impl Into<String>, message: impl Into<String>) -> Self {
        FileError {
            item: Some(item),
            ..FileError::new(field, message)
        }
    }

    fn with_file(mut self, path: &Path) -> FileError {
        self.file = Some(path.to_owned());
        self
    }
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}: ", file.display())?;
        }
        if let Some(item) = &self.item {
            write!(f, "{item}: ")?;
        }
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

/// The outcome of one reload.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// Projects parsed from their file in this reload, sorted.
    pub loaded: Vec<i64>,
    /// Files that could not be used; each project concerned kept its previous version.
    pub errors: Vec<FileError>,
}

/// Every project's document of one kind, reloadable.
pub struct Catalog<T> {
    /// Swapped whole, so readers never take a lock and never see a partial reload.
    current: ArcSwap<HashMap<i64, Arc<T>>>,
    files: Watched,
    /// What the last reload could not use, each naming its file and field, with the
    /// project of its file (the console's health page shows a project its own).
    problems: Mutex<Arc<Vec<Problem>>>,
}

impl<T: Document> Default for Catalog<T> {
    fn default() -> Self {
        Catalog {
            current: ArcSwap::from_pointee(HashMap::new()),
            files: Watched::default(),
            problems: Mutex::default(),
        }
    }
}

impl<T: Document> Catalog<T> {
    /// Loads every file of `dir`. Blocks on file reads, like every reload.
    pub fn load(dir: &Path) -> (Catalog<T>, Report) {
        let catalog = Catalog::default();
        let report = catalog.reload(dir);
        (catalog, report)
    }

    /// The project's document, if it has a usable file.
    pub fn project(&self, id: i64) -> Option<Arc<T>> {
        self.current.load().get(&id).cloned()
    }

    /// Every project's document at one moment.
    pub fn all(&self) -> Arc<HashMap<i64, Arc<T>>> {
        self.current.load_full()
    }

    /// Files rejected since start, for metrics.
    pub fn reload_failures(&self) -> u64 {
        self.files.failures()
    }

    /// Parses every file and publishes the result in one swap.
    pub fn reload(&self, dir: &Path) -> Report {
        let report = self
            .files
            .reload(entries(dir), |pass| self.parse_all(dir, pass));
        self.remember(&report);
        report
    }

    /// What the last reload could not use (files rejected), one line each.
    pub fn problems(&self) -> Arc<Vec<Problem>> {
        crate::support::sync::lock(&self.problems).clone()
    }

    fn remember(&self, report: &Report) {
        let lines = report
            .errors
            .iter()
            .map(|e| (e.file.as_deref().and_then(project_id), e.to_string()))
            .collect();
        // A whole value swapped in one assignment: nothing to leave half-done.
        *crate::support::sync::lock(&self.problems) = Arc::new(lines);
    }

    /// Reloads only when something in `dir` changed; `None` when nothing did.
    pub fn reload_if_changed(&self, dir: &Path) -> Option<Report> {
        let report = self
            .files
            .reload_if_changed(entries(dir), |pass| self.parse_all(dir, pass))?;
        self.remember(&report);
        Some(report)
    }

    fn parse_all(&self, dir: &Path, pass: &mut Pass<'_, ()>) -> Report {
        let previous = self.current.load_full();
        let mut report = Report::default();
        let entries = match pass.files {
            Ok(entries) => entries,
            Err(e) => {
                let error = FileError::new("", format!("cannot list: {e}")).with_file(dir);
                record_failure::<T>(pass, &error);
                report.errors.push(error);
                return report;
            }
        };
        let mut projects = HashMap::new();
        for path in entries {
            let parsed = read(path).and_then(|bytes| {
                pass.read(path, &bytes);
                let id = project_id(path)
                    .ok_or_else(|| FileError::new("", "file name is not <project id>.json"))?;
                T::parse(&bytes).map(|doc| (id, doc))
            });
            match parsed {
                Ok((id, doc)) => {
                    projects.insert(id, Arc::new(doc));
                    report.loaded.push(id);
                }
                Err(error) => {
                    let error = error.with_file(path);
                    record_failure::<T>(pass, &error);
                    report.errors.push(error);
                    if let Some((id, kept)) =
                        project_id(path).and_then(|id| Some((id, previous.get(&id)?)))
                    {
                        projects.insert(id, Arc::clone(kept));
                    }
                }
            }
        }
        report.loaded.sort_unstable();
        let count = projects.len();
        self.current.store(Arc::new(projects));
        tracing::info!(kind = T::KIND, projects = count, "published");
        report
    }
}

fn record_failure<T: Document>(pass: &Pass<'_, ()>, error: &FileError) {
    pass.failed();
    tracing::warn!(kind = T::KIND, %error, "file not loaded; previous version kept");
}

/// The directory's `*.json` files; a directory that does not exist holds none (each kind
/// is optional).
fn entries(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    match list(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        other => other,
    }
}

/// The file's bytes, refusing one over [`MAX_FILE_BYTES`] without reading it all.
fn read(path: &Path) -> Result<Vec<u8>, FileError> {
    let io = |e: std::io::Error| FileError::new("", format!("cannot read: {e}"));
    let file = fs::File::open(path).map_err(io)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        let limit = MAX_FILE_BYTES / 1024 / 1024;
        return Err(FileError::new("", format!("larger than {limit} MiB")));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A document that is the file's text, refusing "bad".
    struct Text(String);

    impl Document for Text {
        const KIND: &'static str = "test";
        fn parse(bytes: &[u8]) -> Result<Self, FileError> {
            let text = String::from_utf8_lossy(bytes).into_owned();
            if text == "bad" {
                return Err(FileError::in_item("item \"x\"".into(), "a.b", "is bad"));
            }
            Ok(Text(text))
        }
    }

    fn text(catalog: &Catalog<Text>, id: i64) -> Option<String> {
        catalog.project(id).map(|t| t.0.clone())
    }

    #[test]
    fn a_broken_file_keeps_the_previous_version_and_names_the_place() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, report) = Catalog::<Text>::load(&dir.path().join("absent"));
        assert_eq!(report, Report::default(), "a missing directory is empty");
        fs::write(dir.path().join("1.json"), "one").unwrap();
        fs::write(dir.path().join("x.json"), "two").unwrap();
        let report = catalog.reload(dir.path());
        assert_eq!(report.loaded, [1]);
        assert_eq!(text(&catalog, 1).as_deref(), Some("one"));
        assert!(report.errors[0]
            .to_string()
            .ends_with("x.json: file name is not <project id>.json"));
        fs::write(dir.path().join("1.json"), "bad").unwrap();
        let report = catalog.reload(dir.path());
        let file = dir.path().join("1.json");
        assert_eq!(
            report.errors[0].to_string(),
            format!("{}: item \"x\": a.b: is bad", file.display())
        );
        assert_eq!(text(&catalog, 1).as_deref(), Some("one"));
        assert_eq!(catalog.reload_failures(), 3);
    }

    #[test]
    fn changes_are_seen_and_unchanged_files_are_not_reread() {
        let dir = tempfile::tempdir().unwrap();
        let (catalog, _) = Catalog::<Text>::load(dir.path());
        assert!(catalog.reload_if_changed(dir.path()).is_none());
        fs::write(dir.path().join("2.json"), "a").unwrap();
        assert!(catalog.reload_if_changed(dir.path()).is_some());
        assert_eq!(text(&catalog, 2).as_deref(), Some("a"));
        // Same size, same mtime tick: the content check of a fresh file finds it.
        fs::write(dir.path().join("2.json"), "b").unwrap();
        assert!(catalog.reload_if_changed(dir.path()).is_some());
        assert_eq!(text(&catalog, 2).as_deref(), Some("b"));
        assert!(catalog.reload_if_changed(dir.path()).is_none());
        fs::remove_file(dir.path().join("2.json")).unwrap();
        assert!(catalog.reload_if_changed(dir.path()).is_some());
        assert_eq!(text(&catalog, 2), None);
    }

    #[test]
    fn oversized_files_are_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let big = vec![b' '; MAX_FILE_BYTES as usize + 1];
        fs::write(dir.path().join("3.json"), big).unwrap();
        let (catalog, report) = Catalog::<Text>::load(dir.path());
        assert!(report.errors[0].message.contains("larger than 4 MiB"));
        assert_eq!(text(&catalog, 3), None);
    }
}
