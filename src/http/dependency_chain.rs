//! The definitions feed's flag dependencies, as PostHog serves them: every filter of
//! `type: "flag"` in a flag's condition groups names its target by key (PostHog's
//! editor stores the target's id, which is rewritten to the key) and carries
//! `dependency_chain`, the keys to evaluate in order, dependencies first and the
//! target last. A chain that meets a cycle or a missing flag is empty, which the SDKs
//! read as "cannot be evaluated locally". Without it posthog-node and posthog-python
//! refuse to evaluate a dependent flag locally at all.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

/// Chains longer than this are given up (an empty chain: the SDK asks the server), so
/// a hand-written file cannot make the walk deep or slow; real chains are a handful
/// of flags long.
const MAX_CHAIN: usize = 100;

/// Rewrite the flag filters of `flags` (the feed's `flags` array) in place.
pub fn add(flags: &mut [Value]) {
    let id_to_key: HashMap<String, String> = flags
        .iter()
        .filter_map(|f| Some((id_string(&f["id"])?, f["key"].as_str()?.to_owned())))
        .collect();
    let mut any = false;
    for flag in flags.iter_mut() {
        for filter in flag_filters_mut(flag) {
            let target = match &filter["key"] {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => continue,
            };
            let key = id_to_key.get(&target).cloned().unwrap_or(target);
            filter["key"] = Value::String(key);
            any = true;
        }
    }
    if !any {
        return;
    }
    // Each flag's direct dependencies, by key.
    let graph: HashMap<String, Vec<String>> = flags
        .iter()
        .filter_map(|f| {
            let key = f["key"].as_str()?.to_owned();
            let deps = flag_filters(f)
                .filter_map(|p| p["key"].as_str().map(str::to_owned))
                .collect();
            Some((key, deps))
        })
        .collect();
    let mut memo: HashMap<String, Vec<String>> = HashMap::new();
    for flag in flags.iter_mut() {
        for filter in flag_filters_mut(flag) {
            let Some(target) = filter["key"].as_str().map(str::to_owned) else {
                continue;
            };
            let chain = memo
                .entry(target.clone())
                .or_insert_with(|| chain(&graph, &target))
                .clone();
            filter["dependency_chain"] =
                Value::Array(chain.into_iter().map(Value::String).collect());
        }
    }
}

/// The evaluation order for `target`: a depth-first walk that puts each flag after
/// its dependencies. Empty on a cycle (a self-dependency included) or a missing flag.
fn chain(graph: &HashMap<String, Vec<String>>, target: &str) -> Vec<String> {
    fn visit(
        graph: &HashMap<String, Vec<String>>,
        key: &str,
        done: &mut HashSet<String>,
        open: &mut HashSet<String>,
        out: &mut Vec<String>,
    ) -> bool {
        if done.contains(key) {
            return true;
        }
        if open.len() >= MAX_CHAIN || !open.insert(key.to_owned()) {
            return false; // too deep, or a cycle
        }
        let Some(deps) = graph.get(key) else {
            return false; // a missing flag
        };
        for dep in deps {
            if !visit(graph, dep, done, open, out) {
                return false;
            }
        }
        open.remove(key);
        done.insert(key.to_owned());
        out.push(key.to_owned());
        true
    }
    let mut out = Vec::new();
    let ok = visit(
        graph,
        target,
        &mut HashSet::new(),
        &mut HashSet::new(),
        &mut out,
    );
    if ok {
        out
    } else {
        Vec::new()
    }
}

fn id_string(id: &Value) -> Option<String> {
    match id {
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.clone()),
        _ => None,
    }
}

/// The `type: "flag"` filters of a flag's condition groups.
fn flag_filters(flag: &Value) -> impl Iterator<Item = &Value> {
    flag["filters"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g["properties"].as_array())
        .flatten()
        .filter(|p| p["type"] == "flag")
}

fn flag_filters_mut(flag: &mut Value) -> Vec<&mut Value> {
    let Some(groups) = flag
        .get_mut("filters")
        .and_then(|f| f.get_mut("groups"))
        .and_then(Value::as_array_mut)
    else {
        return Vec::new();
    };
    groups
        .iter_mut()
        .filter_map(|g| g.get_mut("properties").and_then(Value::as_array_mut))
        .flatten()
        .filter(|p| p["type"] == "flag")
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn flag(id: i64, key: &str, deps: &[Value]) -> Value {
        let properties: Vec<Value> = deps
            .iter()
            .map(|d| json!({"key": d, "type": "flag", "value": true, "operator": "flag_evaluates_to"}))
            .collect();
        json!({"id": id, "key": key, "active": true,
               "filters": {"groups": [{"properties": properties, "rollout_percentage": 100}]}})
    }

    fn chains(flags: &[Value], key: &str) -> Vec<Value> {
        let f = flags.iter().find(|f| f["key"] == key).unwrap();
        flag_filters(f)
            .map(|p| json!([p["key"], p["dependency_chain"]]))
            .collect()
    }

    #[test]
    fn ids_become_keys_and_chains_run_dependencies_first() {
        let mut flags = vec![
            flag(1, "base", &[]),
            flag(2, "middle", &[json!("1")]),
            flag(3, "top", &[json!(2), json!("base")]),
        ];
        add(&mut flags);
        assert_eq!(chains(&flags, "middle"), vec![json!(["base", ["base"]])]);
        assert_eq!(
            chains(&flags, "top"),
            vec![
                json!(["middle", ["base", "middle"]]),
                json!(["base", ["base"]])
            ]
        );
        assert!(flags[0]["filters"]["groups"][0]["properties"]
            .as_array()
            .unwrap()
            .is_empty());
    }

    #[test]
    fn cycles_and_missing_flags_get_empty_chains() {
        let mut flags = vec![
            flag(1, "a", &[json!("b")]),
            flag(2, "b", &[json!("a")]),
            flag(3, "self", &[json!("self")]),
            flag(4, "orphan", &[json!("gone")]),
            flag(5, "on-cycle", &[json!("a")]),
        ];
        add(&mut flags);
        assert_eq!(chains(&flags, "a"), vec![json!(["b", []])]);
        assert_eq!(chains(&flags, "self"), vec![json!(["self", []])]);
        assert_eq!(chains(&flags, "orphan"), vec![json!(["gone", []])]);
        assert_eq!(chains(&flags, "on-cycle"), vec![json!(["a", []])]);
    }

    #[test]
    fn very_long_chains_are_given_up() {
        let mut flags: Vec<Value> = (0..=MAX_CHAIN as i64)
            .map(|i| flag(i, &format!("f{i}"), &[json!(format!("f{}", i + 1))]))
            .collect();
        flags.push(flag(
            MAX_CHAIN as i64 + 1,
            &format!("f{}", MAX_CHAIN + 1),
            &[],
        ));
        add(&mut flags);
        assert_eq!(chains(&flags, "f0"), vec![json!(["f1", []])]);
        let last = format!("f{}", MAX_CHAIN);
        let end = format!("f{}", MAX_CHAIN + 1);
        assert_eq!(chains(&flags, &last), vec![json!([end, [end]])]);
    }

    #[test]
    fn flags_without_dependencies_are_untouched() {
        let mut flags = vec![flag(1, "plain", &[])];
        let before = flags.clone();
        add(&mut flags);
        assert_eq!(flags, before);
    }
}
