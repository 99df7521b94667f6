//! Flags made from other files than the project's flag file: the targeting flags of its
//! surveys (see `crate::projects::surveys`). They are appended to the file's flags before
//! compiling, so `/decide` and `/flags` answer them like any flag, and are left out of
//! the local-evaluation feed, as PostHog leaves survey flags out of it.

use std::collections::HashSet;

use serde_json::Value;

use super::compile::ProjectRules;
use super::error::{CompileError, ErrorKind};

/// Compiles `file` (a flag file's bytes; `None` for a project without one) with the
/// `generated` definitions appended. A generated flag whose key the file already defines
/// is dropped: the operator's definition wins. A generated id that the file uses is moved
/// to the next free one, so ids stay unique, wrapping within PostHog's 32-bit range.
pub(super) fn compile(
    file: Option<&[u8]>,
    generated: &[Value],
) -> Result<ProjectRules, CompileError> {
    let original: Value = match file {
        Some(bytes) => serde_json::from_slice(bytes)
            .map_err(|e| CompileError::new(String::new(), ErrorKind::Json(e.to_string())))?,
        None => serde_json::json!({"flags": [], "group_type_mapping": {}, "cohorts": {}}),
    };
    let mut merged = original.clone();
    let Some(flags) = merged.get_mut("flags").and_then(Value::as_array_mut) else {
        // Not the expected shape: compiling the file alone reports where.
        return ProjectRules::from_value(original);
    };
    let mut keys: HashSet<String> = flags.iter().filter_map(key).collect();
    let mut ids: HashSet<i64> = flags.iter().filter_map(|f| f.get("id")?.as_i64()).collect();
    for flag in generated {
        let Some(k) = key(flag) else { continue };
        if !keys.insert(k) {
            continue;
        }
        let mut flag = flag.clone();
        if let Some(mut id) = flag.get("id").and_then(Value::as_i64) {
            while !ids.insert(id) {
                id = if id >= i64::from(i32::MAX) { 1 } else { id + 1 };
            }
            flag["id"] = Value::from(id);
        }
        flags.push(flag);
    }
    Ok(ProjectRules::from_value(merged)?.with_feed(original))
}

fn key(flag: &Value) -> Option<String> {
    Some(flag.get("key")?.as_str()?.to_owned())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::flags::Context;

    fn survey_flag(key: &str, id: i64) -> Value {
        json!({"id": id, "key": key, "active": true,
               "filters": {"groups": [{"variant": "", "rollout_percentage": 100, "properties": [
                   {"key": "$survey_dismissed/s1", "value": "is_not_set", "operator": "is_not_set", "type": "person"}]}]}})
    }

    fn enabled(
        rules: &ProjectRules,
        key: &str,
        person: &serde_json::Map<String, Value>,
    ) -> Option<bool> {
        result(rules, key, person).map(|f| f.enabled)
    }

    fn result(
        rules: &ProjectRules,
        key: &str,
        person: &serde_json::Map<String, Value>,
    ) -> Option<crate::flags::FlagResult> {
        let groups = serde_json::Map::new();
        let group_properties = Default::default();
        let ctx = Context {
            distinct_id: "d",
            anon_distinct_id: None,
            hash_key_override: None,
            person_properties: Some(person),
            groups: &groups,
            group_properties: &group_properties,
            now: time::OffsetDateTime::now_utc(),
        };
        let eval = rules.evaluate(&ctx);
        eval.flags.into_iter().find(|f| f.key == key)
    }

    #[test]
    fn generated_flags_are_evaluated_but_not_fed_to_sdks() {
        let file = br#"{"flags": [{"id": 7, "key": "own", "active": true,
                        "filters": {"groups": [{"rollout_percentage": 100}]}}]}"#;
        let rules = compile(Some(file), &[survey_flag("survey-targeting-a", 7)]).unwrap();
        assert_eq!(rules.flag_count(), 2);
        let none = serde_json::Map::new();
        assert_eq!(enabled(&rules, "survey-targeting-a", &none), Some(true));
        let mut dismissed = serde_json::Map::new();
        dismissed.insert("$survey_dismissed/s1".into(), json!(true));
        assert_eq!(
            enabled(&rules, "survey-targeting-a", &dismissed),
            Some(false)
        );
        let feed = rules.definitions_json()["flags"].as_array().unwrap();
        assert_eq!(feed.len(), 1, "the feed is the file as written");
    }

    #[test]
    fn the_file_wins_a_shared_key_and_ids_stay_unique() {
        let file = br#"{"flags": [{"id": 1, "key": "survey-targeting-a", "active": false,
                        "filters": {"groups": []}}]}"#;
        let rules = compile(Some(file), &[survey_flag("survey-targeting-a", 1)]).unwrap();
        assert_eq!(rules.flag_count(), 1);
        let rules = compile(
            Some(br#"{"flags": [{"id": 1, "key": "x", "filters": {"groups": []}}]}"#),
            &[survey_flag("survey-targeting-b", 1)],
        )
        .unwrap();
        assert_eq!(rules.flag_count(), 2);
        let alone = compile(None, &[survey_flag("survey-targeting-c", 3)]).unwrap();
        assert_eq!(alone.flag_count(), 1);
    }

    /// A moved id wraps within PostHog's 32-bit range rather than leaving it.
    #[test]
    fn a_moved_id_stays_a_32_bit_id() {
        let top = i64::from(i32::MAX);
        let file = format!(
            r#"{{"flags": [{{"id": {top}, "key": "top", "active": true, "filters": {{"groups": []}}}},
                          {{"id": 1, "key": "one", "active": true, "filters": {{"groups": []}}}}]}}"#
        );
        let rules = compile(
            Some(file.as_bytes()),
            &[survey_flag("survey-targeting-d", top)],
        )
        .unwrap();
        let none = serde_json::Map::new();
        let moved = result(&rules, "survey-targeting-d", &none).unwrap();
        assert_eq!(moved.id, 2);
    }
}
