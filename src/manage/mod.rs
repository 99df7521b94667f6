//! Managing flags and cohorts through PostHog's REST API shapes, with the project's
//! `flags/<id>.json` as the one source of truth: every change is read from the file,
//! checked as PostHog's serializer checks it (`validate`), written back whole and
//! atomically (`file`), and recorded in the activity log (`activity`). Writes to one
//! project are serialized by a lock per project; this module blocks on file I/O, so
//! callers run it on a blocking thread and then publish the file through the flag
//! reloader.
//!
//! A hand edit of the file keeps working, and is never overwritten unseen: the store
//! remembers a fingerprint of each flag and cohort as it last read, served or wrote
//! it, and refuses (409) to change one whose stored form has since changed until it has
//! been fetched again; the file as a whole must also still be the bytes read when the
//! change is written.
//!
//! `place` says at start-up when the flag files are where the service cannot write them.

mod activity;
mod cohorts;
mod error;
mod file;
mod limit;
pub mod place;
pub(crate) mod session;
mod shape;
mod synced;
mod validate;
mod values;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{json, Map, Value};

pub use activity::Query as ActivityQuery;
pub use error::Error;
use file::{flag_id, is_deleted, FlagFile};
pub use limit::FailedAuth;

/// Live flags one project may hold through the API: the whole file is compiled on every
/// change and every `/decide` evaluates every flag, so thousands would make both slow.
pub const MAX_FLAGS_PER_PROJECT: usize = 1000;

/// The management API's state: where the files are, the activity log, and per project
/// the lock that serializes its writes with what the store has seen of its file.
pub struct Store {
    flags_dir: PathBuf,
    log: activity::Log,
    /// One entry per project touched; each project's `Mutex` is held for a whole
    /// read-check-write, so two writes to one project never interleave.
    projects: Mutex<HashMap<u64, Arc<Mutex<Seen>>>>,
    /// Synced projects' definitions, shown instead of their files (see `synced`).
    synced: Mutex<HashMap<u64, Arc<Map<String, Value>>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Flag,
    Cohort,
}

/// Fingerprints of the flags and cohorts as last read, served or written.
#[derive(Default)]
struct Seen {
    known: Option<HashMap<(Kind, i64), [u8; 20]>>,
}

fn fingerprint(v: &Value) -> [u8; 20] {
    crate::support::watch::digest(&serde_json::to_vec(v).unwrap_or_default())
}

impl Seen {
    fn note(&mut self, kind: Kind, id: i64, v: &Value) {
        self.known
            .get_or_insert_with(HashMap::new)
            .insert((kind, id), fingerprint(v));
    }

    /// The first time a project's file is read, all of it counts as seen.
    fn first_read(&mut self, f: &FlagFile) {
        if self.known.is_some() {
            return;
        }
        for flag in f.flags() {
            if let Some(id) = flag_id(flag) {
                self.note(Kind::Flag, id, flag);
            }
        }
        for (id, c) in cohorts::all(f) {
            self.note(Kind::Cohort, id, &c);
        }
    }

    /// Refuses a change to something whose stored form this server has not seen.
    fn check(&self, kind: Kind, id: i64, v: &Value) -> Result<(), Error> {
        let known = self.known.as_ref().and_then(|k| k.get(&(kind, id)));
        if known == Some(&fingerprint(v)) {
            return Ok(());
        }
        let what = if kind == Kind::Flag {
            "feature flag"
        } else {
            "cohort"
        };
        Err(Error::Conflict(format!(
            "The {what} was changed in the flags file since this server last showed it. Please refresh and try again."
        )))
    }
}

/// A page of a list: how many match, and the page.
pub struct Page {
    pub count: usize,
    pub results: Vec<Value>,
}

/// `GET .../feature_flags/` filters, as PostHog's viewset reads them.
#[derive(Debug, Default)]
pub struct ListQuery {
    pub limit: usize,
    pub offset: usize,
    pub search: Option<String>,
    pub active: Option<bool>,
}

