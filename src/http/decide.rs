//! Feature flags for clients: `/decide` (versions 1-4) and `/flags` (the v4 shape),
//! evaluated from the published rules snapshot with the person's and groups' stored
//! properties. Every answer ends with the project's client config
//! (`remote_config::decide_tail`).

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::header::{CONTENT_ENCODING, CONTENT_TYPE};
use hyper::{HeaderMap, Request, Response, StatusCode};
use serde_json::{Map, Value};

use super::body;
use super::decode::{self, Query};
use super::project_key::project_of;
// The refusals live with the one mapping of errors to statuses (`error`); here they
// keep this module's name for them.
use super::error::{ApiError, DecideError as Error};
use super::response::{self, Body};
use crate::app::App;
use crate::capture::tape::Value as TapeValue;
use crate::capture::{self, clean_distinct_id};
use crate::flags::{self, Context};
use crate::projects::Project;
use crate::support::memory::Reservation;

/// Decide bodies are small; anything near this is not a decide request.
const MAX_DECIDE_BODY_BYTES: usize = 1024 * 1024;

/// What a decide request asks about.
#[derive(Debug, Default)]
pub struct DecideRequest {
    pub key: String,
    pub distinct_id: String,
    pub anon_distinct_id: Option<String>,
    pub groups: Map<String, Value>,
    pub person_properties: Map<String, Value>,
    pub group_properties: Map<String, Value>,
    pub disable_flags: bool,
    /// `flag_keys_to_evaluate` (server SDKs) or `flag_keys` (posthog-js): answer only
    /// these flags, as PostHog does. `None` answers every flag.
    pub flag_keys: Option<Vec<String>>,
}

impl DecideRequest {
    /// Read the JSON body of a decide request. Only the members used are built into
    /// values; the rest of the body stays on the parser's tape.
    pub fn parse(bytes: &mut [u8]) -> Result<DecideRequest, ApiError> {
        let tape = capture::json::parse_tape(bytes).map_err(ApiError::Capture)?;
        let parsed = Self::from_tape(&tape);
        capture::json::recycle(tape);
        parsed
    }

    fn from_tape(tape: &[simd_json::Node<'_>]) -> Result<DecideRequest, ApiError> {
        let Some(obj) = TapeValue::root(tape).and_then(|v| v.as_object()) else {
            return Err(Error::InvalidBody("expected a JSON object").into());
        };
        // A member sent as null counts as absent, as the SDKs send it.
        let member = |name: &str| obj.get(name).filter(|v| !v.is_null());
        let sent = [obj.get("api_key"), obj.get("token")];
        let key = match sent.iter().flatten().find_map(|k| k.as_str()) {
            Some(k) => k.to_owned(),
            None if sent.iter().flatten().all(|k| k.is_null()) => {
                return Err(Error::MissingKey.into())
            }
            None => return Err(Error::InvalidBody("api_key must be a string").into()),
        };
        let distinct_id = match member("distinct_id") {
            Some(v) => match (v.as_str(), v.number_string()) {
                (Some(s), _) if !s.is_empty() => clean_distinct_id(s),
                (Some(_), _) => return Err(Error::MissingDistinctId.into()),
                (None, Some(n)) => n,
                (None, None) => {
                    return Err(
                        Error::InvalidBody("distinct_id must be a string or a number").into(),
                    )
                }
            },
            None => return Err(Error::MissingDistinctId.into()),
        };
        let object = |name: &str, what: &'static str| match member(name) {
            None => Ok(Map::new()),
            Some(v) => match v.as_object().map(|o| capture::tape::to_serde(o.into())) {
                Some(Value::Object(m)) => Ok(m),
                _ => Err(ApiError::from(Error::InvalidBody(what))),
            },
        };
        // PostHog reads `flag_keys`, with `flag_keys_to_evaluate` as its other name.
        let flag_keys = match member("flag_keys").or_else(|| member("flag_keys_to_evaluate")) {
            None => None,
            Some(v) => match v.as_array() {
                Some(keys) => Some(
                    keys.iter()
                        .map(|k| k.as_str().map(str::to_owned))
                        .collect::<Option<Vec<String>>>()
                        .ok_or(Error::InvalidBody("flag keys must be strings"))?,
                ),
                None => return Err(Error::InvalidBody("flag keys must be a list").into()),
            },
        };
        let anon_distinct_id = member("$anon_distinct_id").and_then(|v| match v.as_str() {
            Some(s) if !s.is_empty() => Some(clean_distinct_id(s)),
            Some(_) => None,
            None => v.number_string(),
        });
        Ok(DecideRequest {
            key,
            distinct_id,
            anon_distinct_id,
            groups: object("groups", "groups must be an object")?,
            person_properties: object("person_properties", "person_properties must be an object")?,
            group_properties: object("group_properties", "group_properties must be an object")?,
            disable_flags: obj.get("disable_flags").and_then(|v| v.as_bool()) == Some(true),
            flag_keys,
        })
    }
}

