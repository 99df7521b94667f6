//! Flag evaluation (`flags::ProjectRules::evaluate`): each kind of flag alone, then the
//! load harness's 50-flag project, whose definitions this bench takes from the harness
//! itself (`benches/load/flags.rs`) so both always measure the same file. The single
//! flags are picked out of that file by key. Contexts are `/decide` callers with person
//! properties, groups and group properties, cycled so hashes and outcomes vary.
//! Throughput is in flags: per-request time divided by it is the time per flag.
//!
//! `flags/decide` measures what `/decide?v=3` does with the 50-flag project after parsing
//! the request: evaluate and write the body, through owned results (`evaluate` then
//! `response_bytes`) and through borrowed outcomes (`outcomes` then their
//! `response_bytes`, which the server uses). It does so for callers sending their
//! properties with no stored person, for callers whose stored person's properties are
//! layered under the request's (as `/decide` does when the person is stored), and for
//! the 50 flags plus ten that share one `$current_url` pattern.
//!
//! With `FLAGS_DRIVER=<requests>` in the environment the bench runs none of that: it
//! answers that many `/decide` requests per case in plain functions (`drive_*`), for
//! counting instructions per request under `valgrind --tool=callgrind`; with
//! `FLAGS_EDGE=<case>` too, one of the edge's cases instead (`flags/edge.rs`).

#[path = "common/mod.rs"]
mod common;
#[path = "flags/edge.rs"]
mod edge;
#[path = "load/flags.rs"]
mod load_flags;

use std::collections::HashMap;

use criterion::{criterion_group, Criterion, Throughput};
use flagpost::flags::{self, Context, ProjectRules};
use serde_json::{json, Map, Value};
use time::OffsetDateTime;

use load_flags::GROUP_KEYS;

/// Distinct callers cycled through.
const CALLERS: usize = 64;

/// One flag of each kind, by its key in the harness's file. The dependency flag needs
/// the flag it depends on, so that case evaluates two.
const KINDS: &[(&str, &[&str])] = &[
    ("boolean rollout", &["dark-mode"]),
    ("person exact", &["pro-reports"]),
    ("person regex", &["early-users"]),
    ("person numeric", &["big-teams"]),
    ("person date", &["recent-signups"]),
    ("person semver", &["new-app-only"]),
    ("multivariate payload", &["pricing-page-test"]),
    ("group", &["org-audit-log"]),
    ("cohort", &["power-users"]),
    ("dependency", &["pro-reports", "pro-reports-export"]),
    ("holdout", &["checkout-v2"]),
    ("early access", &["early-access-notebooks"]),
];

/// The harness's definitions file, as it writes it for the server.
fn definitions() -> Value {
    let dir = tempfile::Builder::new()
        .prefix("flagpost-bench-flags-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("a temporary dir under the target dir");
    load_flags::write_data_dir(dir.path()).expect("the harness writes its data dir");
    let file = std::fs::read(dir.path().join("flags/1.json")).expect("the flags file");
    serde_json::from_slice(&file).expect("the harness writes JSON")
}

/// The file with only the flags named in `keys`, cohorts and group types kept.
fn only(definitions: &Value, keys: &[&str]) -> Value {
    let mut out = definitions.clone();
    let flags = out["flags"].as_array_mut().expect("a flags array");
    flags.retain(|flag| keys.contains(&flag["key"].as_str().expect("a key")));
    assert_eq!(flags.len(), keys.len(), "every key names a flag");
    out
}

/// What one `/decide` caller sends, as the load harness's `decide` bodies carry it.
struct Caller {
    distinct_id: String,
    anon_distinct_id: String,
    person_properties: Map<String, Value>,
    groups: Map<String, Value>,
    group_properties: HashMap<String, Option<Map<String, Value>>>,
}

impl Caller {
    fn new(n: usize) -> Caller {
        let plan = ["free", "pro", "enterprise"][n % 3];
        let distinct_id = common::distinct_id(n);
        let domain = ["example.com", "acme.io", "gmail.com"][n % 3];
        let country = ["GB", "US", "DE", "FR", "BR"][n % 5];
        let object = |v: Value| match v {
            Value::Object(m) => m,
            _ => unreachable!("an object literal"),
        };
        Caller {
            anon_distinct_id: common::uuid(common::NOW_MS, n as u64).to_string(),
            person_properties: object(json!({
                "email": format!("{distinct_id}@{domain}"),
                "plan": plan,
                "$geoip_country_code": country,
                "app_version": format!("2.{}.{}", n % 12, n % 5),
                "signed_up_at": "2024-03-01T10:00:00Z",
                "seats": n % 40,
                "$browser": "Chrome",
            })),
            groups: object(json!({
                GROUP_KEYS[0]: format!("org-{}", n % 50),
                GROUP_KEYS[1]: format!("company-{}", n % 20),
            })),
            group_properties: HashMap::from([(
                GROUP_KEYS[0].to_string(),
                Some(object(json!({"tier": plan, "employees": (n % 50) * 10}))),
            )]),
            distinct_id,
        }
    }

    /// The same caller once its person is stored: the stored properties (what posthog-js
    /// sets once and the compactor adds) under the request's, key by key, as `/decide`
    /// layers them.
    fn stored(mut self) -> Caller {
        let n: usize = self.distinct_id[5..].parse().expect("user-<n>");
        let page = ["dashboard", "insights", "settings", "billing"][n % 4];
        let url = format!(
            "https://app.example.com/project/{}/{page}?tab=overview",
            n % 7
        );
        let mut properties = match json!({
            "$initial_referrer": "$direct",
            "$initial_referring_domain": "$direct",
            "$initial_current_url": url,
            "$initial_pathname": format!("/project/{}/{page}", n % 7),
            "$initial_browser": "Chrome",
            "$initial_browser_version": 124,
            "$initial_os": "Mac OS X",
            "$initial_device_type": "Desktop",
            "$initial_geoip_country_code": (["GB", "US", "DE", "FR", "BR"][n % 5]),
            "$initial_geoip_city_name": "London",
            "$geoip_city_name": "London",
            "$geoip_continent_code": "EU",
            "name": format!("User {n}"),
            "last_page": format!("/project/{}/{page}", n % 7),
        }) {
            Value::Object(m) => m,
            _ => unreachable!("an object literal"),
        };
        for (key, value) in std::mem::take(&mut self.person_properties) {
            properties.insert(key, value);
        }
        self.person_properties = properties;
        self
    }

    /// The same caller with the page it is on as a person property.
    fn on_page(mut self) -> Caller {
        let n: usize = self.distinct_id[5..].parse().expect("user-<n>");
        let page = ["dashboard", "insights", "settings", "billing"][n % 4];
        let url = format!(
            "https://app.example.com/project/{}/{page}?tab=overview",
            n % 7
        );
        self.person_properties
            .insert("$current_url".into(), Value::String(url));
        self
    }

    fn context(&self, now: OffsetDateTime) -> Context<'_> {
        Context {
            distinct_id: &self.distinct_id,
            anon_distinct_id: Some(&self.anon_distinct_id),
            hash_key_override: None,
            person_properties: Some(&self.person_properties),
            groups: &self.groups,
            group_properties: &self.group_properties,
            now,
        }
    }
}

