//! Operator commands that work on files rather than a running server: `check`
//! validates a data dir before it is deployed, `eval` (in `eval.rs`) shows what one
//! user gets from each flag and why, `export` writes every stored event of a stopped
//! server's database as NDJSON.

mod eval;

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use serde_json::Value;

use crate::flags::Rules;
use crate::geoip;
use crate::projects::catalog::Catalog;
use crate::projects::early_access::ProjectFeatures;
use crate::projects::surveys::ProjectSurveys;
use crate::projects::Projects;
use crate::store::query::{self, EventFilter};
use crate::store::{block, keys, Trees};

pub use eval::{eval, render, EvalError, Request};

/// What `check` found: problems that must be fixed, and notes worth reading.
#[derive(Debug, Default)]
pub struct CheckReport {
    pub errors: Vec<String>,
    /// Flags the server serves off, in files it does load (a cohort it cannot evaluate,
    /// which a file from PostHog's feed may hold): worth fixing, not refused.
    pub warnings: Vec<String>,
    pub notes: Vec<String>,
}

/// Validate a data dir: `projects.json`, every flag file in `flags_dir` (naming the flag
/// and field at fault; `<data dir>/flags` unless the deployment keeps them elsewhere),
/// `surveys/*.json` and `early_access/*.json` (naming the survey or feature and the
/// field), and the GeoIP database if there is one.
pub fn check(data_dir: &Path, flags_dir: &Path, geoip_file: Option<&Path>) -> CheckReport {
    let mut report = CheckReport::default();
    let projects_file = data_dir.join("projects.json");
    let projects = match Projects::load(&projects_file) {
        Ok(p) => {
            report
                .notes
                .push(format!("{}: {} projects", projects_file.display(), p.len()));
            Some(p)
        }
        Err(e) => {
            report.errors.push(e.to_string());
            None
        }
    };

    let (surveys, features) = check_surveys_and_features(data_dir, &mut report);
    if let Some(stray) = crate::manage::place::left_behind(&data_dir.join("flags"), flags_dir) {
        report.errors.push(stray);
    }
    let rules = Rules::new();
    rules.set_generated(crate::projects::surveys::generated(&surveys));
    // Loaded as serving loads them: a file is an error here exactly when the server
    // would refuse it and keep the previous rules.
    let loaded = rules.reload(flags_dir);
    report
        .errors
        .extend(loaded.errors.iter().map(|e| e.to_string()));
    report.warnings.extend(
        loaded
            .warnings
            .iter()
            .map(|w| format!("{w} (the server serves this flag off until it is fixed)")),
    );
    let snapshot = rules.current();
    for id in snapshot.project_ids() {
        let known = projects
            .as_ref()
            .is_none_or(|p| u64::try_from(id).ok().and_then(|id| p.by_id(id)).is_some());
        if !known {
            report.notes.push(format!(
                "{}/{id}.json: no project {id} in projects.json; its flags are never served",
                flags_dir.display()
            ));
        }
        if let Some(r) = snapshot.project(id) {
            // The feed is the file as written; the rest were made for surveys.
            let file = r.definitions_json()["flags"].as_array();
            let written = file.map_or(0, |f| f.iter().filter(|f| f["deleted"] != true).count());
            let made = r.flag_count().saturating_sub(written);
            let made = if made > 0 {
                format!(" ({made} of them made for surveys)")
            } else {
                String::new()
            };
            report.notes.push(format!(
                "{}/{id}.json: {} flags{made}",
                flags_dir.display(),
                r.flag_count()
            ));
        }
    }

    check_flag_references(
        data_dir,
        flags_dir,
        &surveys,
        &features,
        &rules,
        &mut report,
    );

    let default_geoip = data_dir.join("GeoLite2-City.mmdb");
    let geoip_file = geoip_file.unwrap_or(&default_geoip);
    if geoip_file.exists() {
        match geoip::Database::open(geoip_file) {
            Ok(_) => report
                .notes
                .push(format!("{}: GeoIP City database", geoip_file.display())),
            Err(e) => report.errors.push(e.to_string()),
        }
    } else {
        report.notes.push(format!(
            "{}: absent, GeoIP will be off",
            geoip_file.display()
        ));
    }
    report
}

/// Load `surveys/*.json` and `early_access/*.json` as the server would, reporting every
/// file it would refuse (naming the survey or feature and the field).
fn check_surveys_and_features(
    data_dir: &Path,
    report: &mut CheckReport,
) -> (Catalog<ProjectSurveys>, Catalog<ProjectFeatures>) {
    let surveys_dir = data_dir.join("surveys");
    let (surveys, loaded) = Catalog::<ProjectSurveys>::load(&surveys_dir);
    report
        .errors
        .extend(loaded.errors.iter().map(|e| e.to_string()));
    for id in loaded.loaded {
        if let Some(p) = surveys.project(id) {
            let running = p.surveys().iter().filter(|s| s.active).count();
            let file = surveys_dir.join(format!("{id}.json"));
            let total = p.surveys().len();
            report.notes.push(format!(
                "{}: {total} surveys, {running} running",
                file.display()
            ));
        }
    }
    let features_dir = data_dir.join("early_access");
    let (features, loaded) = Catalog::<ProjectFeatures>::load(&features_dir);
    report
        .errors
        .extend(loaded.errors.iter().map(|e| e.to_string()));
    for id in loaded.loaded {
        let file = features_dir.join(format!("{id}.json"));
        let count = features.project(id).map_or(0, |f| f.len());
        report
            .notes
            .push(format!("{}: {count} early access features", file.display()));
    }
    (surveys, features)
}

