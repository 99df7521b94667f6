//! The flags PostHog creates for a survey, built the same way here so posthog-js finds
//! them in `/flags`:
//! - the internal targeting flag (`survey-targeting-<hex>-custom`), on for everyone
//!   except persons with `$survey_dismissed/<key>` or `$survey_responded/<key>` set, the
//!   properties posthog-js `$set`s with `survey dismissed` and `survey sent`; `<key>` is
//!   the survey id, plus `/<iteration>` for a repeating survey;
//! - the targeting flag (`survey-targeting-<hex>`) when the file gives
//!   `targeting_flag_filters`, with those filters.
//!
//! Both are active exactly while the survey is (PostHog switches them with its dates).
//! Keys and ids derive from the survey id, so they stay the same across reloads.

use serde_json::{json, Map, Value};
use sha1::{Digest, Sha1};

/// PostHog's prefix for flags it creates for surveys; posthog-js recognises it.
const PREFIX: &str = "survey-targeting-";

/// Generated flag ids lie in the upper half of PostHog's 32-bit id range, from 2^30 to
/// 2^31 - 1: above the ids of hand-written or exported flags, and still ids that SDKs
/// reading PostHog's `i32` (posthog-rs, the mobile SDKs) can parse.
const ID_BASE: i64 = 1 << 30;

fn sha1(input: &str) -> [u8; 20] {
    Sha1::digest(input.as_bytes()).into()
}

/// Ten hex digits, as PostHog's random part has.
fn hex10(input: &str) -> String {
    sha1(input)[..5]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The internal targeting flag's key when the file does not name one.
pub fn internal_key(survey: &str) -> String {
    format!("{PREFIX}{}-custom", hex10(survey))
}

/// The targeting flag's key when the file gives filters but no key.
pub fn targeting_key(survey: &str) -> String {
    format!("{PREFIX}{}", hex10(survey))
}

/// A stable flag id for a generated key.
fn flag_id(key: &str) -> i64 {
    let d = sha1(key);
    let n = u64::from_be_bytes([0, 0, d[0], d[1], d[2], d[3], d[4], d[5]]);
    ID_BASE + (n as i64 & (ID_BASE - 1))
}

/// A stable question id (a name-based UUID) for a question the file gives none.
pub fn question_id(survey: &str, index: usize) -> String {
    let d = sha1(&format!("{survey}/question/{index}"));
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&d[..16]);
    uuid::Builder::from_sha1_bytes(bytes)
        .into_uuid()
        .to_string()
}

/// The person properties posthog-js sets when the survey is answered or dismissed.
pub fn interaction_properties(survey: &str, iteration: Option<u64>) -> [String; 2] {
    let key = match iteration {
        Some(n) => format!("{survey}/{n}"),
        None => survey.to_owned(),
    };
    [
        format!("$survey_dismissed/{key}"),
        format!("$survey_responded/{key}"),
    ]
}

/// The internal targeting flag, in the flag file format.
pub fn internal_flag(
    key: &str,
    name: &str,
    survey: &str,
    iteration: Option<u64>,
    active: bool,
) -> Value {
    let properties: Vec<Value> = interaction_properties(survey, iteration)
        .into_iter()
        .map(|property| {
            json!({"key": property, "value": "is_not_set", "operator": "is_not_set", "type": "person"})
        })
        .collect();
    let filters =
        json!({"groups": [{"variant": "", "rollout_percentage": 100, "properties": properties}]});
    flag(key, name, active, filters)
}

/// The targeting flag made from the file's `targeting_flag_filters`.
pub fn targeting_flag(key: &str, name: &str, filters: &Map<String, Value>, active: bool) -> Value {
    flag(key, name, active, Value::Object(filters.clone()))
}

fn flag(key: &str, name: &str, active: bool, filters: Value) -> Value {
    json!({
        "id": flag_id(key),
        "key": key,
        "name": format!("Targeting flag for survey {name}"),
        "active": active,
        "deleted": false,
        "ensure_experience_continuity": false,
        "filters": filters,
    })
}

/// Whether a generated flag compiles on its own: the field path under its `filters`
/// and what is wrong, if not. References to cohorts or other flags are resolved only with
/// the project's flag file, so they are not held against it here.
pub fn check(flag: &Value) -> Result<(), (String, String)> {
    let mut flag = flag.clone();
    // Compile as active even for a stopped survey: the filters must be valid either way.
    flag["active"] = Value::Bool(true);
    // A filter the evaluator cannot read disables only its flag (a warning, not an
    // error, for a flags file); a survey's own filters must all be readable.
    let error = match crate::flags::ProjectRules::from_value(json!({"flags": [flag]})) {
        Ok(rules) => match rules.warnings().first() {
            Some(w) => w.clone(),
            None => return Ok(()),
        },
        Err(e) => e,
    };
    let field = error
        .field()
        .strip_prefix("filters")
        .unwrap_or(error.field());
    Err((field.to_owned(), error.kind().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_ids_are_stable_and_shaped_like_posthogs() {
        let key = internal_key("0190c6a4-1b2c-7000-8000-000000000001");
        assert_eq!(key, internal_key("0190c6a4-1b2c-7000-8000-000000000001"));
        assert!(key.starts_with("survey-targeting-") && key.ends_with("-custom"));
        assert_eq!(key.len(), "survey-targeting-".len() + 10 + "-custom".len());
        let id = flag_id(&key);
        assert!((ID_BASE..=i64::from(i32::MAX)).contains(&id));
        let q = question_id("s", 0);
        assert_eq!(q, question_id("s", 0));
        assert_ne!(q, question_id("s", 1));
        assert_eq!(uuid::Uuid::parse_str(&q).unwrap().get_version_num(), 5);
    }

    #[test]
    fn the_internal_flag_excludes_who_answered_or_dismissed() {
        let flag = internal_flag("survey-targeting-x-custom", "NPS", "s1", None, true);
        assert_eq!(
            flag["filters"],
            json!({"groups": [{"variant": "", "rollout_percentage": 100, "properties": [
                {"key": "$survey_dismissed/s1", "value": "is_not_set", "operator": "is_not_set", "type": "person"},
                {"key": "$survey_responded/s1", "value": "is_not_set", "operator": "is_not_set", "type": "person"}]}]})
        );
        assert_eq!(flag["name"], "Targeting flag for survey NPS");
        let repeating = interaction_properties("s1", Some(3));
        assert_eq!(
            repeating,
            ["$survey_dismissed/s1/3", "$survey_responded/s1/3"]
        );
        assert_eq!(check(&flag), Ok(()));
    }

    #[test]
    fn broken_targeting_filters_name_the_field() {
        let filters = json!({"groups": [{"properties": [{"key": "plan", "value": "pro", "operator": "nope", "type": "person"}]}]});
        let flag = targeting_flag("k", "n", filters.as_object().unwrap(), false);
        let (field, message) = check(&flag).unwrap_err();
        assert_eq!(field, ".groups[0].properties[0].operator");
        assert_eq!(message, "unknown operator \"nope\"");
    }
}
