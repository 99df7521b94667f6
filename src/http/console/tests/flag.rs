use serde_json::Map;

use super::*;
use crate::store::keys;

/// Persons with and without `plan`, `email` and a key needing escapes, some whose
/// first distinct id is not their latest, one with no distinct id, and stored bytes
/// that are not a person.
fn stored(n: u32) -> (tempfile::TempDir, Trees) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let trees = Trees::open(&db, dir.path()).unwrap();
    for i in 0..n {
        let name = format!("user-{i}");
        let properties = match i % 6 {
            0 => json!({"plan": "pro", "email": "a@acme.com"}),
            1 => json!({"plan": "free"}),
            2 => json!({"email": "b@example.com", "we\"ird\\key": "x"}),
            3 => json!({"nested": {"plan": "pro"}}),
            4 => json!({"plan": null}),
            _ => json!({}),
        };
        let mut ids = vec![name.clone()];
        if i % 4 == 1 {
            ids.push(format!("later-{i}"));
        }
        if i % 17 == 16 {
            ids.clear();
        }
        let p = Person {
            id: crate::persons::id_for(1, &name),
            created_at: i64::from(i),
            properties: properties.as_object().unwrap().clone(),
            distinct_ids: ids,
            is_identified: false,
            first_distinct_id: name,
        };
        let bytes = match i % 19 {
            18 => b"[\"not a person\"]".to_vec(),
            _ => serde_json::to_vec(&p).unwrap(),
        };
        trees
            .persons
            .insert(keys::with_uuid(1, p.id), bytes)
            .unwrap();
    }
    (dir, trees)
}

fn person_filter(key: &str, operator: &str, value: Value) -> Value {
    json!({"key": key, "operator": operator, "value": value, "type": "person"})
}

fn flag(id: u32, key: &str, filters: Value) -> Value {
    json!({"id": id, "key": key, "active": true, "filters": filters})
}

fn rules() -> ProjectRules {
    let plan_set = person_filter("plan", "is_set", json!("is_set"));
    let groups = |props: Value, rollout: u32| json!({"groups": [{"properties": props, "rollout_percentage": rollout}]});
    let definitions = json!({
        "flags": [
            flag(1, "plan-set", groups(json!([plan_set]), 30)),
            flag(2, "pro-or-email", json!({"groups": [
                {"properties": [person_filter("plan", "exact", json!(["pro"]))], "rollout_percentage": 100},
                {"properties": [person_filter("email", "icontains", json!("example"))], "rollout_percentage": 50}]})),
            flag(3, "no-plan", groups(json!([person_filter("plan", "is_not_set", json!("is_not_set"))]), 100)),
            flag(4, "after-plan-set", groups(json!([
                {"key": "1", "type": "flag", "value": true, "operator": "flag_evaluates_to"},
                person_filter("email", "is_set", json!("is_set"))]), 100)),
            flag(5, "held-out", json!({"groups": [{"properties": [plan_set], "rollout_percentage": 100}],
                "holdout": {"id": 7, "exclusion_percentage": 50}})),
            flag(6, "split", json!({"groups": [{"properties": [plan_set], "rollout_percentage": 100}],
                "multivariate": {"variants": [{"key": "a", "rollout_percentage": 50},
                                             {"key": "b", "rollout_percentage": 50}]}})),
            flag(7, "escaped", groups(json!([person_filter("we\"ird\\key", "exact", json!(["x"]))]), 100)),
            flag(8, "by-id", groups(json!([person_filter("distinct_id", "icontains", json!("later"))]), 100)),
            {"id": 9, "key": "continuity", "active": true, "ensure_experience_continuity": true,
             "filters": {"groups": [{"properties": [plan_set], "rollout_percentage": 50}]}},
            flag(10, "pro-cohort", groups(json!([{"key": "id", "type": "cohort", "value": 42}]), 100)),
            flag(11, "not-pro", groups(json!([person_filter("plan", "not_icontains", json!("pro"))]), 100)),
            flag(12, "everyone", groups(json!([]), 40)),
            {"id": 13, "key": "off", "active": false, "filters": {"groups": [{"properties": [plan_set], "rollout_percentage": 100}]}},
        ],
        "cohorts": {"42": {"type": "OR", "values": [{"type": "AND", "values": [
            person_filter("plan", "exact", json!(["pro"]))]}]}},
    });
    ProjectRules::from_value(definitions).unwrap()
}

