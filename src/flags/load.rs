//! Loading `flags/<project id>.json` files into a `Snapshot` and publishing it atomically.
//! Requests read the current snapshot lock-free through `ArcSwap` and keep their `Arc` for
//! the whole evaluation, so they see either the old or the new rules, never a mixture. A
//! file that fails to compile keeps that project's previous rules: a typo in one project
//! must not switch its flags off.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;

use super::compile::ProjectRules;
use super::error::{CompileError, ErrorKind};

/// Extension of flag files; other files in the directory (editor swap files) are ignored.
const FLAG_FILE_EXTENSION: &str = "json";

/// Every project's compiled rules at one moment.
#[derive(Debug, Default)]
pub struct Snapshot {
    projects: HashMap<i64, Arc<ProjectRules>>,
    version: u64,
}

impl Snapshot {
    pub fn project(&self, id: i64) -> Option<&Arc<ProjectRules>> {
        self.projects.get(&id)
    }

    /// Increments with every published snapshot; 0 is the empty start.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The project ids with rules, sorted.
    pub fn project_ids(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self.projects.keys().copied().collect();
        ids.sort_unstable();
        ids
    }
}

/// The outcome of one reload.
#[derive(Debug, Clone, PartialEq)]
pub struct ReloadReport {
    /// The version of the snapshot now current.
    pub version: u64,
    /// Projects compiled from their file in this reload, sorted.
    pub loaded: Vec<i64>,
    /// Files that could not be used; each project concerned kept its previous rules.
    pub errors: Vec<CompileError>,
    /// Flags disabled in files that did load (missing or cyclic dependencies, filters or
    /// cohorts that cannot be evaluated).
    pub warnings: Vec<CompileError>,
}

/// The published flag rules of all projects, and what is needed to reload them.
pub struct Rules {
    /// Swapped whole, so readers never take a lock and never see a partial reload.
    current: ArcSwap<Snapshot>,
    /// Serialises reloads (SIGHUP and the poller may race) and remembers what was seen.
    loader: Mutex<Seen>,
    failures: AtomicU64,
    /// What the last reload could not use, each naming its file and field (the
    /// console's health page shows them).
    problems: Mutex<Arc<Vec<String>>>,
}

#[derive(Debug, Default)]
struct Seen {
    files: crate::watch::Seen,
    /// Flag definitions made from other files (surveys' targeting flags), per project.
    generated: Arc<Generated>,
}

/// Flag definitions, in the file format, generated for each project from other files and
/// appended to its own (see `flags::generated`).
pub type Generated = HashMap<i64, Vec<serde_json::Value>>;

impl std::fmt::Debug for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rules")
            .field("version", &self.current.load().version)
            .field("reload_failures", &self.reload_failures())
            .finish()
    }
}

impl Default for Rules {
    fn default() -> Self {
        Rules::new()
    }
}

impl Rules {
    /// No projects; `reload` fills it.
    pub fn new() -> Rules {
        Rules {
            current: ArcSwap::from_pointee(Snapshot::default()),
            loader: Mutex::new(Seen::default()),
            failures: AtomicU64::new(0),
            problems: Mutex::default(),
        }
    }

    /// Loads every file of `flags_dir` (the data dir's `flags/`). Like every method that
    /// touches files, this blocks: call it from a blocking thread, not the reactor.
    pub fn load(flags_dir: &Path) -> (Rules, ReloadReport) {
        let rules = Rules::new();
        let report = rules.reload(flags_dir);
        (rules, report)
    }

    /// The current snapshot; lock-free. Hold it for a whole request.
    pub fn current(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Files rejected since start, for metrics.
    pub fn reload_failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Compiles every file and publishes the result in one swap.
    pub fn reload(&self, flags_dir: &Path) -> ReloadReport {
        let mut seen = self.lock();
        let report = self.reload_locked(flags_dir, &mut seen);
        self.remember(&report);
        report
    }

    /// What the last reload could not use (files rejected, and for flags the flags
    /// disabled), one line each.
    pub fn problems(&self) -> Arc<Vec<String>> {
        crate::sync::lock(&self.problems).clone()
    }

    fn remember(&self, report: &ReloadReport) {
        let lines = report
            .errors
            .iter()
            .chain(&report.warnings)
            .map(ToString::to_string)
            .collect();
        // A whole value swapped in one assignment: nothing to leave half-done.
        *crate::sync::lock(&self.problems) = Arc::new(lines);
    }

    /// Reloads only when file names, sizes or mtimes changed (or, for files changed in the
    /// last moments, their content). Cheap enough to poll every few hundred milliseconds;
    /// `None` when nothing changed.
    pub fn reload_if_changed(&self, flags_dir: &Path) -> Option<ReloadReport> {
        let mut seen = self.lock();
        let entries = list(flags_dir).ok();
        if seen.files.changed(entries.as_deref()) {
            let report = self.reload_locked(flags_dir, &mut seen);
            self.remember(&report);
            return Some(report);
        }
        None
    }

    /// Replaces the generated flags appended to each project's file; true when they
    /// changed. A change makes the next `reload_if_changed` recompile every project, as
    /// a changed file would.
    pub fn set_generated(&self, generated: Generated) -> bool {
        let mut seen = self.lock();
        if *seen.generated == generated {
            return false;
        }
        seen.generated = Arc::new(generated);
        seen.files.forget();
        true
    }

    fn lock(&self) -> MutexGuard<'_, Seen> {
        // A panic mid-reload leaves at worst stale stamps, which only cause a reload.
        crate::sync::lock(&self.loader)
    }