impl Store {
    pub fn new(flags_dir: PathBuf, db_dir: &Path) -> Store {
        Store {
            flags_dir,
            log: activity::Log::new(activity::dir(db_dir)),
            projects: Mutex::new(HashMap::new()),
            synced: Mutex::default(),
        }
    }

    /// Runs `f` holding the project's lock, with its file as read now.
    fn with<T>(
        &self,
        project: u64,
        f: impl FnOnce(&mut Seen, FlagFile) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let lock = crate::support::sync::lock(&self.projects)
            .entry(project)
            .or_default()
            .clone();
        // A panic mid-write leaves the file old or new (atomic rename) and at worst a
        // stale fingerprint, which only asks for a refresh.
        let mut seen = crate::support::sync::lock(&lock);
        let file = self.read_shown(project)?;
        seen.first_read(&file);
        f(&mut seen, file)
    }

    /// Checks the changed project compiles, then replaces the file, unless it changed
    /// on disk since it was read.
    fn commit(
        &self,
        project: u64,
        before: &FlagFile,
        after: &FlagFile,
        changed: Option<i64>,
    ) -> Result<(), Error> {
        validate::compiles(before, after, changed)?;
        let now = FlagFile::read(&self.flags_dir, project)?;
        if now.digest != before.digest {
            return Err(Error::Conflict(
                "The flags file was changed on disk while this change was being made. Please refresh and try again.".into(),
            ));
        }
        file::write_atomically(&self.flags_dir, project, &after.render())
    }

    fn api(f: &FlagFile, flag: &Value) -> Value {
        shape::to_api(flag, &|v| cohorts::name_of(f, v))
    }

    /// Live flags, newest first, filtered and paged as PostHog lists them.
    pub fn list(&self, project: u64, q: &ListQuery) -> Result<Page, Error> {
        self.with(project, |seen, f| {
            let search = q.search.as_deref().map(str::to_lowercase);
            let mut matching: Vec<&Value> = f
                .flags()
                .iter()
                .filter(|fl| !is_deleted(fl))
                .filter(|fl| {
                    q.active.is_none_or(|a| {
                        fl.get("active").and_then(Value::as_bool).unwrap_or(true) == a
                    })
                })
                .filter(|fl| {
                    search.as_deref().is_none_or(|s| {
                        ["key", "name"].iter().any(|k| {
                            fl.get(*k)
                                .and_then(Value::as_str)
                                .is_some_and(|v| v.to_lowercase().contains(s))
                        })
                    })
                })
                .collect();
            matching.sort_by_key(|fl| std::cmp::Reverse(flag_id(fl)));
            let count = matching.len();
            let page: Vec<&Value> = matching.into_iter().skip(q.offset).take(q.limit).collect();
            let mut results = Vec::with_capacity(page.len());
            for fl in page {
                if let Some(id) = flag_id(fl) {
                    seen.note(Kind::Flag, id, fl);
                }
                results.push(Store::api(&f, fl));
            }
            Ok(Page { count, results })
        })
    }

    pub fn get(&self, project: u64, id: i64) -> Result<Value, Error> {
        self.with(project, |seen, f| {
            let flag = f
                .position(id)
                .map(|p| &f.flags()[p])
                .ok_or(Error::NotFound)?;
            seen.note(Kind::Flag, id, flag);
            Ok(Store::api(&f, flag))
        })
    }

