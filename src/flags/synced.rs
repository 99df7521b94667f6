//! Rules a project takes from an upstream instead of from its flag file (edge mode's
//! flag sync): the sync hands over upstream's definitions body, compiled here with the
//! same compiler as a file (and the project's surveys' targeting flags appended, as for
//! a file), and every published [`super::Snapshot`] lays these over what the files gave.
//! A synced project never falls back to its file: until the first answer it has no
//! rules (or, when it gained its upstream key while serving, the rules it served
//! then), and while upstream says its quota is used up it has none either and is
//! marked so that `/decide` and `/flags` can answer as upstream does.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::Value;

use super::compile::ProjectRules;
use super::error::CompileError;

/// Flag definitions, in the file format, generated for each project from other files and
/// appended to its own (see `flags::generated`).
pub type Generated = HashMap<i64, Vec<Value>>;

/// What a synced project serves.
#[derive(Clone)]
pub(super) enum State {
    /// No answer from upstream yet (and none on disk): the rules it served before
    /// the sync began, if it began while serving, else none.
    Waiting { kept: Option<Arc<ProjectRules>> },
    /// Upstream's last good definitions, compiled.
    Serving {
        body: Arc<[u8]>,
        rules: Arc<ProjectRules>,
        /// The generated flags they were compiled with.
        extra: Vec<Value>,
    },
    /// Upstream answered 402: no rules, and flags answer `quota_limited`.
    QuotaLimited,
}

/// The synced projects by id.
pub(super) type Overlay = HashMap<i64, State>;

/// Compile upstream's definitions with the project's generated flags appended.
pub(super) fn compile(body: &[u8], extra: &[Value]) -> Result<ProjectRules, CompileError> {
    if extra.is_empty() {
        ProjectRules::compile(body)
    } else {
        super::generated::compile(Some(body), extra)
    }
}

/// Lay the synced projects over `projects` (what the files gave), recompiling a synced
/// body whose generated flags changed since it was compiled (on failure it keeps the
/// rules it had). Returns the quota-limited projects.
pub(super) fn apply(
    overlay: &mut Overlay,
    projects: &mut HashMap<i64, Arc<ProjectRules>>,
    generated: &Generated,
) -> HashSet<i64> {
    let mut quota_limited = HashSet::new();
    for (&id, state) in overlay.iter_mut() {
        match state {
            State::Waiting { kept: Some(rules) } => {
                projects.insert(id, Arc::clone(rules));
            }
            State::Waiting { kept: None } => {
                projects.remove(&id);
            }
            State::QuotaLimited => {
                projects.remove(&id);
                quota_limited.insert(id);
            }
            State::Serving { body, rules, extra } => {
                let wanted = generated.get(&id).map_or(&[][..], Vec::as_slice);
                if extra.as_slice() != wanted {
                    match compile(body, wanted) {
                        Ok(fresh) => {
                            *rules = Arc::new(fresh);
                            *extra = wanted.to_vec();
                        }
                        Err(error) => {
                            tracing::warn!(project = id, %error, "synced flags with the surveys' flags not compiled; previous rules kept");
                        }
                    }
                }
                projects.insert(id, Arc::clone(rules));
            }
        }
    }
    quota_limited
}

impl super::Rules {
    /// The generated flags (surveys' targeting flags) of every project, as last handed
    /// over.
    fn generated(&self) -> Arc<Generated> {
        let mut seen = Arc::default();
        self.files.update(|current| {
            seen = Arc::clone(current);
            false
        });
        seen
    }

    /// Publish the current rules with `id`'s synced state set to `state`.
    fn set_synced(&self, id: i64, state: State) -> u64 {
        let generated = self.generated();
        let mut overlay = crate::support::sync::lock(&self.synced);
        overlay.insert(id, state);
        let projects = self.current.load().projects.clone();
        self.publish(&mut overlay, projects, &generated).0
    }

    /// Take `id`'s rules from upstream from now on: its file is ignored, and until
    /// [`super::Rules::sync_install`] it has no rules, or with `keep` the rules it has
    /// now (a project that gains its upstream key while the server runs keeps serving
    /// its file's flags until upstream answers). Nothing happens if it already is.
    pub fn sync_begin(&self, id: i64, keep: bool) {
        if !crate::support::sync::lock(&self.synced).contains_key(&id) {
            let kept = keep.then(|| self.current.load().project(id).cloned());
            let kept = kept.flatten();
            self.set_synced(id, State::Waiting { kept });
        }
    }