    fn reload_locked(&self, flags_dir: &Path, seen: &mut Seen) -> ReloadReport {
        let previous = self.current.load_full();
        let entries = match list(flags_dir) {
            Ok(entries) => entries,
            Err(error) => {
                let error = CompileError::in_file(flags_dir, ErrorKind::Io(error.to_string()));
                self.record_failure(&error);
                // The poller reloads once the directory can be listed again.
                seen.files.unlistable();
                return ReloadReport {
                    version: previous.version,
                    loaded: Vec::new(),
                    errors: vec![error],
                    warnings: Vec::new(),
                };
            }
        };
        let mut projects = HashMap::new();
        let mut report = ReloadReport {
            version: previous.version + 1,
            loaded: Vec::new(),
            errors: Vec::new(),
            warnings: Vec::new(),
        };
        let current = seen.files.begin(&entries);
        let generated = Arc::clone(&seen.generated);
        for path in &entries {
            let bytes = fs::read(path);
            if let Ok(bytes) = &bytes {
                seen.files.read(path, bytes);
            }
            let Some(id) = project_id(path) else {
                let error = CompileError::in_file(path, ErrorKind::FileName);
                self.record_failure(&error);
                report.errors.push(error);
                continue;
            };
            let extra = generated.get(&id).map_or(&[][..], Vec::as_slice);
            let compiled = bytes
                .map_err(|e| CompileError::in_file(path, ErrorKind::Io(e.to_string())))
                .and_then(|bytes| compile_file(path, &bytes, extra));
            match compiled {
                Ok(rules) => {
                    let warnings = rules.warnings().iter().map(|w| w.clone().with_file(path));
                    report.warnings.extend(warnings);
                    projects.insert(id, Arc::new(rules));
                    report.loaded.push(id);
                }
                Err(error) => {
                    self.record_failure(&error);
                    report.errors.push(error);
                    if let Some(kept) = previous.project(id) {
                        projects.insert(id, Arc::clone(kept));
                    }
                }
            }
        }
        // Projects with generated flags but no file of their own.
        for (&id, extra) in generated.iter() {
            let has_file = entries.iter().any(|path| project_id(path) == Some(id));
            if !has_file {
                match super::generated::compile(None, extra) {
                    Ok(rules) => {
                        projects.insert(id, Arc::new(rules));
                    }
                    Err(error) => {
                        self.record_failure(&error);
                        report.errors.push(error);
                        if let Some(kept) = previous.project(id) {
                            projects.insert(id, Arc::clone(kept));
                        }
                    }
                }
            }
        }
        report.loaded.sort_unstable();
        let snapshot = Snapshot {
            projects,
            version: report.version,
        };
        let count = snapshot.projects.len();
        self.current.store(Arc::new(snapshot));
        seen.files.finish(current);
        tracing::info!(
            version = report.version,
            projects = count,
            "flag rules published"
        );
        report
    }

    fn record_failure(&self, error: &CompileError) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%error, "flag file not loaded; previous rules kept");
    }
}

fn compile_file(
    path: &Path,
    bytes: &[u8],
    generated: &[serde_json::Value],
) -> Result<ProjectRules, CompileError> {
    let rules = if generated.is_empty() {
        ProjectRules::compile(bytes)
    } else {
        super::generated::compile(Some(bytes), generated)
    }
    .map_err(|e| e.with_file(path))?;
    for warning in rules.warnings() {
        tracing::warn!(file = %path.display(), %warning, "flag disabled until fixed");
    }
    Ok(rules)
}

/// The `*.json` files of the directory, sorted by name for deterministic reports.
pub(crate) fn list(flags_dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(flags_dir)? {
        let path = entry?.path();
        let is_json = path
            .extension()
            .is_some_and(|ext| ext == FLAG_FILE_EXTENSION);
        if is_json && path.is_file() {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// `<id>.json` with `id` written canonically, so `01.json` and `1.json` cannot both claim
/// project 1.
pub(crate) fn project_id(path: &Path) -> Option<i64> {
    let stem = path.file_stem()?.to_str()?;
    let id: i64 = stem.parse().ok()?;
    (id.to_string() == stem).then_some(id)
}