    /// `POST .../feature_flags/`: the new flag, in the API's shape.
    pub fn create(&self, project: u64, body: &Value, who: &str, now: &str) -> Result<Value, Error> {
        let body = object(body)?;
        self.with(project, |seen, mut f| {
            let before = f.clone();
            let key = validate::key(body.get("key"), &f, None)?;
            let live = f.flags().iter().filter(|fl| !is_deleted(fl)).count();
            if live >= MAX_FLAGS_PER_PROJECT {
                return Err(Error::TooMany(MAX_FLAGS_PER_PROJECT));
            }
            let id = f.next_id();
            let mut flag = Map::new();
            flag.insert("id".into(), json!(id));
            flag.insert("key".into(), json!(key));
            flag.insert("name".into(), json!(""));
            flag.insert("active".into(), json!(true));
            flag.insert("deleted".into(), json!(false));
            flag.insert("version".into(), json!(1));
            flag.insert("ensure_experience_continuity".into(), json!(false));
            shape::apply_simple_fields(&mut flag, body)?;
            flag.insert("deleted".into(), json!(false));
            let mut filters = new_filters(body.get("filters"))?;
            validate::filters(&mut filters, &key, None, &f)?;
            flag.insert("filters".into(), Value::Object(filters));
            flag.insert("created_at".into(), json!(now));
            flag.insert("created_by".into(), json!(who));
            flag.insert("updated_at".into(), json!(now));
            flag.insert("last_modified_by".into(), json!(who));
            let flag = Value::Object(flag);
            // PostHog frees a deleted flag's key for good when it is reused.
            let flags = f.flags_mut();
            flags.retain(|fl| !(is_deleted(fl) && fl.get("key") == flag.get("key")));
            flags.push(flag.clone());
            self.commit(project, &before, &f, Some(id))?;
            seen.note(Kind::Flag, id, &flag);
            let changes = vec![json!({"type": "FeatureFlag", "action": "created",
                "field": null, "before": null, "after": flag})];
            self.record(
                project,
                "FeatureFlag",
                "created",
                id,
                Some(&key),
                who,
                changes,
                now,
            );
            Ok(Store::api(&f, &flag))
        })
    }

    /// `PATCH .../feature_flags/{id}/` (`{"deleted": true}` deletes, as in PostHog).
    pub fn update(
        &self,
        project: u64,
        id: i64,
        body: &Value,
        who: &str,
        now: &str,
    ) -> Result<Value, Error> {
        let body = object(body)?;
        self.with(project, |seen, mut f| {
            let before = f.clone();
            let pos = f.position(id).ok_or(Error::NotFound)?;
            let current = f.flags()[pos].clone();
            seen.check(Kind::Flag, id, &current)?;
            let version = current.get("version").and_then(Value::as_i64).unwrap_or(0);
            check_version(&current, version, body)?;
            let mut flag = current.as_object().cloned().unwrap_or_default();
            shape::apply_simple_fields(&mut flag, body)?;
            let mut key = flag
                .get("key")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            let undeleting = is_deleted(&current) && !is_deleted(&Value::Object(flag.clone()));
            if body.contains_key("key") || undeleting {
                key = validate::key(body.get("key").or(flag.get("key")), &f, Some(id))?;
                flag.insert("key".into(), json!(key));
            }
            match body.get("filters") {
                None => {}
                Some(Value::Object(new)) if !new.contains_key("groups") => {}
                Some(Value::Object(new)) => {
                    let mut new = new.clone();
                    validate::filters(&mut new, &key, Some(id), &f)?;
                    flag.insert("filters".into(), Value::Object(new));
                }
                Some(other) => return Err(not_a_dict(other)),
            }
            let deleting = !is_deleted(&current) && is_deleted(&Value::Object(flag.clone()));
            if deleting {
                refuse_if_depended_on(&f, id)?;
            }
            flag.insert("version".into(), json!(version + 1));
            flag.insert("updated_at".into(), json!(now));
            flag.insert("last_modified_by".into(), json!(who));
            let flag = Value::Object(flag);
            f.flags_mut()[pos] = flag.clone();
            self.commit(project, &before, &f, Some(id))?;
            seen.note(Kind::Flag, id, &flag);
            let changes = shape::changes("FeatureFlag", &current, &flag);
            self.record(
                project,
                "FeatureFlag",
                "updated",
                id,
                Some(&key),
                who,
                changes,
                now,
            );
            Ok(Store::api(&f, &flag))
        })
    }

    /// Activity entries of one flag (or all flags), newest first, and their number.
    pub fn activity(&self, project: u64, q: &ActivityQuery) -> Result<(usize, Vec<Value>), Error> {
        self.log.read(project, q)
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        project: u64,
        scope: &'static str,
        activity: &'static str,
        item_id: i64,
        name: Option<&str>,
        label: &str,
        changes: Vec<Value>,
        at: &str,
    ) {
        let entry = activity::Entry {
            scope,
            activity,
            item_id,
            name,
            label,
            changes,
            at,
        };
        // The change is already in the file; a log that cannot be written must not
        // make the client retry it, so the failure is logged and the change stands.
        if let Err(e) = self.log.append(project, entry) {
            tracing::error!(project, error = %e, "activity log entry not written");
        }
    }
}