/// The shape to answer in, as PostHog's flags service picks it: `/decide?v=N` in
/// version N's shape (1 when absent or unknown, 4 above 4); `/flags?v=2` and above in
/// the detailed v4 shape, `/flags` without a version in the v3 one.
pub fn version(query: Option<&str>, flags_path: bool) -> u8 {
    let asked = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .find(|(k, _)| k == "v")
        .and_then(|(_, v)| v.trim().parse::<u32>().ok());
    match (flags_path, asked) {
        (true, Some(v)) if v >= 2 => 4,
        (true, _) => 3,
        (false, Some(v)) if v >= 4 => 4,
        (false, Some(v @ 2..=3)) => v as u8,
        (false, _) => 1,
    }
}

/// A fresh `requestId` (a UUIDv7, as PostHog's): the clock's milliseconds, and for
/// the random bits a random value drawn once per process, stepped by a counter and
/// mixed, so minting one costs no system call on the decide path.
fn request_id() -> uuid::Uuid {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static SEED: OnceLock<u128> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| uuid::Uuid::new_v4().as_u128());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    // An odd multiplier is a bijection, so distinct counters give distinct bits.
    let bits = seed ^ u128::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835);
    let mut random = [0u8; 10];
    random.copy_from_slice(&bits.to_le_bytes()[..10]);
    let ms = u64::try_from(now_ms()).unwrap_or(0);
    uuid::Builder::from_unix_timestamp_millis(ms, &random).into_uuid()
}

pub async fn handle(
    app: &Arc<App>,
    req: Request<Incoming>,
    peer: SocketAddr,
    flags_path: bool,
) -> Result<Response<Body>, ApiError> {
    let started = Instant::now();
    let (parts, incoming) = req.into_parts();
    let version = version(parts.uri.query(), flags_path);
    let query = Query::parse(parts.uri.query());
    let mut held = Reservation::default();
    let limits = &app.config.limits;
    let raw = body::read(
        incoming,
        super::content_length(&parts.headers),
        MAX_DECIDE_BODY_BYTES.min(limits.max_body_bytes),
        limits.body_read_timeout,
        &app.budget,
        &mut held,
    )
    .await?;
    // Decoded right here on the reactor, so held to the decide size too: a small
    // compressed body must not expand to the capture limit.
    let located = decode::Located::find(
        &query,
        super::header_str(&parts.headers, CONTENT_TYPE).as_deref(),
        super::header_str(&parts.headers, CONTENT_ENCODING).as_deref(),
        &raw,
    );
    let max_decoded = MAX_DECIDE_BODY_BYTES.min(limits.max_decompressed_bytes);
    let mut bytes = located.decode(max_decoded)?;
    let request = DecideRequest::parse(&mut bytes)?;
    let project = project_of(app, &request.key)?;
    let geo = location(app, peer, &parts.headers);
    let edge = app.upstream.is_some();
    let (mut body, asked) = evaluate(app, &project, request, geo, version, edge);
    // The parser worked in place, so what goes upstream is decoded again: only a
    // request the edge cannot decide alone pays for it. Decoding depends on the bytes
    // alone, so it gives what was parsed.
    let original = || located.decode(max_decoded).ok();
    if let Some((asked, original)) = asked.and_then(|asked| Some((asked, original()?))) {
        let caller = super::client_ip(app, peer, &parts.headers);
        // Boxed: the upstream call's state is kilobytes, and inline it would be moved
        // with every /decide future, edge mode or not.
        let asking = from_upstream(app, &project, asked, &original, caller, version, body);
        body = Box::pin(asking).await;
    }
    app.metrics
        .decide_seconds
        .observe(started.elapsed().as_secs_f64());
    Ok(response::with_type(
        StatusCode::OK,
        "application/json",
        body,
    ))
}

