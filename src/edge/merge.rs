//! Upstream's answer for the flags the edge left to it, written into the edge's own
//! answer in the version the client asked for: the v4 (`/flags?v=2`) detail objects as
//! upstream sent them (value, payload, reason and metadata), and in the older shapes the
//! values and payloads derived from them as each version writes them. Upstream wins for
//! its keys; every other flag keeps the edge's answer. An answer saying the project is
//! over its flag quota (`quotaLimited: ["feature_flags"]`) stands for the whole body:
//! no flags, as PostHog answers then.

use serde_json::{Map, Value};

use super::fallback::Flags;

/// The body `local` (the edge's answer in `version`'s shape, the flags left to upstream
/// absent) with upstream's `answer` for each key `takes` accepts (or, when it is
/// quota-limited, with no flags and its `quotaLimited`); without an answer, `local`
/// with `errorsWhileComputingFlags` set. `local` comes back unchanged if it is
/// not a JSON object (it always is: the edge wrote it).
pub fn merge(
    version: u8,
    local: Vec<u8>,
    answer: Option<&Flags>,
    takes: impl Fn(&str) -> bool,
) -> Vec<u8> {
    let Ok(mut body) = serde_json::from_slice::<Map<String, Value>>(&local) else {
        return local;
    };
    let errors = match answer {
        Some(Flags {
            quota_limited: Some(limited),
            errors,
            ..
        }) => {
            quota_limited(&mut body, limited);
            *errors
        }
        Some(answer) => {
            for (key, detail) in answer.flags.iter().filter(|(k, _)| takes(k)) {
                apply(version, &mut body, key, detail);
            }
            answer.errors
        }
        None => true,
    };
    if body.contains_key("errorsWhileComputingFlags") {
        body.insert("errorsWhileComputingFlags".into(), Value::Bool(errors));
    }
    serde_json::to_vec(&body).unwrap_or(local)
}

/// Upstream says the project is over its flag quota: as PostHog's flags service
/// answers then, no flag at all (the edge's own included, so its rules do not get
/// round the quota) and upstream's `quotaLimited`, in whichever shape was asked for.
fn quota_limited(body: &mut Map<String, Value>, limited: &Value) {
    for (member, value) in body.iter_mut() {
        match (member.as_str(), value) {
            ("featureFlags", Value::Array(keys)) => keys.clear(),
            ("featureFlags" | "featureFlagPayloads" | "flags", Value::Object(flags)) => {
                flags.clear()
            }
            _ => {}
        }
    }
    body.insert("quotaLimited".into(), limited.clone());
}

