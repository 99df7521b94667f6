//! The `/decide` (v1 to v4) and `/flags` response bodies. Each client version parses its own
//! shape, so the flags part differs per version while the common fields (the project's
//! client config, handed in by the caller in a [`Tail`]) are the same everywhere.

use serde::Serialize;
use serde_json::{json, Map, Value};
use uuid::Uuid;

use super::outcome::{Outcome, Outcomes};
use super::result::{
    matched_condition_set, Evaluation, FlagResult, ReasonCode, MATCHED_CONDITION_PREFIX,
};

/// The response body for `/decide?v=<version>`; `/flags` uses version 4. Version 0 (no
/// `v`) reads as 1 and versions above 4 as 4, the newest shape.
///
/// The tail is the default one: no `evaluatedAt`, every client feature off; the server
/// passes its own to [`response_bytes_with`]. `quotaLimited` is never written: PostHog
/// leaves it out unless a quota was hit, which never happens here, and some SDKs
/// (posthog-rs) cannot parse the list PostHog sends when one is.
pub fn response(version: u8, eval: &Evaluation, request_id: Uuid) -> Value {
    response_with(version, eval, request_id, &Tail::default())
}

/// What a body carries besides its flags, decided by the caller: when it was
/// evaluated and the client config members.
#[derive(Debug, Clone, Copy)]
pub struct Tail<'a> {
    /// `evaluatedAt`, milliseconds since the epoch; `None` leaves it out.
    pub evaluated_at: Option<i64>,
    /// The members every version ends with, as JSON text without the braces.
    pub common: &'a str,
}

impl Default for Tail<'_> {
    fn default() -> Self {
        Tail {
            evaluated_at: None,
            common: COMMON_FIELDS,
        }
    }
}

/// [`response`] with the caller's [`Tail`].
pub fn response_with(version: u8, eval: &Evaluation, request_id: Uuid, tail: &Tail) -> Value {
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
        }
    }
    body.insert("requestId".into(), Value::String(request_id.to_string()));
    if let Some(at) = tail.evaluated_at {
        body.insert("evaluatedAt".into(), Value::from(at));
    }
    if let Ok(Value::Object(common)) = serde_json::from_str(&format!("{{{}}}", tail.common)) {
        body.extend(common);
    }
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
                    "version": f.version.unwrap_or(0),
                    "description": null,
                    "payload": f.payload,
                },
            });
            (f.key.clone(), detail)
        })
        .collect()
}

/// The same body as [`response`], written straight to JSON bytes without building a
/// value tree first: on the decide hot path that tree cost as much as evaluation.
pub fn response_bytes(version: u8, eval: &Evaluation, request_id: Uuid) -> Vec<u8> {
    response_bytes_with(version, eval, request_id, &Tail::default())
}

/// `common` (a [`Tail`]'s closing members) with PostHog's `"quotaLimited":
/// ["feature_flags"]`, which its flags service adds, with no flags, for a project over
/// its quota (an edge's synced project whose upstream answered 402).
pub fn quota_limited(common: &str) -> String {
    const QUOTA_LIMITED: &str = r#""quotaLimited":["feature_flags"]"#;
    if common.trim().is_empty() {
        QUOTA_LIMITED.to_string()
    } else {
        format!("{QUOTA_LIMITED},{common}")
    }
}

/// [`quota_limited`]'s tail when upstream has quota-limited `project` (edge mode).
pub fn quota_limited_tail(
    snapshot: &super::Snapshot,
    project: u64,
    common: &str,
) -> Option<String> {
    let limited = i64::try_from(project).is_ok_and(|id| snapshot.quota_limited(id));
    limited.then(|| quota_limited(common))
}

/// [`response_bytes`] with the caller's [`Tail`].
pub fn response_bytes_with(
    version: u8,
    eval: &Evaluation,
    request_id: Uuid,
    tail: &Tail,
) -> Vec<u8> {
    write(version, eval.flags.iter(), eval.errors, request_id, tail)
}

impl Outcomes<'_> {
    /// The body of [`response_bytes`] for these outcomes, copying the keys, variants and
    /// payloads as JSON text prepared when the rules were compiled.
    pub fn response_bytes(&self, version: u8, request_id: Uuid) -> Vec<u8> {
        self.response_bytes_with(version, request_id, &Tail::default())
    }

    /// [`Outcomes::response_bytes`] with the caller's [`Tail`].
    pub fn response_bytes_with(&self, version: u8, request_id: Uuid, tail: &Tail) -> Vec<u8> {
        write(version, self.computed(), self.errors(), request_id, tail)
    }
}