/// The seven GeoIP person properties of the specification for this request: from the
/// client address when the peer is a trusted proxy (the chain walked from the right, as
/// everywhere), else from the leftmost `X-Forwarded-For` address when the header is
/// present (decide only affects the caller's own flags, so a direct caller's header is
/// taken as is), else from the peer.
fn location(app: &App, peer: SocketAddr, headers: &HeaderMap) -> Map<String, Value> {
    if !app.geoip.is_enabled() {
        return Map::new();
    }
    let direct = !app.config.trusted_proxies.contains(peer.ip());
    let ip = headers
        .get("x-forwarded-for")
        .filter(|_| direct)
        .and_then(|v| crate::geoip::forwarded_for(v.as_bytes()))
        .unwrap_or_else(|| super::client_ip(app, peer, headers));
    app.geoip.decide_properties(ip)
}

/// The flags `distinct_id` gets right now, as `/flags?v=2` would answer a request that
/// names only that id (no groups, no properties of its own): the console's view of a
/// person, through the very evaluation `/decide` runs.
pub fn for_person(app: &App, project: &Project, distinct_id: &str) -> Vec<u8> {
    let req = DecideRequest {
        key: project.api_key.clone(),
        distinct_id: distinct_id.to_owned(),
        ..DecideRequest::default()
    };
    evaluate(app, project, req, Map::new(), 4, false).0
}

/// What an edge leaves to upstream for one request, and the rules it decided the rest by
/// (`None`: the project has no rules here, so upstream answers every flag).
struct Asked {
    plan: crate::edge::fallback::Plan,
    rules: Option<Arc<flags::ProjectRules>>,
}

/// The edge's answer `local` with upstream's for the flags in `asked`: one upstream call,
/// within the budget; without its answer, `local` with `errorsWhileComputingFlags` set.
async fn from_upstream(
    app: &App,
    project: &Project,
    asked: Asked,
    original: &[u8],
    caller: std::net::IpAddr,
    version: u8,
    local: Vec<u8>,
) -> Vec<u8> {
    use crate::edge::{fallback, merge};
    let (Some(client), Some(settings)) = (&app.upstream, &app.config.upstream) else {
        return local;
    };
    let stats = &app.metrics.upstream;
    let budget = settings.flags_budget;
    let answer = fallback::ask(client, stats, budget, original, &asked.plan, caller).await;
    // A quota-limited answer names no flag, so it teaches nothing about the feed.
    let learnt = answer.as_ref().filter(|a| a.quota_limited.is_none());
    if let (Some(answer), Some(rules), true) = (learnt, &asked.rules, asked.plan.learn) {
        app.upstream_flags.learn(project.id, rules, answer);
    }
    let takes = |key: &str| {
        asked.plan.keys.iter().any(|k| k == key)
            || asked
                .rules
                .as_ref()
                .is_none_or(|r| r.index_of(key).is_none())
    };
    merge::merge(version, local, answer.as_ref(), takes)
}

