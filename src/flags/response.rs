//! The `/decide` (v1 to v4) and `/flags` response bodies. Each client version parses its own
//! shape, so the flags part differs per version while the common fields (remote config the
//! clients expect to find, all switched off) are the same everywhere.

use serde::ser::{Serialize, SerializeMap, Serializer};
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

/// The same body as [`response`], written straight to JSON bytes without building a
/// value tree first: on the decide hot path that tree cost as much as evaluation.
pub fn response_bytes(version: u8, eval: &Evaluation, request_id: Uuid) -> Vec<u8> {
    let body = Wire {
        version,
        eval,
        request_id,
    };
    // Serializing plain data into a Vec cannot fail.
    serde_json::to_vec(&body).unwrap_or_default()
}

struct Wire<'a> {
    version: u8,
    eval: &'a Evaluation,
    request_id: Uuid,
}

impl Serialize for Wire<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let eval = self.eval;
        let mut m = s.serialize_map(None)?;
        match self.version {
            0 | 1 => m.serialize_entry("featureFlags", &Keys(eval))?,
            2 => m.serialize_entry("featureFlags", &Values(eval, true))?,
            3 => {
                m.serialize_entry("featureFlags", &Values(eval, false))?;
                m.serialize_entry("featureFlagPayloads", &Payloads(eval))?;
                m.serialize_entry("errorsWhileComputingFlags", &eval.errors)?;
            }
            _ => {
                m.serialize_entry("flags", &Details(eval))?;
                m.serialize_entry("errorsWhileComputingFlags", &eval.errors)?;
                m.serialize_entry("requestId", &self.request_id.to_string())?;
            }
        }
        m.serialize_entry("config", &json!({"enable_collect_everything": true}))?;
        m.serialize_entry("toolbarParams", &Map::new())?;
        m.serialize_entry("isAuthenticated", &false)?;
        m.serialize_entry("supportedCompression", &SUPPORTED_COMPRESSION)?;
        for key in [
            "sessionRecording",
            "capturePerformance",
            "autocapture_opt_out",
            "surveys",
            "heatmaps",
        ] {
            m.serialize_entry(key, &false)?;
        }
        m.serialize_entry("siteApps", &[(); 0])?;
        m.end()
    }
}

/// v1: the enabled keys.
struct Keys<'a>(&'a Evaluation);

impl Serialize for Keys<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(enabled(self.0).map(|f| &f.key))
    }
}

/// v2 and v3: key to value, of the enabled flags only or of all.
struct Values<'a>(&'a Evaluation, bool);

impl Serialize for Values<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let only_enabled = self.1;
        s.collect_map(
            self.0
                .flags
                .iter()
                .filter(|f| f.enabled || !only_enabled)
                .map(|f| (&f.key, FlagValue(f))),
        )
    }
}

/// A flag's value: its variant when enabled with one, else the boolean.
struct FlagValue<'a>(&'a FlagResult);

impl Serialize for FlagValue<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.0.variant {
            Some(variant) if self.0.enabled => s.serialize_str(variant),
            _ => s.serialize_bool(self.0.enabled),
        }
    }
}

/// v3: payloads of the enabled flags that have one.
struct Payloads<'a>(&'a Evaluation);

impl Serialize for Payloads<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(enabled(self.0).filter_map(|f| Some((&f.key, f.payload.as_ref()?))))
    }
}

/// v4: every flag with its reason and metadata.
struct Details<'a>(&'a Evaluation);

impl Serialize for Details<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.flags.iter().map(|f| (&f.key, Detail(f))))
    }
}

struct Detail<'a>(&'a FlagResult);

impl Serialize for Detail<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let f = self.0;
        let mut m = s.serialize_map(Some(5))?;
        m.serialize_entry("key", &f.key)?;
        m.serialize_entry("enabled", &f.enabled)?;
        m.serialize_entry("variant", &f.variant)?;
        m.serialize_entry(
            "reason",
            &json!({
                "code": f.reason.code.as_str(),
                "condition_index": f.reason.condition_index,
                "description": f.reason.description,
            }),
        )?;
        m.serialize_entry("metadata", &Metadata(f))?;
        m.end()
    }
}

struct Metadata<'a>(&'a FlagResult);

impl Serialize for Metadata<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let f = self.0;
        let mut m = s.serialize_map(Some(3))?;
        m.serialize_entry("id", &f.id)?;
        m.serialize_entry("version", &f.version)?;
        m.serialize_entry("payload", &f.payload)?;
        m.end()
    }
}
