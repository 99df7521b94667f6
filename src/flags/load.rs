//! Loading `flags/<project id>.json` files into a `Snapshot` and publishing it atomically.
//! Requests read the current snapshot lock-free through `ArcSwap` and keep their `Arc` for
//! the whole evaluation, so they see either the old or the new rules, never a mixture. A
//! file that fails to compile, or that `lint` or a mistake the compiler only warns about
//! (a dependency on no flag, a cycle) finds fault with, keeps that project's previous
//! rules: a typo in one project must neither ship nor switch its flags off. What is
//! refused here is exactly what `flagpost check` refuses, as it loads files this way.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::Path;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use super::compile::ProjectRules;
use super::error::{CompileError, ErrorKind};
use super::synced::{Generated, Overlay};
use crate::support::watch::{list, project_id, Pass, Problem, Watched};

/// Every project's compiled rules at one moment.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub(super) projects: HashMap<i64, Arc<ProjectRules>>,
    version: u64,
    /// Synced projects upstream has quota-limited (edge mode): no rules, and flags
    /// answer `quota_limited`.
    quota_limited: HashSet<i64>,
}

impl Snapshot {
    pub fn project(&self, id: i64) -> Option<&Arc<ProjectRules>> {
        self.projects.get(&id)
    }

    /// Increments with every published snapshot; 0 is the empty start.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Whether upstream said this synced project's flag quota is used up.
    pub fn quota_limited(&self, id: i64) -> bool {
        self.quota_limited.contains(&id)
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
    pub(super) current: ArcSwap<Snapshot>,
    /// The flag files, with the flag definitions made from other files (surveys'
    /// targeting flags) per project.
    pub(super) files: Watched<Arc<Generated>>,
    /// What the last reload could not use, each naming its file and field, with the
    /// project of its file (the console's health page shows a project its own).
    problems: Mutex<Arc<Vec<Problem>>>,
    /// Why the last reload refused files (for `/metrics`, which names each).
    refused: Mutex<Arc<Vec<CompileError>>>,
    /// Projects whose rules come from upstream (edge mode), laid over the files' on
    /// every publish; its lock is held while a snapshot is published.
    pub(super) synced: Mutex<Overlay>,
}

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
            files: Watched::default(),
            problems: Mutex::default(),
            refused: Mutex::default(),
            synced: Mutex::default(),
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
        self.files.failures()
    }

    /// Compiles every file and publishes the result in one swap.
    pub fn reload(&self, flags_dir: &Path) -> ReloadReport {
        let report = self
            .files
            .reload(list(flags_dir), |pass| self.compile_all(flags_dir, pass));
        self.remember(&report);
        report
    }

    /// What the last reload could not use (files rejected, and the flags disabled),
    /// one line each.
    pub fn problems(&self) -> Arc<Vec<String>> {
        let all = crate::support::sync::lock(&self.problems).clone();
        Arc::new(all.iter().map(|(_, line)| line.clone()).collect())
    }

    /// [`Rules::problems`], each with the project of its file.
    pub fn problems_by_project(&self) -> Arc<Vec<Problem>> {
        crate::support::sync::lock(&self.problems).clone()
    }

    /// Why the last reload refused files, each naming its file, flag and field.
    pub fn refused(&self) -> Arc<Vec<CompileError>> {
        crate::support::sync::lock(&self.refused).clone()
    }

    fn remember(&self, report: &ReloadReport) {
        *crate::support::sync::lock(&self.refused) = Arc::new(report.errors.clone());
        let lines = report
            .errors
            .iter()
            .chain(&report.warnings)
            .map(|e| (e.file().and_then(project_id), e.to_string()))
            .collect();
        // A whole value swapped in one assignment: nothing to leave half-done.
        *crate::support::sync::lock(&self.problems) = Arc::new(lines);
    }

    /// Reloads only when file names, sizes or mtimes changed (or, for files changed in the
    /// last moments, their content). Cheap enough to poll every few hundred milliseconds;
    /// `None` when nothing changed.
    pub fn reload_if_changed(&self, flags_dir: &Path) -> Option<ReloadReport> {
        let report = self
            .files
            .reload_if_changed(list(flags_dir), |pass| self.compile_all(flags_dir, pass))?;
        self.remember(&report);
        Some(report)
    }

    /// Replaces the generated flags appended to each project's file; true when they
    /// changed. A change makes the next `reload_if_changed` recompile every project, as
    /// a changed file would.
    pub fn set_generated(&self, generated: Generated) -> bool {
        self.files.update(|current| {
            if **current == generated {
                return false;
            }
            *current = Arc::new(generated);
            true
        })
    }

    fn compile_all(&self, flags_dir: &Path, pass: &mut Pass<'_, Arc<Generated>>) -> ReloadReport {
        let previous = self.current.load_full();
        let entries = match pass.files {
            Ok(entries) => entries,
            Err(error) => {
                let error = CompileError::in_file(flags_dir, ErrorKind::Io(error.to_string()));
                record_failure(pass, &error);
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
        let generated = Arc::clone(pass.extra);
        let synced_ids: HashSet<i64> = crate::support::sync::lock(&self.synced)
            .keys()
            .copied()
            .collect();
        for path in entries {
            let bytes = fs::read(path);
            if let Ok(bytes) = &bytes {
                pass.read(path, bytes);
            }
            let Some(id) = project_id(path) else {
                let error = CompileError::in_file(path, ErrorKind::FileName);
                record_failure(pass, &error);
                report.errors.push(error);
                continue;
            };
            if synced_ids.contains(&id) {
                // Its rules come from upstream; the sync names the ignored file.
                continue;
            }
            let extra = generated.get(&id).map_or(&[][..], Vec::as_slice);
            let compiled = bytes
                .map_err(|e| vec![CompileError::in_file(path, ErrorKind::Io(e.to_string()))])
                .and_then(|bytes| compile_file(path, &bytes, extra));
            match compiled {
                Ok(rules) => {
                    let warnings = rules.warnings().iter().map(|w| w.clone().with_file(path));
                    report.warnings.extend(warnings);
                    projects.insert(id, Arc::new(rules));
                    report.loaded.push(id);
                }
                Err(errors) => {
                    record_failures(pass, &errors);
                    report.errors.extend(errors);
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
                        record_failure(pass, &error);
                        report.errors.push(error);
                        if let Some(kept) = previous.project(id) {
                            projects.insert(id, Arc::clone(kept));
                        }
                    }
                }
            }
        }
        report.loaded.sort_unstable();
        let mut overlay = crate::support::sync::lock(&self.synced);
        let (version, count) = self.publish(&mut overlay, projects, &generated);
        report.version = version;
        tracing::info!(
            version = report.version,
            projects = count,
            "flag rules published"
        );
        report
    }
}

