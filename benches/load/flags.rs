//! The temporary data dir flagpost serves during the run: one project, and a flag
//! definitions file of 50 flags in PostHog's local-evaluation format, shaped like a
//! real project's: boolean rollouts, person-property conditions across the operators,
//! multivariate flags with payloads, group flags, a cohort, a dependency, a holdout and
//! an early-access flag. `/decide` evaluates all of them on every request.

use std::path::Path;

use serde_json::{json, Value};

/// The test project's key; every scenario sends it.
pub const API_KEY: &str = "phc_load_test_project";
/// Its personal key, unused by the load but required to be distinct from `API_KEY`.
pub const PERSONAL_KEY: &str = "phx_load_test_project";
/// Group types 0 and 1 of `group_type_mapping`.
pub const GROUP_KEYS: [&str; 2] = ["organization", "company"];
/// The size of the definitions file a busy project serves.
const FLAG_COUNT: usize = 50;
/// The one cohort the cohort flag refers to.
const COHORT_ID: u32 = 42;

/// Write `projects.json` and `flags/1.json` under `dir`.
pub fn write_data_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join("flags"))?;
    let projects = json!({"projects": [
        {"id": 1, "name": "load", "api_key": API_KEY, "personal_api_keys": [PERSONAL_KEY]}
    ]});
    std::fs::write(dir.join("projects.json"), projects.to_string())?;
    std::fs::write(dir.join("flags/1.json"), definitions().to_string())
}

/// A person-property filter.
fn person(key: &str, operator: &str, value: Value) -> Value {
    json!({"key": key, "operator": operator, "value": value, "type": "person"})
}

/// One release condition: all `properties` must match, then the rollout applies.
fn condition(properties: Vec<Value>, rollout: u32) -> Value {
    json!({"properties": properties, "rollout_percentage": rollout, "variant": null})
}

/// A flag with the fields PostHog serves; `filters` holds its rules.
fn flag(key: &str, filters: Value) -> Value {
    json!({
        "id": 0, "key": key, "name": key.replace('-', " "), "active": true, "deleted": false,
        "version": 1, "ensure_experience_continuity": false, "filters": filters,
    })
}

fn simple(key: &str, conditions: Vec<Value>) -> Value {
    flag(key, json!({"groups": conditions}))
}

/// Variants with their split and a JSON payload for each, as PostHog stores payloads
/// (JSON encoded into strings).
fn multivariate(key: &str, conditions: Vec<Value>, split: &[(&str, u32)]) -> Value {
    let variants: Vec<Value> = split
        .iter()
        .map(|(variant, pct)| json!({"key": variant, "name": variant, "rollout_percentage": pct}))
        .collect();
    let payloads: serde_json::Map<String, Value> = split
        .iter()
        .map(|(variant, _)| {
            let payload = json!({"variant": variant, "copy": format!("{key} {variant}")});
            (variant.to_string(), Value::String(payload.to_string()))
        })
        .collect();
    flag(
        key,
        json!({"groups": conditions, "multivariate": {"variants": variants}, "payloads": payloads}),
    )
}

fn boolean_rollouts() -> Vec<Value> {
    let rollouts = [
        ("new-navigation", 100),
        ("dark-mode", 50),
        ("command-palette", 25),
        ("faster-charts", 10),
        ("session-replay-v2", 5),
        ("ai-summaries", 0),
        ("bulk-export", 75),
        ("inline-editing", 30),
        ("keyboard-shortcuts", 90),
        ("new-billing-page", 20),
        ("notifications-v3", 40),
        ("query-cache", 100),
        ("retired-sidebar", 100),
        ("abandoned-experiment", 60),
    ];
    let mut flags: Vec<Value> = rollouts
        .iter()
        .map(|(key, pct)| simple(key, vec![condition(vec![], *pct)]))
        .collect();
    // Real projects keep switched-off and deleted flags in the file.
    flags[12]["active"] = false.into();
    flags[13]["deleted"] = true.into();
    flags
}

