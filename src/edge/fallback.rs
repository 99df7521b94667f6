//! What `/decide` and `/flags` at the edge ask upstream: the flags the edge cannot
//! decide ([`crate::flags::ProjectRules::inconclusive`]), the requested keys its rules
//! lack, and for a request that asks for every flag (posthog-js's) the flags upstream
//! answers but its definitions feed leaves out (remote-config and survey-targeting
//! flags), all in one `POST /flags/?v=2` with `flag_keys`, the caller's original body
//! and address, within the budget. Upstream's answer wins for those keys, as
//! posthog-node merges `{...local, ...remote}`; without an answer the local one stands
//! for the rest and `errorsWhileComputingFlags` is set.
//!
//! The feed-excluded keys are learned from upstream: the first request for every flag
//! after the rules change (or after [`RELEARN_AFTER`]) goes upstream without
//! `flag_keys`, and what upstream answers beyond the rules is remembered.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request};
use serde_json::{Map, Value};

use super::client::Client;
use super::stats::Stats;
use crate::flags::{Context, Outcomes, ProjectRules};

/// How long the learned feed-excluded keys are trusted: a survey created upstream adds
/// a targeting flag without changing the feed, so the list is asked for again now and then.
pub const RELEARN_AFTER: Duration = Duration::from_secs(60);
/// An upstream `/flags` answer larger than this is not a flags answer.
const MAX_FLAGS_ANSWER_BYTES: usize = 8 * 1024 * 1024;
/// The `endpoint` label of `flagpost_upstream_requests_total` for these calls.
const ENDPOINT: &str = "flags";

/// What one request asks upstream.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The keys sent as `flag_keys`, whose upstream answer wins.
    pub keys: Vec<String>,
    /// Ask for every flag (no `flag_keys`), to learn the keys the feed leaves out.
    pub learn: bool,
}

impl Plan {
    pub fn needed(&self) -> bool {
        self.learn || !self.keys.is_empty()
    }
}

/// The feed-excluded keys learned per project, for the rules they were learned against.
#[derive(Debug, Default)]
pub struct Learned {
    projects: Mutex<HashMap<u64, Excluded>>,
}

#[derive(Debug)]
struct Excluded {
    /// The rules compared against (by address: a new snapshot is new rules).
    rules: usize,
    at: Instant,
    keys: Vec<String>,
}

impl Learned {
    /// The excluded keys known for `project` under `rules`, or `None` when they must be
    /// learned (again).
    fn known(&self, project: u64, rules: &Arc<ProjectRules>) -> Option<Vec<String>> {
        let projects = self.projects.lock().unwrap_or_else(|e| e.into_inner());
        let known = projects.get(&project)?;
        let fresh =
            known.rules == Arc::as_ptr(rules) as usize && known.at.elapsed() < RELEARN_AFTER;
        fresh.then(|| known.keys.clone())
    }

    /// Remember what upstream answered beyond `rules` for a request for every flag.
    pub fn learn(&self, project: u64, rules: &Arc<ProjectRules>, answer: &Flags) {
        let keys = answer
            .flags
            .keys()
            .filter(|k| rules.index_of(k).is_none())
            .cloned()
            .collect();
        let excluded = Excluded {
            rules: Arc::as_ptr(rules) as usize,
            at: Instant::now(),
            keys,
        };
        let mut projects = self.projects.lock().unwrap_or_else(|e| e.into_inner());
        projects.insert(project, excluded);
    }
}