impl Rules {
    /// Publish `projects` (the files' rules) with the synced projects laid over them,
    /// under the synced projects' lock, so a sync and a file reload never drop each
    /// other's change. Returns the new version and the number of projects.
    pub(super) fn publish(
        &self,
        overlay: &mut Overlay,
        mut projects: HashMap<i64, Arc<ProjectRules>>,
        generated: &Generated,
    ) -> (u64, usize) {
        let quota_limited = super::synced::apply(overlay, &mut projects, generated);
        let version = self.current.load().version + 1;
        let count = projects.len();
        self.current.store(Arc::new(Snapshot {
            projects,
            version,
            quota_limited,
        }));
        (version, count)
    }
}

fn record_failure(pass: &Pass<'_, Arc<Generated>>, error: &CompileError) {
    record_failures(pass, std::slice::from_ref(error));
}

/// One file refused (counted once, for `/metrics`), each of its problems logged.
fn record_failures(pass: &Pass<'_, Arc<Generated>>, errors: &[CompileError]) {
    pass.failed();
    for error in errors {
        tracing::warn!(%error, "flag file not loaded; previous rules kept");
    }
}

/// The file's rules, or every reason it is refused: the compiler's error, else what
/// `lint` finds and the warnings that are mistakes, each naming the file.
fn compile_file(
    path: &Path,
    bytes: &[u8],
    generated: &[serde_json::Value],
) -> Result<ProjectRules, Vec<CompileError>> {
    let rules = if generated.is_empty() {
        ProjectRules::compile(bytes)
    } else {
        super::generated::compile(Some(bytes), generated)
    }
    .map_err(|e| vec![e.with_file(path)])?;
    let mut refused = super::lint::lint(rules.definitions_json());
    refused.extend(rules.warnings().iter().filter(|w| w.is_mistake()).cloned());
    if !refused.is_empty() {
        return Err(refused.into_iter().map(|e| e.with_file(path)).collect());
    }
    for warning in rules.warnings() {
        tracing::warn!(file = %path.display(), %warning, "flag disabled until fixed");
    }
    Ok(rules)
}
