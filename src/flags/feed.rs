//! The definitions feed as server-side SDKs read it for local evaluation, built as
//! PostHog serves it: flag filters that name another flag get that flag's key and a
//! `dependency_chain` (see [`super::dependency_chain`]), remote config flags are left
//! out, and the body carries an ETag. Each project's body is built once per published
//! rules and kept until the rules change, so a poller's request copies bytes only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};
use sha1::{Digest, Sha1};

use super::ProjectRules;

/// Feed bodies by project and `send_cohorts`, with the rules they were built from.
#[derive(Default)]
pub struct Cache(Mutex<HashMap<(u64, bool), Built>>);

/// One project's feed body and its ETag.
#[derive(Clone)]
pub struct Built {
    rules: Option<Arc<ProjectRules>>,
    pub body: bytes::Bytes,
    pub etag: Arc<str>,
}

impl Cache {
    /// The body for `project` built from `rules` (its current rules, or none), from the
    /// cache while those rules are the ones it was built from.
    pub fn get(&self, project: u64, rules: Option<Arc<ProjectRules>>, send_cohorts: bool) -> Built {
        let key = (project, send_cohorts);
        // Entries are whole bodies, each inserted in one call: a panic elsewhere
        // cannot leave the map holding half of one, so a poisoned lock is carried on.
        let cached = crate::support::sync::lock(&self.0).get(&key).cloned();
        match cached {
            Some(b) if same(&b.rules, &rules) => b,
            _ => {
                let b = build(rules, send_cohorts);
                crate::support::sync::lock(&self.0).insert(key, b.clone());
                b
            }
        }
    }
}

fn same(a: &Option<Arc<ProjectRules>>, b: &Option<Arc<ProjectRules>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// The members of PostHog's local-evaluation feed.
const FEED_MEMBERS: [&str; 3] = ["flags", "group_type_mapping", "cohorts"];

/// What the management API records on a flag for people (who changed it, when), which
/// PostHog's feed does not carry.
const BOOKKEEPING: [&str; 4] = ["created_at", "created_by", "updated_at", "last_modified_by"];

fn build(rules: Option<Arc<ProjectRules>>, send_cohorts: bool) -> Built {
    let mut body = match &rules {
        Some(r) => r.definitions_json().clone(),
        None => serde_json::json!({"flags": [], "group_type_mapping": {}, "cohorts": {}}),
    };
    if let Some(obj) = body.as_object_mut() {
        // PostHog's feed has these three members; the file may hold more (the
        // management API's `cohort_details`), which are no SDK's business.
        obj.retain(|k, _| FEED_MEMBERS.contains(&k.as_str()));
        if let Some(Value::Array(flags)) = obj.get_mut("flags") {
            // Deleted flags stay in a file the management API writes; PostHog's feed
            // leaves them out, as it does remote config flags.
            flags.retain(|f| {
                f.get("is_remote_configuration") != Some(&Value::Bool(true))
                    && f.get("deleted") != Some(&Value::Bool(true))
            });
            for flag in flags.iter_mut().filter_map(Value::as_object_mut) {
                flag.retain(|k, _| !BOOKKEEPING.contains(&k.as_str()));
            }
            super::dependency_chain::add(flags);
        }
        if !send_cohorts {
            obj.insert("cohorts".into(), Value::Object(Map::new()));
        }
    }
    let body = serde_json::to_vec(&body).unwrap_or_default();
    let digest = Sha1::digest(&body);
    let hex: String = digest[..10].iter().map(|b| format!("{b:02x}")).collect();
    Built {
        rules,
        body: body.into(),
        etag: format!("\"{hex}\"").into(),
    }
}
