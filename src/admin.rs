//! Operator commands that work on files rather than a running server: `check`
//! validates a data dir before it is deployed, `export` writes every stored event of a
//! stopped server's database as NDJSON.

use std::io::Write;
use std::path::Path;

use serde_json::Value;

use crate::flags::Rules;
use crate::geoip;
use crate::projects::Projects;
use crate::store::query::{self, EventFilter};
use crate::store::{block, keys, Trees};

/// What `check` found: problems that must be fixed, and notes worth reading.
#[derive(Debug, Default)]
pub struct CheckReport {
    pub errors: Vec<String>,
    pub notes: Vec<String>,
}

/// Validate a data dir: `projects.json`, every `flags/*.json` (naming the flag and
/// field at fault), and the GeoIP database if there is one.
pub fn check(data_dir: &Path, geoip_file: Option<&Path>) -> CheckReport {
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

    let flags_dir = data_dir.join("flags");
    let (rules, loaded) = Rules::load(&flags_dir);
    report
        .errors
        .extend(loaded.errors.iter().map(|e| e.to_string()));
    report.notes.extend(
        loaded
            .warnings
            .iter()
            .map(|w| format!("flag disabled: {w}")),
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
            report.notes.push(format!(
                "{}/{id}.json: {} flags",
                flags_dir.display(),
                r.flag_count()
            ));
        }
    }

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

/// Why an export could not run or finish.
#[derive(Debug)]
pub enum ExportError {
    /// The database could not be opened (in use by a running server, or damaged).
    Open(String),
    Read(sled::Error),
    Write(std::io::Error),
}

impl std::fmt::Display for ExportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExportError::Open(e) => write!(f, "cannot open the database: {e}"),
            ExportError::Read(e) => write!(f, "cannot read the database: {e}"),
            ExportError::Write(e) => write!(f, "cannot write the export: {e}"),
        }
    }
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
    let db = sled::Config::new().path(db_dir).open().map_err(|e| {
        ExportError::Open(format!(
            "{e} (is a server still running on it? stop it first)"
        ))
    })?;
    let trees = Trees::open(&db).map_err(|e| ExportError::Open(e.to_string()))?;
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