    /// Compile upstream's definitions for `id` and publish them; the version published.
    /// A body that does not compile changes nothing (the last good rules stay).
    pub fn sync_install(&self, id: i64, body: &[u8]) -> Result<u64, CompileError> {
        let generated = self.generated();
        let extra = generated.get(&id).cloned().unwrap_or_default();
        let rules = compile(body, &extra)?;
        Ok(self.set_synced(
            id,
            State::Serving {
                body: body.into(),
                rules: Arc::new(rules),
                extra,
            },
        ))
    }

    /// Upstream answered 402: `id` has no rules and its flags answer `quota_limited`.
    pub fn sync_quota_limited(&self, id: i64) {
        self.set_synced(id, State::QuotaLimited);
    }

    /// Stop taking `id`'s rules from upstream; the next reload of the files gives it
    /// its file's rules again (the caller reloads).
    pub fn sync_end(&self, id: i64) {
        let generated = self.generated();
        let mut overlay = crate::support::sync::lock(&self.synced);
        if overlay.remove(&id).is_some() {
            let mut projects = self.current.load().projects.clone();
            projects.remove(&id);
            self.publish(&mut overlay, projects, &generated);
        }
        drop(overlay);
        // The file was skipped while synced: make the next check read it again.
        self.files.update(|_| true);
    }

    /// The projects whose rules come from upstream.
    pub fn synced_projects(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = crate::support::sync::lock(&self.synced)
            .keys()
            .copied()
            .collect();
        ids.sort_unstable();
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::super::Rules;
    use serde_json::json;

    fn flags(key: &str) -> String {
        json!({"flags": [{"id": 1, "key": key, "active": true,
            "filters": {"groups": [{"properties": [], "rollout_percentage": 100}]}}],
            "group_type_mapping": {}, "cohorts": {}})
        .to_string()
    }

    fn key_of(rules: &Rules, id: i64) -> Option<String> {
        let snapshot = rules.current();
        let r = snapshot.project(id)?;
        r.definitions_json()["flags"][0]["key"]
            .as_str()
            .map(str::to_string)
    }

    #[test]
    fn synced_rules_replace_the_file_through_reloads_until_the_sync_ends() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("1.json"), flags("from-file")).unwrap();
        std::fs::write(dir.path().join("2.json"), flags("other")).unwrap();
        let (rules, _) = Rules::load(dir.path());
        assert_eq!(key_of(&rules, 1).as_deref(), Some("from-file"));

        // Synced, nothing from upstream yet: no rules, and a reload keeps it so.
        rules.sync_begin(1, false);
        assert_eq!(key_of(&rules, 1), None);
        rules.reload(dir.path());
        assert_eq!(key_of(&rules, 1), None);
        assert_eq!(key_of(&rules, 2).as_deref(), Some("other"));

        let before = rules.current().version();
        let version = rules
            .sync_install(1, flags("from-upstream").as_bytes())
            .unwrap();
        assert!(version > before);
        assert_eq!(key_of(&rules, 1).as_deref(), Some("from-upstream"));
        // A file change reloads the files; the synced rules stay.
        std::fs::write(dir.path().join("1.json"), flags("edited-file")).unwrap();
        rules.reload(dir.path());
        assert_eq!(key_of(&rules, 1).as_deref(), Some("from-upstream"));
        assert_eq!(rules.synced_projects(), vec![1]);

        // A body that does not compile changes nothing.
        assert!(rules.sync_install(1, b"{\"flags\": 3}").is_err());
        assert_eq!(key_of(&rules, 1).as_deref(), Some("from-upstream"));

        rules.sync_quota_limited(1);
        assert_eq!(key_of(&rules, 1), None);
        assert!(rules.current().quota_limited(1));
        assert!(!rules.current().quota_limited(2));

        // The sync ends: the file serves again at the next check.
        rules.sync_end(1);
        assert!(rules.reload_if_changed(dir.path()).is_some());
        assert_eq!(key_of(&rules, 1).as_deref(), Some("edited-file"));
        assert!(!rules.current().quota_limited(1));
        assert!(rules.synced_projects().is_empty());
    }

    #[test]
    fn a_sync_begun_while_serving_keeps_the_files_rules_until_upstream_answers() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("1.json"), flags("from-file")).unwrap();
        let (rules, _) = Rules::load(dir.path());
        rules.sync_begin(1, true);
        assert_eq!(rules.synced_projects(), vec![1]);
        assert_eq!(key_of(&rules, 1).as_deref(), Some("from-file"));
        // What it served, not the file as it is now: the file no longer counts.
        std::fs::write(dir.path().join("1.json"), flags("edited-file")).unwrap();
        rules.reload(dir.path());
        assert_eq!(key_of(&rules, 1).as_deref(), Some("from-file"));
        rules
            .sync_install(1, flags("from-upstream").as_bytes())
            .unwrap();
        assert_eq!(key_of(&rules, 1).as_deref(), Some("from-upstream"));
    }
}