/// The reach as it was found before: every person decoded, every flag evaluated.
fn plain_reach(trees: &Trees, rules: &ProjectRules, key: &str, now: time::OffsetDateTime) -> Value {
    let (groups, group_properties) = (Map::new(), Default::default());
    let mut values: BTreeMap<String, u64> = BTreeMap::new();
    let mut examples = Vec::new();
    let (mut scanned, mut reached) = (0u64, 0u64);
    for entry in trees.persons.scan_prefix(keys::project(1)) {
        let (_, bytes) = entry.unwrap();
        let Ok(person) = serde_json::from_slice::<Person>(&bytes) else {
            continue;
        };
        let Some(id) = person.distinct_ids.last() else {
            continue;
        };
        scanned += 1;
        let ctx = Context {
            distinct_id: id,
            anon_distinct_id: None,
            hash_key_override: Some(person.first_distinct_id.as_str()).filter(|f| *f != id),
            person_properties: Some(&person.properties),
            groups: &groups,
            group_properties: &group_properties,
            now,
        };
        let eval = rules.evaluate(&ctx);
        let Some(f) = eval.flags.iter().find(|f| f.key == key && f.enabled) else {
            continue;
        };
        reached += 1;
        *values
            .entry(f.variant.clone().unwrap_or_else(|| "true".into()))
            .or_default() += 1;
        if examples.len() < REACH_EXAMPLES {
            examples.push(person_json(&person));
        }
    }
    json!({"scanned": scanned, "complete": true, "reached": reached, "values": values, "examples": examples})
}

#[test]
fn a_flags_reach_is_the_whole_files_answer() {
    let (_dir, trees) = stored(300);
    let rules = rules();
    let now = crate::flags::now();
    let keys = [
        "plan-set",
        "pro-or-email",
        "no-plan",
        "after-plan-set",
        "held-out",
        "split",
        "escaped",
        "by-id",
        "continuity",
        "pro-cohort",
        "not-pro",
        "everyone",
        "off",
        "missing",
    ];
    for key in keys {
        let got = reach_of(&trees, 1, &rules, key, now).unwrap();
        let want = plain_reach(&trees, &rules, key, now);
        assert_eq!(got, want, "{key}");
        if ["plan-set", "split", "pro-or-email"].contains(&key) {
            assert!(
                want["reached"].as_u64().unwrap() > 0,
                "{key} reaches someone"
            );
        }
    }
    // The fast paths are taken where they apply, and only there.
    let alone_ok = |key| alone(&rules, key).is_some();
    assert!(alone_ok("plan-set") && alone_ok("held-out") && alone_ok("continuity"));
    assert!(!alone_ok("after-plan-set") && !alone_ok("pro-cohort") && !alone_ok("missing"));
    assert_eq!(
        needed_keys(&rules, "plan-set"),
        Some(vec!["plan".to_string()])
    );
    assert_eq!(
        needed_keys(&rules, "pro-or-email"),
        Some(vec!["plan".into(), "email".into()])
    );
    assert_eq!(
        needed_keys(&rules, "after-plan-set"),
        Some(vec!["email".into()])
    );
    assert_eq!(
        needed_keys(&rules, "escaped"),
        Some(vec!["we\"ird\\key".into()])
    );
    for key in [
        "no-plan",
        "held-out",
        "by-id",
        "not-pro",
        "everyone",
        "pro-cohort",
    ] {
        assert_eq!(needed_keys(&rules, key), None, "{key}");
    }
}