/// One upstream flag into the body.
fn apply(version: u8, body: &mut Map<String, Value>, key: &str, detail: &Value) {
    let enabled = detail.get("enabled") == Some(&Value::Bool(true));
    let value = match detail.get("variant") {
        Some(Value::String(variant)) if enabled => Value::String(variant.clone()),
        _ => Value::Bool(enabled),
    };
    let payload = detail
        .get("metadata")
        .and_then(|m| m.get("payload"))
        .filter(|p| enabled && !p.is_null());
    match version {
        0 | 1 => {
            if let Some(Value::Array(keys)) = body.get_mut("featureFlags") {
                keys.retain(|k| k.as_str() != Some(key));
                if enabled {
                    keys.push(Value::String(key.to_owned()));
                }
            }
        }
        2 => {
            if let Some(Value::Object(values)) = body.get_mut("featureFlags") {
                if enabled {
                    values.insert(key.to_owned(), value);
                } else {
                    values.shift_remove(key);
                }
            }
        }
        3 => {
            if let Some(Value::Object(values)) = body.get_mut("featureFlags") {
                values.insert(key.to_owned(), value);
            }
            if let Some(Value::Object(payloads)) = body.get_mut("featureFlagPayloads") {
                match payload {
                    Some(payload) => {
                        payloads.insert(key.to_owned(), payload.clone());
                    }
                    None => {
                        payloads.shift_remove(key);
                    }
                }
            }
        }
        _ => {
            if let Some(Value::Object(flags)) = body.get_mut("flags") {
                flags.insert(key.to_owned(), detail.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn upstream() -> Flags {
        let detail = |enabled: bool, variant: Value, payload: Value| {
            json!({"key": "x", "enabled": enabled, "variant": variant,
                   "reason": {"code": "condition_match", "condition_index": 0, "description": "Matched condition set 1"},
                   "metadata": {"id": 1, "version": 1, "description": null, "payload": payload}})
        };
        let Value::Object(flags) = json!({
            "on": detail(true, json!("blue"), json!({"a": 1})),
            "off": detail(false, Value::Null, json!("ignored")),
            "other": detail(true, Value::Null, Value::Null),
        }) else {
            unreachable!()
        };
        Flags {
            flags,
            errors: false,
            quota_limited: None,
        }
    }

    fn merged(version: u8, local: Value, answer: Option<&Flags>) -> Value {
        let out = merge(version, serde_json::to_vec(&local).unwrap(), answer, |k| {
            k != "other"
        });
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn each_version_takes_upstreams_values_for_its_keys_only() {
        let answer = upstream();
        let v1 = merged(1, json!({"featureFlags": ["off", "kept"]}), Some(&answer));
        assert_eq!(v1["featureFlags"], json!(["kept", "on"]));
        let v2 = merged(2, json!({"featureFlags": {"off": true}}), Some(&answer));
        assert_eq!(v2["featureFlags"], json!({"on": "blue"}));
        let local = json!({"featureFlags": {"kept": false}, "featureFlagPayloads": {"off": 1},
                           "errorsWhileComputingFlags": true});
        let v3 = merged(3, local, Some(&answer));
        assert_eq!(
            v3["featureFlags"],
            json!({"kept": false, "on": "blue", "off": false})
        );
        assert_eq!(v3["featureFlagPayloads"], json!({"on": {"a": 1}}));
        assert_eq!(v3["errorsWhileComputingFlags"], false);
        let v4 = merged(
            4,
            json!({"flags": {}, "errorsWhileComputingFlags": true}),
            Some(&answer),
        );
        assert_eq!(v4["flags"]["on"], answer.flags["on"]);
        assert_eq!(v4["flags"]["off"], answer.flags["off"]);
        assert!(v4["flags"].get("other").is_none());
    }

    #[test]
    fn a_quota_limited_answer_leaves_no_flag_in_any_version() {
        let answer = Flags {
            flags: Map::new(),
            errors: false,
            quota_limited: Some(json!(["feature_flags"])),
        };
        let locals = [
            (
                1,
                json!({"featureFlags": ["kept"], "sessionRecording": false}),
            ),
            (
                2,
                json!({"featureFlags": {"kept": true}, "sessionRecording": false}),
            ),
            (
                3,
                json!({"featureFlags": {"kept": true}, "featureFlagPayloads": {"kept": 1},
                       "errorsWhileComputingFlags": true, "sessionRecording": false}),
            ),
            (
                4,
                json!({"flags": {"kept": {"enabled": true}}, "errorsWhileComputingFlags": true,
                       "sessionRecording": false}),
            ),
        ];
        for (version, local) in locals {
            let out = merged(version, local, Some(&answer));
            assert_eq!(out["quotaLimited"], json!(["feature_flags"]), "{version}");
            assert_eq!(out["sessionRecording"], false, "{version}: config kept");
            let flags = out.get("flags").unwrap_or(&out["featureFlags"]);
            assert!(
                flags
                    .as_array()
                    .map(Vec::len)
                    .unwrap_or_else(|| flags.as_object().unwrap().len())
                    == 0,
                "{version}: {out}"
            );
            if let Some(payloads) = out.get("featureFlagPayloads") {
                assert_eq!(payloads, &json!({}));
            }
            if let Some(errors) = out.get("errorsWhileComputingFlags") {
                assert_eq!(errors, false);
            }
        }
    }

    #[test]
    fn without_an_answer_the_local_answer_stands_with_errors_set() {
        let local = json!({"flags": {"kept": {"enabled": true}}, "errorsWhileComputingFlags": false, "requestId": "r"});
        let out = merged(4, local.clone(), None);
        assert_eq!(out["flags"], local["flags"]);
        assert_eq!(out["requestId"], "r");
        assert_eq!(out["errorsWhileComputingFlags"], true);
        let failed = Flags {
            errors: true,
            ..upstream()
        };
        assert_eq!(
            merged(4, local, Some(&failed))["errorsWhileComputingFlags"],
            true
        );
    }
}