/// Flags that surveys and early access features name must exist in the project's flag
/// file (or be generated from the survey): a survey whose flag is missing never shows.
fn check_flag_references(
    data_dir: &Path,
    flags_dir: &Path,
    surveys: &Catalog<ProjectSurveys>,
    features: &Catalog<ProjectFeatures>,
    rules: &Rules,
    report: &mut CheckReport,
) {
    let snapshot = rules.current();
    let keys = |id: i64| -> HashSet<String> {
        let mut keys = HashSet::new();
        let file = snapshot.project(id).map(|r| r.definitions_json());
        let file = file
            .and_then(|d| d["flags"].as_array())
            .into_iter()
            .flatten();
        let survey_flags = surveys.project(id);
        let generated = survey_flags.iter().flat_map(|p| p.flags());
        for flag in file.chain(generated) {
            if let Some(key) = flag.get("key").and_then(|k| k.as_str()) {
                keys.insert(key.to_owned());
            }
        }
        keys
    };
    let missing = |dir: &str, id: i64, what: String, field: &str, key: &str| {
        let file = data_dir.join(dir).join(format!("{id}.json"));
        let flags = flags_dir.join(format!("{id}.json"));
        let (file, flags) = (file.display(), flags.display());
        format!("{file}: {what}: {field}: no flag {key:?} in {flags}")
    };
    for (&id, project) in surveys.all().iter() {
        let known = keys(id);
        for s in project.surveys().iter().filter(|s| !s.archived) {
            let mut named = vec![("linked_flag_key", s.linked_flag_key.as_deref())];
            if !s.generates_targeting_flag {
                named.push(("targeting_flag_key", s.targeting_flag_key.as_deref()));
            }
            for (field, key) in named {
                if let Some(key) = key.filter(|k| !known.contains(*k)) {
                    let what = format!("survey {:?}", s.id);
                    report.errors.push(missing("surveys", id, what, field, key));
                }
            }
        }
    }
    for (&id, project) in features.all().iter() {
        let known = keys(id);
        for (feature, key) in project.flag_keys().filter(|(_, k)| !known.contains(*k)) {
            let what = format!("feature {feature:?}");
            report
                .errors
                .push(missing("early_access", id, what, "flagKey", key));
        }
    }
}

/// Why an export could not run or finish.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The database could not be opened (in use by a running server, or damaged).
    #[error("cannot open the database: {0}")]
    Open(String),
    #[error("cannot read the database: {0}")]
    Read(sled::Error),
    #[error("cannot write the export: {0}")]
    Write(std::io::Error),
}

/// Write every stored event as one JSON object per line (the read API's shape plus
/// `project_id`), project by project, each newest first as the read API lists them.
/// `progress(done, total)` is called as it goes.
pub fn export(
    db_dir: &Path,
    out: &mut impl Write,
    mut progress: impl FnMut(u64, u64),
) -> Result<u64, ExportError> {
    if !db_dir.join("conf").exists() {
        return Err(ExportError::Open(format!(
            "{} is not a flagpost database",
            db_dir.display()
        )));
    }
    let db =
        crate::store::check::open(db_dir, crate::config::DEFAULT_CACHE_BYTES).map_err(|e| {
            ExportError::Open(format!(
                "{e} (is a server still running on it? stop it first)"
            ))
        })?;
    let trees = Trees::open_to_read(&db, db_dir).map_err(|e| ExportError::Open(e.to_string()))?;
    let mut total = 0u64;
    let mut projects = Vec::new();
    for entry in trees.events.iter() {
        let (key, value) = entry.map_err(ExportError::Read)?;
        total += u64::from(block::count(&value).unwrap_or(0));
        if let Some((project, _)) = keys::split_block(&key) {
            if projects.last() != Some(&project) {
                projects.push(project);
            }
        }
    }
    let mut done = 0u64;
    progress(0, total);
    for project in projects {
        for entry in query::events(&trees, project, EventFilter::default(), None) {
            let (_, event) = entry.map_err(ExportError::Read)?;
            let mut line = event.to_api();
            line["project_id"] = Value::from(project);
            serde_json::to_writer(&mut *out, &line).map_err(|e| ExportError::Write(e.into()))?;
            out.write_all(b"\n").map_err(ExportError::Write)?;
            done += 1;
            progress(done, total.max(done));
        }
    }
    out.flush().map_err(ExportError::Write)?;
    Ok(done)
}