/// Bytes of a body besides its flags, and per flag in the v1-v3 and the v4 shapes: a
/// first guess at the capacity, so the buffer rarely grows.
const FIXED_BYTES: usize = 320;
const BYTES_PER_FLAG: usize = 48;
const BYTES_PER_FLAG_V4: usize = 320;

/// What every version ends with unless the caller's [`Tail`] says otherwise: remote
/// config the clients expect, all switched off.
pub const COMMON_FIELDS: &str = concat!(
    r#""config":{"enable_collect_everything":true},"toolbarParams":{},"#,
    r#""isAuthenticated":false,"supportedCompression":["gzip","gzip-js","lz64"],"#,
    r#""sessionRecording":false,"capturePerformance":false,"autocapture_opt_out":false,"#,
    r#""surveys":false,"heatmaps":false,"siteApps":[]"#,
);

/// One computed flag as the writer reads it: an owned result, or an outcome pointing
/// into the compiled rules.
trait Written {
    fn enabled(&self) -> bool;
    /// The key as a JSON string.
    fn key(&self, out: &mut Vec<u8>);
    /// The variant as a JSON string, or `null`.
    fn variant(&self, out: &mut Vec<u8>);
    /// The value clients see: the variant when enabled with one, else the boolean.
    fn value(&self, out: &mut Vec<u8>);
    fn has_payload(&self) -> bool;
    /// The payload as JSON, or `null`.
    fn payload(&self, out: &mut Vec<u8>);
    fn code(&self) -> ReasonCode;
    fn condition_index(&self) -> Option<usize>;
    /// The reason's description as a JSON string.
    fn description(&self, out: &mut Vec<u8>);
    fn id(&self) -> i64;
    fn version(&self) -> Option<i64>;
}

impl Written for &FlagResult {
    fn enabled(&self) -> bool {
        self.enabled
    }
    fn key(&self, out: &mut Vec<u8>) {
        json(out, &self.key);
    }
    fn variant(&self, out: &mut Vec<u8>) {
        json(out, &self.variant);
    }
    fn value(&self, out: &mut Vec<u8>) {
        match &self.variant {
            Some(variant) if self.enabled => json(out, variant),
            _ => boolean(out, self.enabled),
        }
    }
    fn has_payload(&self) -> bool {
        self.payload.is_some()
    }
    fn payload(&self, out: &mut Vec<u8>) {
        json(out, &self.payload);
    }
    fn code(&self) -> ReasonCode {
        self.reason.code
    }
    fn condition_index(&self) -> Option<usize> {
        self.reason.condition_index
    }
    fn description(&self, out: &mut Vec<u8>) {
        json(out, &self.reason.description);
    }
    fn id(&self) -> i64 {
        self.id
    }
    fn version(&self) -> Option<i64> {
        self.version
    }
}

impl Written for Outcome<'_> {
    fn enabled(&self) -> bool {
        self.decision.enabled
    }
    fn key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.flag.header.quoted.as_bytes());
    }
    fn variant(&self, out: &mut Vec<u8>) {
        let text = self.quoted_variant().unwrap_or("null");
        out.extend_from_slice(text.as_bytes());
    }
    fn value(&self, out: &mut Vec<u8>) {
        match self.quoted_variant() {
            Some(variant) if self.decision.enabled => out.extend_from_slice(variant.as_bytes()),
            _ => boolean(out, self.decision.enabled),
        }
    }
    fn has_payload(&self) -> bool {
        Outcome::payload(self).is_some()
    }
    fn payload(&self, out: &mut Vec<u8>) {
        let text = Outcome::payload(self).map_or("null", |p| &p.json);
        out.extend_from_slice(text.as_bytes());
    }
    fn code(&self) -> ReasonCode {
        self.decision.code
    }
    fn condition_index(&self) -> Option<usize> {
        self.decision.condition_index
    }
    fn description(&self, out: &mut Vec<u8>) {
        match self.decision.code.fixed_description() {
            Some(text) => json(out, text),
            None => {
                out.push(b'"');
                out.extend_from_slice(MATCHED_CONDITION_PREFIX.as_bytes());
                json(out, &matched_condition_set(self.decision.condition_index));
                out.push(b'"');
            }
        }
    }
    fn id(&self) -> i64 {
        self.flag.header.id
    }
    fn version(&self) -> Option<i64> {
        self.flag.header.version
    }
}