fn object(body: &Value) -> Result<&Map<String, Value>, Error> {
    body.as_object().ok_or_else(|| {
        let kind = match body {
            Value::Array(_) => "list",
            Value::String(_) => "str",
            Value::Number(_) => "int",
            Value::Bool(_) => "bool",
            _ => "NoneType",
        };
        Error::invalid(
            "invalid_input",
            format!("Invalid data. Expected a dictionary, but got {kind}."),
        )
    })
}

fn not_a_dict(v: &Value) -> Error {
    let kind = if v.is_array() { "list" } else { "str" };
    Error::invalid(
        "not_a_dict",
        format!("Expected a dictionary of items but got type \"{kind}\"."),
    )
    .at("filters")
}

/// A new flag's filters: as sent, with PostHog's one group of everyone when the body
/// has none (what its API shows for a flag created without filters).
fn new_filters(v: Option<&Value>) -> Result<Map<String, Value>, Error> {
    let mut filters = match v {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => return Err(not_a_dict(other)),
    };
    if !filters.contains_key("groups") {
        filters.insert(
            "groups".into(),
            json!([{"properties": [], "rollout_percentage": null}]),
        );
    }
    Ok(filters)
}

/// PostHog's version check: a `version` other than the stored one is stale. PostHog
/// then refuses only when `original_flag` shows the client changing a field someone
/// else changed; without `original_flag` it would overwrite, which here is refused too,
/// so a stale write is never merged silently.
fn check_version(current: &Value, version: i64, body: &Map<String, Value>) -> Result<(), Error> {
    let sent = match body.get("version") {
        None | Some(Value::Null) => return Ok(()),
        Some(v) => v.as_i64().ok_or_else(|| {
            Error::invalid("invalid_input", "A valid integer is required.").at("version")
        })?,
    };
    if sent == -1 || sent == version {
        return Ok(());
    }
    let conflicting = match body.get("original_flag").and_then(Value::as_object) {
        Some(original) if !original.is_empty() => body.iter().any(|(field, new)| {
            let (Some(orig), now) = (original.get(field), current.get(field)) else {
                return false;
            };
            new != orig && Some(orig) != now && Some(new) != now
        }),
        _ => true,
    };
    if !conflicting {
        return Ok(());
    }
    let by = current
        .get("last_modified_by")
        .and_then(Value::as_str)
        .unwrap_or("another user");
    Err(Error::Conflict(format!(
        "The feature flag was updated by {by} since you started editing it. Please refresh and try again."
    )))
}

/// PostHog refuses to delete a flag that active flags depend on, naming up to five.
fn refuse_if_depended_on(f: &FlagFile, id: i64) -> Result<(), Error> {
    let mut dependents: Vec<(String, i64)> = f
        .flags()
        .iter()
        .filter(|fl| !is_deleted(fl) && fl.get("active").and_then(Value::as_bool) != Some(false))
        .filter(|fl| flag_id(fl) != Some(id))
        .filter(|fl| validate::flag_references(fl).contains(&id))
        .filter_map(|fl| {
            let key = fl.get("key").and_then(Value::as_str)?.to_owned();
            Some((key, flag_id(fl)?))
        })
        .collect();
    if dependents.is_empty() {
        return Ok(());
    }
    dependents.sort();
    let mut names: Vec<String> = dependents
        .iter()
        .take(5)
        .map(|(k, i)| format!("{k} (ID: {i})"))
        .collect();
    if dependents.len() > 5 {
        names.push(format!("and {} more", dependents.len() - 5));
    }
    Err(Error::invalid(
        "invalid_input",
        format!(
            "Cannot delete this feature flag because other flags depend on it: {}. Please update or delete the dependent flags first.",
            names.join(", ")
        ),
    ))
}