fn person_conditions() -> Vec<Value> {
    let one = |key: &str, filter: Value, pct: u32| simple(key, vec![condition(vec![filter], pct)]);
    vec![
        one(
            "pro-reports",
            person("plan", "exact", json!(["pro", "enterprise"])),
            100,
        ),
        one(
            "eu-cookie-banner",
            person("$geoip_country_code", "exact", json!(["DE", "FR"])),
            100,
        ),
        one(
            "non-french-copy",
            person("$geoip_country_code", "is_not", json!("FR")),
            100,
        ),
        one(
            "acme-internal",
            person("email", "icontains", json!("@acme.io")),
            100,
        ),
        one(
            "no-gmail-promo",
            person("email", "not_icontains", json!("gmail")),
            50,
        ),
        one(
            "early-users",
            person("email", "regex", json!(r"^user-0000\d\d@")),
            100,
        ),
        one(
            "not-test-users",
            person("email", "not_regex", json!(r"^test\+")),
            100,
        ),
        one(
            "example-domain",
            person("email", "regex", json!("@example\\.com$")),
            100,
        ),
        one("big-teams", person("seats", "gt", json!(10)), 100),
        one("small-teams", person("seats", "lte", json!("5")), 100),
        one("mid-teams", person("seats", "gte", json!(20)), 50),
        one("tiny-teams", person("seats", "lt", json!(3)), 100),
        one("has-plan", person("plan", "is_set", json!("is_set")), 100),
        one(
            "no-opt-out",
            person("beta_opt_out", "is_not_set", json!("is_not_set")),
            100,
        ),
        one(
            "recent-signups",
            person("signed_up_at", "is_date_after", json!("-30d")),
            100,
        ),
        one(
            "veterans",
            person("signed_up_at", "is_date_before", json!("2025-01-01")),
            100,
        ),
        one(
            "new-app-only",
            person("app_version", "semver_gte", json!("2.5.0")),
            100,
        ),
        one(
            "app-2-3-line",
            person("app_version", "semver_caret", json!("2.3.0")),
            100,
        ),
        simple(
            "pro-in-us",
            vec![condition(
                vec![
                    person("plan", "exact", json!("pro")),
                    person("$geoip_country_code", "exact", json!("US")),
                ],
                100,
            )],
        ),
        simple(
            "staged-launch",
            vec![
                condition(vec![person("plan", "exact", json!("enterprise"))], 100),
                condition(vec![person("app_version", "semver_lt", json!("2.2.0"))], 0),
                condition(vec![], 15),
            ],
        ),
    ]
}

fn multivariates() -> Vec<Value> {
    let ab = [("control", 50), ("test", 50)];
    let abc = [("control", 34), ("test-a", 33), ("test-b", 33)];
    let everyone = || vec![condition(vec![], 100)];
    let mut pinned = condition(vec![person("plan", "exact", json!("enterprise"))], 100);
    pinned["variant"] = "control".into();
    let mut flags = vec![
        multivariate("pricing-page-test", everyone(), &ab),
        multivariate("signup-flow-test", everyone(), &abc),
        multivariate("onboarding-checklist", vec![condition(vec![], 50)], &ab),
        multivariate(
            "cta-colour",
            everyone(),
            &[("blue", 25), ("green", 25), ("red", 50)],
        ),
        multivariate(
            "pro-upsell-copy",
            vec![condition(vec![person("plan", "exact", json!("free"))], 100)],
            &ab,
        ),
        multivariate(
            "enterprise-pinned",
            vec![pinned, condition(vec![], 100)],
            &ab,
        ),
        multivariate(
            "search-ranking",
            vec![condition(vec![person("seats", "gte", json!(5))], 80)],
            &abc,
        ),
        multivariate("empty-state-art", everyone(), &[("a", 10), ("b", 90)]),
        multivariate(
            "trial-length",
            vec![condition(vec![], 30)],
            &[("14d", 50), ("30d", 50)],
        ),
        multivariate("homepage-hero", everyone(), &ab),
    ];
    // Users keep their variant across identify for this experiment.
    flags[9]["ensure_experience_continuity"] = true.into();
    flags
}

fn group_flags() -> Vec<Value> {
    let tier = json!({"key": "tier", "operator": "exact", "value": ["enterprise"],
                      "type": "group", "group_type_index": 0});
    vec![
        flag(
            "org-audit-log",
            json!({"aggregation_group_type_index": 0, "groups": [condition(vec![tier], 100)]}),
        ),
        flag(
            "company-sso",
            json!({"aggregation_group_type_index": 1, "groups": [condition(vec![], 30)]}),
        ),
    ]
}

fn other_flags() -> Vec<Value> {
    let cohort = json!({"key": "id", "value": COHORT_ID, "operator": "in", "type": "cohort"});
    let depends = json!({"key": "pro-reports", "value": true,
                         "operator": "flag_evaluates_to", "type": "flag"});
    let mut holdout = simple("checkout-v2", vec![condition(vec![], 100)]);
    holdout["filters"]["holdout"] = json!({"id": 7, "exclusion_percentage": 10});
    let mut enrollment = simple("early-access-notebooks", vec![condition(vec![], 0)]);
    enrollment["filters"]["feature_enrollment"] = true.into();
    vec![
        simple("power-users", vec![condition(vec![cohort], 100)]),
        simple("pro-reports-export", vec![condition(vec![depends], 100)]),
        holdout,
        enrollment,
    ]
}

/// The whole definitions file; flags are numbered in order.
pub fn definitions() -> Value {
    let mut flags: Vec<Value> = [
        boolean_rollouts(),
        person_conditions(),
        multivariates(),
        group_flags(),
        other_flags(),
    ]
    .concat();
    assert_eq!(
        flags.len(),
        FLAG_COUNT,
        "the generated file has a fixed size"
    );
    for (id, flag) in flags.iter_mut().enumerate() {
        flag["id"] = (id + 1).into();
    }
    let cohort_rules = json!({"type": "OR", "values": [{"type": "AND", "values": [
        person("plan", "exact", json!(["pro", "enterprise"])),
        person("seats", "gte", json!(10)),
    ]}]});
    json!({
        "flags": flags,
        "group_type_mapping": {"0": GROUP_KEYS[0], "1": GROUP_KEYS[1]},
        "cohorts": {COHORT_ID.to_string(): cohort_rules},
    })
}