/// Decide what to ask upstream, and leave those flags out of `outcomes` (already
/// narrowed to `requested` by [`Outcomes::retain_keys`]) so that without upstream they
/// are absent.
pub fn plan(
    project: u64,
    rules: &Arc<ProjectRules>,
    ctx: &Context<'_>,
    outcomes: &mut Outcomes<'_>,
    requested: Option<&[String]>,
    learned: &Learned,
) -> Plan {
    let inconclusive = rules.inconclusive(ctx, outcomes);
    let answered = |key: &str| requested.is_none_or(|keys| keys.iter().any(|k| k == key));
    let mut keys: Vec<String> = Vec::new();
    // Most requests at an edge have every flag decided here.
    if inconclusive.contains(&true) {
        keys = (rules.keys().zip(&inconclusive))
            .filter(|(key, out)| **out && answered(key))
            .map(|(key, _)| key.to_owned())
            .collect();
        outcomes.leave_out(&inconclusive);
    }
    let mut learn = false;
    match requested {
        // (`outcomes` was narrowed to `requested`, which told it whether any is unknown.)
        Some(requested) if outcomes.names_unknown_keys() => {
            for key in requested {
                if rules.index_of(key).is_none() && !keys.contains(key) {
                    keys.push(key.clone());
                }
            }
        }
        Some(_) => {}
        None => match learned.known(project, rules) {
            Some(excluded) => keys.extend(excluded),
            None => learn = true,
        },
    }
    Plan { keys, learn }
}

/// Upstream's v2 (`flags`-shaped) answer: each flag's detail object by key.
#[derive(Debug, Default)]
pub struct Flags {
    pub flags: Map<String, Value>,
    pub errors: bool,
    /// Upstream's `quotaLimited` when it names `feature_flags`: the project is over its
    /// flag quota, and PostHog then answers no flag at all.
    pub quota_limited: Option<Value>,
}

/// What PostHog's flags service puts in `quotaLimited` for a project over its flag
/// quota (`billing::check_limits`: `ServiceName::FeatureFlags`).
pub const FEATURE_FLAGS_QUOTA: &str = "feature_flags";

/// Ask upstream `/flags/?v=2` for `plan`'s keys with the caller's `body` (its JSON,
/// decoded) and address; `None` when no usable answer came within `budget`.
pub async fn ask(
    client: &Client,
    stats: &Stats,
    budget: Duration,
    body: &[u8],
    plan: &Plan,
    caller: IpAddr,
) -> Option<Flags> {
    let mut fields: Map<String, Value> = serde_json::from_slice(body).ok()?;
    fields.remove("flag_keys_to_evaluate");
    fields.remove("flag_keys");
    if !plan.learn {
        let keys = plan.keys.iter().cloned().map(Value::String).collect();
        fields.insert("flag_keys".into(), Value::Array(keys));
    }
    let body = serde_json::to_vec(&fields).ok()?;
    let request = Request::builder()
        .method(Method::POST)
        .uri("/flags/?v=2")
        .header(CONTENT_TYPE, "application/json")
        .header("x-forwarded-for", caller.to_string())
        .body(Full::new(Bytes::from(body)))
        .ok()?;
    let answer = match client.send(request, budget, MAX_FLAGS_ANSWER_BYTES).await {
        Ok(answer) => answer,
        Err(e) => {
            stats.answered(ENDPOINT, e.label());
            tracing::warn!(error = %e, "upstream /flags failed; answering locally");
            return None;
        }
    };
    stats.answered(ENDPOINT, answer.status.as_str());
    if !answer.status.is_success() {
        tracing::warn!(status = %answer.status, "upstream /flags refused; answering locally");
        return None;
    }
    let parsed = read_answer(&answer.body);
    if parsed.is_none() {
        tracing::warn!("upstream /flags answer is not a v2 flags answer; answering locally");
    }
    parsed
}

fn read_answer(body: &[u8]) -> Option<Flags> {
    let mut answer: Map<String, Value> = serde_json::from_slice(body).ok()?;
    let Some(Value::Object(flags)) = answer.remove("flags") else {
        return None;
    };
    // Each detail must at least say whether it is on.
    if flags
        .values()
        .any(|d| !matches!(d.get("enabled"), Some(Value::Bool(_))))
    {
        return None;
    }
    let errors = answer.get("errorsWhileComputingFlags") == Some(&Value::Bool(true));
    let quota_limited = answer.remove("quotaLimited").filter(|limited| {
        limited
            .as_array()
            .is_some_and(|l| l.iter().any(|r| r == FEATURE_FLAGS_QUOTA))
    });
    Some(Flags {
        flags,
        errors,
        quota_limited,
    })
}