/// Evaluate every flag of the project for the request and write the response body.
/// Person properties are layered: stored, then GeoIP, then the request's own. At an
/// `edge`, the flags it cannot decide are left out and come back as [`Asked`].
fn evaluate(
    app: &App,
    project: &Project,
    mut req: DecideRequest,
    geo: Map<String, Value>,
    version: u8,
    edge: bool,
) -> (Vec<u8>, Option<Asked>) {
    let snapshot = app.rules.current();
    let rules = i64::try_from(project.id)
        .ok()
        .and_then(|id| snapshot.project(id).cloned());
    let request_id = request_id();
    // In edge mode, upstream's client config once the edge has a copy of it.
    let upstream = super::upstream_config::decide_tail(app, project);
    let common = match upstream
        .as_deref()
        .and_then(super::upstream_config::decide_members)
    {
        Some(members) => members,
        None => super::remote_config::decide_tail(app, project),
    };
    let limited = flags::quota_limited_tail(&snapshot, project.id, common);
    let (quota_limited, common) = (limited.is_some(), limited.as_deref().unwrap_or(common));
    let tail = flags::Tail {
        evaluated_at: Some(now_ms()),
        common,
    };
    let Some(rules) = rules.filter(|_| !req.disable_flags && !quota_limited) else {
        let none = flags::Evaluation::default();
        let asked = (edge && !req.disable_flags).then(|| Asked {
            plan: crate::edge::fallback::Plan {
                learn: req.flag_keys.is_none(),
                keys: req.flag_keys.take().unwrap_or_default(),
            },
            rules: None,
        });
        let body = flags::response_bytes_with(version, &none, request_id, &tail);
        return (body, asked.filter(|a| a.plan.needed()));
    };
    // One lookup serves both the stored properties and the continuity hash key.
    let needs_person = rules.needs_person_properties();
    let mut lookup_failed = false;
    let person = if needs_person || rules.needs_continuity() {
        match app.with_trees(|t| app.persons.person(t, project.id, &req.distinct_id)) {
            Ok(person) => person,
            Err(e) => {
                if needs_person {
                    tracing::warn!(error = %e, "person lookup failed; person-based flags left out");
                }
                lookup_failed = true;
                None
            }
        }
    } else {
        None
    };
    let hash_key = person
        .as_ref()
        .map(|p| p.first_distinct_id.clone())
        .filter(|first| *first != req.distinct_id);
    // Stored person properties, then GeoIP's, then the request's, key by key. A
    // failed lookup leaves them unknown: flags that need them fail instead of guessing.
    let person_properties = if needs_person && lookup_failed {
        None
    } else {
        let stored = match person {
            Some(p) if needs_person => p.properties.clone(),
            _ => Map::new(),
        };
        let requested = std::mem::take(&mut req.person_properties);
        Some(layered([stored, geo, requested]))
    };
    let group_properties =
        group_properties(app, project.id, &mut req, rules.needs_group_properties());
    let ctx = Context {
        distinct_id: &req.distinct_id,
        anon_distinct_id: req.anon_distinct_id.as_deref(),
        hash_key_override: hash_key.as_deref(),
        person_properties: person_properties.as_ref(),
        groups: &req.groups,
        group_properties: &group_properties,
        now: crate::flags::now(),
    };
    let mut outcomes = if edge {
        rules.outcomes_at_edge(&ctx)
    } else {
        rules.outcomes(&ctx)
    };
    if let Some(keys) = &req.flag_keys {
        outcomes.retain_keys(keys);
    }
    if outcomes.errors() {
        app.metrics.decide_errors.inc();
    }
    let asked = edge
        .then(|| Asked {
            plan: crate::edge::fallback::plan(
                project.id,
                &rules,
                &ctx,
                &mut outcomes,
                req.flag_keys.as_deref(),
                &app.upstream_flags,
            ),
            rules: Some(rules.clone()),
        })
        .filter(|a| a.plan.needed());
    (
        outcomes.response_bytes_with(version, request_id, &tail),
        asked,
    )
}

/// `evaluatedAt`: milliseconds since the epoch, as PostHog's flags service writes it.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The layers merged key by key, later ones winning. The first non-empty layer is
/// taken as it is, so the common case (properties from one source) copies nothing.
fn layered<const N: usize>(layers: [Map<String, Value>; N]) -> Map<String, Value> {
    let mut merged = Map::new();
    for layer in layers {
        if merged.is_empty() {
            merged = layer;
        } else {
            merged.extend(layer);
        }
    }
    merged
}

/// Each requested group's stored properties, overridden by the request's.
fn group_properties(
    app: &App,
    project: u64,
    req: &mut DecideRequest,
    use_stored: bool,
) -> HashMap<String, Option<Map<String, Value>>> {
    let mut out = HashMap::with_capacity(req.groups.len());
    for (kind, key) in &req.groups {
        let key = match key {
            Value::String(s) => Cow::Borrowed(s.as_str()),
            Value::Number(n) => Cow::Owned(n.to_string()),
            _ => continue,
        };
        let mut stored = Map::new();
        if use_stored {
            match app.with_trees(|t| app.persons.group(t, project, kind, &key)) {
                Ok(Some(group)) => stored = Map::clone(&group),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "group lookup failed; flags of that group left out");
                    out.insert(kind.clone(), None);
                    continue;
                }
            }
        }
        let overrides = match req.group_properties.remove(kind) {
            Some(Value::Object(overrides)) => overrides,
            _ => Map::new(),
        };
        out.insert(kind.clone(), Some(layered([stored, overrides])));
    }
    out
}

#[cfg(test)]
#[path = "tests/decide.rs"]
mod tests;