/// The body for `version`, in the field order of [`response`].
fn write<F: Written>(
    version: u8,
    flags: impl Iterator<Item = F> + Clone,
    errors: bool,
    request_id: Uuid,
    tail: &Tail,
) -> Vec<u8> {
    let per_flag = if version >= 4 {
        BYTES_PER_FLAG_V4
    } else {
        BYTES_PER_FLAG
    };
    let mut out =
        Vec::with_capacity(FIXED_BYTES + tail.common.len() + per_flag * flags.clone().count());
    out.push(b'{');
    let enabled = flags.clone().filter(Written::enabled);
    match version {
        0 | 1 => {
            out.extend_from_slice(br#""featureFlags":["#);
            each(&mut out, enabled, |out, f| f.key(out));
            out.push(b']');
        }
        2 => {
            out.extend_from_slice(br#""featureFlags":{"#);
            each(&mut out, enabled, key_value);
            out.push(b'}');
        }
        3 => {
            out.extend_from_slice(br#""featureFlags":{"#);
            each(&mut out, flags, key_value);
            out.extend_from_slice(br#"},"featureFlagPayloads":{"#);
            each(&mut out, enabled.filter(Written::has_payload), |out, f| {
                f.key(out);
                out.push(b':');
                f.payload(out);
            });
            out.extend_from_slice(br#"},"errorsWhileComputingFlags":"#);
            boolean(&mut out, errors);
        }
        _ => {
            out.extend_from_slice(br#""flags":{"#);
            each(&mut out, flags, detail);
            out.extend_from_slice(br#"},"errorsWhileComputingFlags":"#);
            boolean(&mut out, errors);
        }
    }
    out.extend_from_slice(br#","requestId":""#);
    let mut id = Uuid::encode_buffer();
    out.extend_from_slice(request_id.hyphenated().encode_lower(&mut id).as_bytes());
    out.push(b'"');
    if let Some(at) = tail.evaluated_at {
        out.extend_from_slice(br#","evaluatedAt":"#);
        json(&mut out, &at);
    }
    out.push(b',');
    out.extend_from_slice(tail.common.as_bytes());
    out.push(b'}');
    out
}

/// Writes each item with `one`, comma separated.
fn each<F>(out: &mut Vec<u8>, items: impl Iterator<Item = F>, one: impl Fn(&mut Vec<u8>, &F)) {
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        one(out, &item);
    }
}

/// v2 and v3: `"key":value`.
fn key_value<F: Written>(out: &mut Vec<u8>, f: &F) {
    f.key(out);
    out.push(b':');
    f.value(out);
}

/// v4: `"key":{...}`, every flag with its reason and metadata.
fn detail<F: Written>(out: &mut Vec<u8>, f: &F) {
    f.key(out);
    out.extend_from_slice(br#":{"key":"#);
    f.key(out);
    out.extend_from_slice(br#","enabled":"#);
    boolean(out, f.enabled());
    out.extend_from_slice(br#","variant":"#);
    f.variant(out);
    out.extend_from_slice(br#","reason":{"code":""#);
    out.extend_from_slice(f.code().as_str().as_bytes());
    out.extend_from_slice(br#"","condition_index":"#);
    json(out, &f.condition_index());
    out.extend_from_slice(br#","description":"#);
    f.description(out);
    out.extend_from_slice(br#"},"metadata":{"id":"#);
    json(out, &f.id());
    // PostHog writes 0 for a flag without a version; SDKs read it as a number.
    out.extend_from_slice(br#","version":"#);
    json(out, &f.version().unwrap_or(0));
    out.extend_from_slice(br#","description":null,"payload":"#);
    f.payload(out);
    out.extend_from_slice(b"}}");
}

fn boolean(out: &mut Vec<u8>, b: bool) {
    out.extend_from_slice(if b { b"true" } else { b"false" });
}

/// Any serializable value as JSON, as serde_json writes it.
fn json<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Writing plain data into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
}
