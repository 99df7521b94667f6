//! `flagpost eval`: what one user gets from every flag of a project, and why, computed
//! the way `/decide` computes it (the same compiled rules, survey targeting flags
//! included, and the same evaluation), from the data dir's files and the properties
//! given on the command line, plus, when a stopped server's database is named, the
//! person's and groups' stored properties.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{Map, Value};

use crate::flags::{Context, Evaluation, Rules};
use crate::projects::catalog::Catalog;
use crate::projects::surveys::ProjectSurveys;
use crate::store::{query, Trees};

/// Who is asking, as a `/decide` request would say it.
#[derive(Debug, Default)]
pub struct Request {
    pub project: u64,
    pub distinct_id: String,
    /// Person properties; they win over stored ones key by key, as in `/decide`.
    pub person_properties: Map<String, Value>,
    /// Group type name to group key.
    pub groups: Map<String, Value>,
    /// Group type name to properties; they win over stored ones key by key.
    pub group_properties: HashMap<String, Map<String, Value>>,
}

/// Why an evaluation could not run.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// The project's flag file (or a survey file it depends on) does not compile.
    #[error("{0}")]
    Rules(String),
    /// The project has no flag file.
    #[error("{}: no such flag file", .0.display())]
    NoFlags(std::path::PathBuf),
    /// The database could not be opened or read.
    #[error("{0}")]
    Database(String),
}

/// What was stored about the person and the request's groups.
#[derive(Debug, Default)]
struct Stored {
    person: Map<String, Value>,
    first_distinct_id: Option<String>,
    groups: HashMap<String, Map<String, Value>>,
}

/// Evaluate every flag of `req.project` for the request. With `db_dir`, the stored
/// properties of the person and the groups come first, as `/decide` layers them.
pub fn eval(
    data_dir: &Path,
    flags_dir: &Path,
    db_dir: Option<&Path>,
    req: &Request,
) -> Result<Evaluation, EvalError> {
    let (surveys, _) = Catalog::<ProjectSurveys>::load(&data_dir.join("surveys"));
    let rules = Rules::new();
    rules.set_generated(crate::projects::surveys::generated(&surveys));
    let report = rules.reload(flags_dir);
    let id = i64::try_from(req.project).unwrap_or(i64::MAX);
    let file = flags_dir.join(format!("{id}.json"));
    let ours = |e: &&crate::flags::CompileError| e.file().is_none_or(|f| f == file);
    if let Some(error) = report.errors.iter().find(ours) {
        return Err(EvalError::Rules(error.to_string()));
    }
    let snapshot = rules.current();
    let rules = snapshot.project(id).ok_or(EvalError::NoFlags(file))?;
    let stored = match db_dir {
        Some(dir) => stored(dir, req)?,
        None => Stored::default(),
    };
    let mut person = stored.person;
    person.extend(req.person_properties.clone());
    let mut group_properties = HashMap::new();
    for kind in req.groups.keys() {
        let mut properties = stored.groups.get(kind).cloned().unwrap_or_default();
        properties.extend(req.group_properties.get(kind).cloned().unwrap_or_default());
        group_properties.insert(kind.clone(), Some(properties));
    }
    let hash_key = stored
        .first_distinct_id
        .filter(|first| *first != req.distinct_id);
    let ctx = Context {
        distinct_id: &req.distinct_id,
        anon_distinct_id: None,
        hash_key_override: hash_key.as_deref(),
        person_properties: Some(&person),
        groups: &req.groups,
        group_properties: &group_properties,
        now: crate::flags::now(),
    };
    Ok(rules.evaluate(&ctx))
}

/// The stored person and groups, from a database no server is using.
fn stored(db_dir: &Path, req: &Request) -> Result<Stored, EvalError> {
    if !db_dir.join("conf").exists() {
        let shown = db_dir.display();
        return Err(EvalError::Database(format!(
            "{shown} is not a flagpost database"
        )));
    }
    let db = crate::store::check::open(db_dir, crate::config::DEFAULT_CACHE_BYTES).map_err(|e| {
        EvalError::Database(format!(
            "cannot open the database {}: {e} (is a server still running on it? stop it, or leave out --db)",
            db_dir.display()
        ))
    })?;
    let trees = Trees::open_to_read(&db, db_dir).map_err(|e| EvalError::Database(e.to_string()))?;
    let read = |e: sled::Error| EvalError::Database(format!("cannot read the database: {e}"));
    let mut out = Stored::default();
    if let Some(id) = query::person_id_of(&trees, req.project, &req.distinct_id).map_err(read)? {
        if let Some(person) = query::person(&trees, req.project, id).map_err(read)? {
            out.person = person.properties;
            out.first_distinct_id = Some(person.first_distinct_id);
        }
    }
    for (kind, key) in &req.groups {
        let key = match key {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let Some(index) = query::group_type_index(&trees, req.project, kind).map_err(read)? else {
            continue;
        };
        if let Some(group) = query::group(&trees, req.project, index, &key).map_err(read)? {
            out.groups.insert(kind.clone(), group.properties);
        }
    }
    Ok(out)
}

/// One line per flag, in definition order: its key, the value clients see, PostHog's
/// reason code and description; then the flags that could not be computed.
pub fn render(evaluation: &Evaluation) -> String {
    let keys = evaluation.flags.iter().map(|f| f.key.len());
    let width = keys
        .chain(evaluation.failed.iter().map(|f| f.key.len()))
        .max()
        .unwrap_or(0);
    let values: Vec<String> = evaluation
        .flags
        .iter()
        .map(|f| f.value().to_string())
        .collect();
    let value_width = values.iter().map(String::len).max().unwrap_or(0).max(1);
    let mut out = String::new();
    for (flag, value) in evaluation.flags.iter().zip(&values) {
        let reason = &flag.reason;
        out.push_str(&format!(
            "{:width$}  {value:value_width$}  {} ({})\n",
            flag.key, reason.code, reason.description
        ));
    }
    for failed in &evaluation.failed {
        out.push_str(&format!(
            "{:width$}  {:value_width$}  not computed: {}\n",
            failed.key, "-", failed.cause
        ));
    }
    out
}