fn bench(c: &mut Criterion, name: &str, rules: &ProjectRules, contexts: &[Context<'_>]) {
    assert!(
        rules.warnings().is_empty(),
        "{name}: {:?}",
        rules.warnings()
    );
    // Every flag is computed for every caller, and outcomes vary between callers.
    let mut enabled = 0;
    for ctx in contexts {
        let evaluation = rules.evaluate(ctx);
        assert!(!evaluation.errors, "{name}: {:?}", evaluation.failed);
        enabled += evaluation.flags.iter().filter(|f| f.enabled).count();
    }
    println!(
        "flags/evaluate/{name}: {enabled} of {} flag results enabled over {} callers",
        rules.flag_count() * contexts.len(),
        contexts.len()
    );
    let mut group = c.benchmark_group("flags/evaluate");
    group.throughput(Throughput::Elements(rules.flag_count() as u64));
    let mut next = 0usize;
    group.bench_function(name, |b| {
        b.iter(|| {
            next = (next + 1) % contexts.len();
            rules.evaluate(&contexts[next])
        })
    });
    group.finish();
}

fn flags(c: &mut Criterion) {
    let definitions = definitions();
    let callers: Vec<Caller> = (0..CALLERS).map(Caller::new).collect();
    let now = OffsetDateTime::now_utc();
    let contexts: Vec<Context<'_>> = callers.iter().map(|c| c.context(now)).collect();
    for (name, keys) in KINDS {
        let rules = ProjectRules::from_value(only(&definitions, keys)).expect("compiles");
        bench(c, name, &rules, &contexts);
    }
    let rules = ProjectRules::from_value(definitions.clone()).expect("compiles");
    bench(c, "mix of 50", &rules, &contexts);
    decide(c, "mix of 50", &rules, &contexts);
    let stored: Vec<Caller> = (0..CALLERS).map(|n| Caller::new(n).stored()).collect();
    let contexts: Vec<Context<'_>> = stored.iter().map(|c| c.context(now)).collect();
    decide(c, "mix of 50, stored person", &rules, &contexts);
    let rules = ProjectRules::from_value(with_shared_pattern(definitions)).expect("compiles");
    let on_page: Vec<Caller> = (0..CALLERS).map(|n| Caller::new(n).on_page()).collect();
    let contexts: Vec<Context<'_>> = on_page.iter().map(|c| c.context(now)).collect();
    decide(c, "mix of 50 and 10 sharing a pattern", &rules, &contexts);
}

/// Flags that share one pattern, as projects target pages: the same `$current_url`
/// regex in ten flags.
const SHARED_PATTERN: usize = 10;

/// The file with [`SHARED_PATTERN`] more flags, each enabled for callers on an
/// insights or dashboard page.
fn with_shared_pattern(mut definitions: Value) -> Value {
    let flags = definitions["flags"].as_array_mut().expect("a flags array");
    let first_id = flags.len() + 1;
    for i in 0..SHARED_PATTERN {
        flags.push(json!({
            "id": first_id + i, "key": format!("page-flag-{i}"), "name": "page flag",
            "active": true, "deleted": false, "version": 1,
            "ensure_experience_continuity": false,
            "filters": {"groups": [{"properties": [{
                "key": "$current_url", "type": "person", "operator": "regex",
                "value": r"^https://app\.example\.com/project/\d+/(insights|dashboard)",
            }], "rollout_percentage": 100, "variant": null}]},
        }));
    }
    definitions
}

/// The version `/decide` bodies are written in by posthog-js (and the load harness).
const DECIDE_VERSION: u8 = 3;

fn decide(c: &mut Criterion, name: &str, rules: &ProjectRules, contexts: &[Context<'_>]) {
    let id = uuid::Uuid::nil();
    for ctx in contexts {
        assert_eq!(
            rules.outcomes(ctx).response_bytes(DECIDE_VERSION, id),
            flags::response_bytes(DECIDE_VERSION, &rules.evaluate(ctx), id),
            "both paths write the same body"
        );
    }
    let mut group = c.benchmark_group("flags/decide");
    group.throughput(Throughput::Elements(rules.flag_count() as u64));
    let mut next = 0usize;
    group.bench_function(format!("{name}: evaluate and v3 body"), |b| {
        b.iter(|| {
            next = (next + 1) % contexts.len();
            flags::response_bytes(DECIDE_VERSION, &rules.evaluate(&contexts[next]), id)
        })
    });
    group.bench_function(format!("{name}: outcomes and v3 body"), |b| {
        b.iter(|| {
            next = (next + 1) % contexts.len();
            rules
                .outcomes(&contexts[next])
                .response_bytes(DECIDE_VERSION, id)
        })
    });
    group.finish();
}

/// `requests` `/decide` answers for the callers in turn: what one request costs is this
/// function's instructions divided by `requests`.
#[inline(never)]
fn drive(rules: &ProjectRules, contexts: &[Context<'_>], requests: usize) -> usize {
    let mut bytes = 0;
    for n in 0..requests {
        let ctx = &contexts[n % contexts.len()];
        let body = rules
            .outcomes(ctx)
            .response_bytes(DECIDE_VERSION, uuid::Uuid::nil());
        bytes += std::hint::black_box(body).len();
    }
    bytes
}

#[inline(never)]
fn drive_unstored(rules: &ProjectRules, contexts: &[Context<'_>], requests: usize) -> usize {
    drive(rules, contexts, requests)
}

#[inline(never)]
fn drive_stored(rules: &ProjectRules, contexts: &[Context<'_>], requests: usize) -> usize {
    drive(rules, contexts, requests)
}

#[inline(never)]
fn drive_shared_pattern(rules: &ProjectRules, contexts: &[Context<'_>], requests: usize) -> usize {
    drive(rules, contexts, requests)
}

/// The `FLAGS_DRIVER` mode: each case answered `requests` times, by its own function.
fn driver(requests: usize) {
    let definitions = definitions();
    let now = OffsetDateTime::now_utc();
    if let Ok(case) = std::env::var("FLAGS_EDGE") {
        // Callers with a stored person: the properties a verdict has to look up most.
        let stored: Vec<Caller> = (0..CALLERS).map(|n| Caller::new(n).stored()).collect();
        let contexts: Vec<Context<'_>> = stored.iter().map(|c| c.context(now)).collect();
        edge::driver(&definitions, &contexts, &case, requests);
        return;
    }
    let rules = ProjectRules::from_value(definitions.clone()).expect("compiles");
    let callers: Vec<Caller> = (0..CALLERS).map(Caller::new).collect();
    let contexts: Vec<Context<'_>> = callers.iter().map(|c| c.context(now)).collect();
    let bytes = drive_unstored(&rules, &contexts, requests);
    println!("no stored person: {requests} requests, {bytes} bytes");
    let stored: Vec<Caller> = (0..CALLERS).map(|n| Caller::new(n).stored()).collect();
    let contexts: Vec<Context<'_>> = stored.iter().map(|c| c.context(now)).collect();
    let bytes = drive_stored(&rules, &contexts, requests);
    println!("stored person: {requests} requests, {bytes} bytes");
    let rules = ProjectRules::from_value(with_shared_pattern(definitions)).expect("compiles");
    let on_page: Vec<Caller> = (0..CALLERS).map(|n| Caller::new(n).on_page()).collect();
    let contexts: Vec<Context<'_>> = on_page.iter().map(|c| c.context(now)).collect();
    let bytes = drive_shared_pattern(&rules, &contexts, requests);
    println!("10 flags sharing a pattern: {requests} requests, {bytes} bytes");
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = flags
}

fn main() {
    if let Ok(requests) = std::env::var("FLAGS_DRIVER") {
        driver(
            requests
                .parse()
                .expect("FLAGS_DRIVER is a number of requests"),
        );
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
