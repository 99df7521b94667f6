//! The `/decide` (v1 to v4) and `/flags` response bodies. Each client version parses its own
//! shape, so the flags part differs per version while the common fields (remote config the
//! clients expect to find, all switched off) are the same everywhere.

use serde_json::{json, Map, Value};
use uuid::Uuid;

use super::result::{Evaluation, FlagResult};

/// Compression schemes the capture endpoints accept, advertised so clients compress.
const SUPPORTED_COMPRESSION: [&str; 3] = ["gzip", "gzip-js", "lz64"];

/// The response body for `/decide?v=<version>`; `/flags` uses version 4. Version 0 (no
/// `v`) reads as 1 and versions above 4 as 4, the newest shape.
///
/// `quotaLimited` is not written: add it to the returned object when a quota applies.
pub fn response(version: u8, eval: &Evaluation, request_id: Uuid) -> Value {
    let mut body = Map::new();
    match version {
        0 | 1 => {
            let keys: Vec<Value> = enabled(eval)
                .map(|f| Value::String(f.key.clone()))
                .collect();
            body.insert("featureFlags".into(), Value::Array(keys));
        }
        2 => {
            let values: Map<String, Value> =
                enabled(eval).map(|f| (f.key.clone(), f.value())).collect();
            body.insert("featureFlags".into(), Value::Object(values));
        }
        3 => {
            // Failed flags are already absent from `eval.flags`; leaving them out (not
            // false) lets clients keep their cached values when `errors` is set.
            let values: Map<String, Value> = eval
                .flags
                .iter()
                .map(|f| (f.key.clone(), f.value()))
                .collect();
            let payloads: Map<String, Value> = enabled(eval)
                .filter_map(|f| Some((f.key.clone(), f.payload.clone()?)))
                .collect();
            body.insert("featureFlags".into(), Value::Object(values));
            body.insert("featureFlagPayloads".into(), Value::Object(payloads));
            body.insert("errorsWhileComputingFlags".into(), Value::Bool(eval.errors));
        }
        _ => {
            body.insert("flags".into(), Value::Object(details(eval)));
            body.insert("errorsWhileComputingFlags".into(), Value::Bool(eval.errors));
            body.insert("requestId".into(), Value::String(request_id.to_string()));
        }
    }
    insert_common(&mut body);
    Value::Object(body)
}

fn enabled(eval: &Evaluation) -> impl Iterator<Item = &FlagResult> {
    eval.flags.iter().filter(|f| f.enabled)
}

/// The v4 `flags` object: every evaluated flag with its reason and metadata.
fn details(eval: &Evaluation) -> Map<String, Value> {
    eval.flags
        .iter()
        .map(|f| {
            let detail = json!({
                "key": f.key,
                "enabled": f.enabled,
                "variant": f.variant,
                "reason": {
                    "code": f.reason.code.as_str(),
                    "condition_index": f.reason.condition_index,
                    "description": f.reason.description,
                },
                "metadata": {
                    "id": f.id,
                    "version": f.version,
                    "payload": f.payload,
                },
            });
            (f.key.clone(), detail)
        })
        .collect()
}

fn insert_common(body: &mut Map<String, Value>) {
    let decide_only = json!({
        "config": {"enable_collect_everything": true},
        "toolbarParams": {},
        "isAuthenticated": false,
    });
    if let Value::Object(fields) = decide_only {
        body.extend(fields);
    }
    body.extend(client_config());
}

/// What `/decide` and remote config both tell a client: how to compress, and that
/// every optional feature (recording, surveys, heatmaps, site apps) is off.
fn client_config() -> Map<String, Value> {
    let config = json!({
        "supportedCompression": SUPPORTED_COMPRESSION,
        "sessionRecording": false,
        "capturePerformance": false,
        "autocapture_opt_out": false,
        "surveys": false,
        "heatmaps": false,
        "siteApps": [],
    });
    match config {
        Value::Object(fields) => fields,
        _ => Map::new(),
    }
}

/// posthog-js's remote config (`/array/<token>/config`) for a project. posthog-js
/// (1.449 checked) takes its compression from here, not from `/flags`, and sends
/// everything uncompressed when this fails.
pub fn remote_config(token: &str) -> Value {
    let mut body = client_config();
    body.insert("token".into(), Value::String(token.into()));
    // Rules reload at any time without the client knowing: always let it ask /flags.
    body.insert("hasFeatureFlags".into(), Value::Bool(true));
    Value::Object(body)
}
