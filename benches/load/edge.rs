//! The wrk scenario's edge cases (`--edge`): a flagpost serving `/decide` in edge mode
//! (`--upstream`) in front of another flagpost on the same rules, measured beside the
//! plain one. Two figures: requests whose every flag the edge decides (the decide bodies
//! naming, in `flag_keys`, the flags it can decide for them), and posthog-js's requests
//! for every flag, which on the 50-flag file include an experience-continuity flag and
//! so cost one upstream `/flags` call each.

use std::collections::HashMap;
use std::path::Path;

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::target::{Options, Target};

/// An upstream flagpost and an edge in front of it, both on `data_dir`'s rules.
pub fn start(data_dir: &Path, dir: &Path) -> Result<(Target, Target), String> {
    let binary = Path::new(env!("CARGO_BIN_EXE_flagpost"));
    let upstream = Target::flagpost_at("upstream", binary, data_dir, &dir.join("wrk-upstream-db"))?;
    let options = Options {
        args: vec!["--upstream".into(), format!("http://{}", upstream.addr)],
        env: Vec::new(),
    };
    let edge = Target::flagpost_with("edge", binary, data_dir, &dir.join("wrk-edge-db"), &options)?;
    Ok((upstream, edge))
}

/// `bodies` each naming the flags the edge decides for the first of them (the bodies
/// differ in values, not in which properties they carry, so the same flags hold for all).
pub fn conclusive(bodies: &[Bytes]) -> Result<Vec<Bytes>, String> {
    let first: Value = bodies
        .first()
        .and_then(|b| serde_json::from_slice(b).ok())
        .ok_or("no decide body")?;
    let keys = conclusive_keys(&first)?;
    bodies
        .iter()
        .map(|body| {
            let mut body: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
            body["flag_keys"] = keys.clone().into();
            Ok(Bytes::from(body.to_string()))
        })
        .collect()
}

fn conclusive_keys(body: &Value) -> Result<Vec<String>, String> {
    let rules = flagpost::flags::ProjectRules::from_value(crate::flags::definitions())
        .map_err(|e| e.to_string())?;
    let object = |v: &Value| v.as_object().cloned().unwrap_or_default();
    let person = object(&body["person_properties"]);
    let groups = object(&body["groups"]);
    let mut group_properties: HashMap<String, Option<Map<String, Value>>> = HashMap::new();
    for name in groups.keys() {
        group_properties.insert(name.clone(), Some(object(&body["group_properties"][name])));
    }
    let ctx = flagpost::flags::Context {
        distinct_id: body["distinct_id"].as_str().ok_or("no distinct id")?,
        anon_distinct_id: body["$anon_distinct_id"].as_str(),
        hash_key_override: None,
        person_properties: Some(&person),
        groups: &groups,
        group_properties: &group_properties,
        now: flagpost::flags::now(),
    };
    let outcomes = rules.outcomes(&ctx);
    let verdicts = rules.inconclusive(&ctx, &outcomes);
    Ok(rules
        .keys()
        .zip(verdicts)
        .filter(|(_, out)| !out)
        .map(|(key, _)| key.to_owned())
        .collect())
}
