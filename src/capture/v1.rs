//! PostHog's v1 capture format (`POST /i/v1/analytics/events`): the batch it
//! carries, the rules PostHog's capture checks it by, and each event turned into the
//! event `/batch/` would have received from the same client, so the rest of the
//! pipeline (normalising, the log, the compactor) is the one every event takes.
//!
//! A v1 event keeps in fields what `/batch/` keeps in properties: `session_id` and
//! `window_id` go back to `$session_id` and `$window_id`, the `options` back to
//! `$cookieless_mode`, `$ignore_sent_at` (`disable_skew_correction`),
//! `$product_tour_id` and `$process_person_profile`, and the `PostHog-Sdk-Info`
//! header to `$lib` and `$lib_version`. They are appended after the client's own
//! properties, so they win as the later of a repeated key, as in PostHog.

use std::collections::HashSet;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use uuid::Uuid;

use super::{encode_event, parse, Context, Encoded, Fixer, Fixing};

/// Longer event names are dropped (`event_name_too_long`).
pub const MAX_EVENT_NAME_BYTES: usize = 200;
/// Longer distinct ids are dropped (`distinct_id_too_large`).
pub const MAX_DISTINCT_ID_BYTES: usize = 200;
/// A `PostHog-Sdk-Info` longer than this is not copied into every event.
pub const MAX_SDK_INFO_BYTES: usize = 200;

/// The request body. Fields are as strict as PostHog's: a missing or mistyped
/// required field fails the whole request (`request_parsing_error`).
#[derive(Debug, Deserialize)]
pub struct Batch {
    pub created_at: String,
    #[serde(default)]
    pub historical_migration: bool,
    pub batch: Vec<Event>,
}

#[derive(Debug, Deserialize)]
pub struct Event {
    pub event: String,
    pub uuid: String,
    pub distinct_id: String,
    pub timestamp: String,
    pub session_id: Option<String>,
    pub window_id: Option<String>,
    /// Read leniently, field by field: a bad option drops its event, not the batch.
    #[serde(default)]
    pub options: Value,
    /// Absent is `{}`; any other value, `null` included, is kept as sent so the
    /// rules can drop an event whose properties are not an object.
    #[serde(default, deserialize_with = "present")]
    pub properties: Option<Box<RawValue>>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

/// What became of one event, as the 200 answer reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    Drop,
    Warning,
    Retry,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Drop => "drop",
            Status::Warning => "warning",
            Status::Retry => "retry",
        }
    }
}

/// Why a whole request is refused after its body parsed; each is a 400.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    EmptyBatch,
    /// `created_at` is not RFC 3339.
    InvalidCreatedAt(String),
    MissingEventUuid,
    InvalidEventUuid(String),
    DuplicateEventUuid(String),
}

/// One event of the batch, checked.
#[derive(Debug)]
pub struct Checked {
    pub uuid: Uuid,
    pub status: Status,
    pub details: Option<&'static str>,
    /// The event as `/batch/` would carry it, for events still to be stored.
    pub batch_json: Option<Vec<u8>>,
}

/// Check the batch as PostHog's capture does and turn each good event into its
/// `/batch/` form. `sdk` is the `PostHog-Sdk-Info` header split into `$lib` and
/// `$lib_version`, when it is usable.
pub fn check(batch: Batch, sdk: Option<(&str, &str)>) -> Result<Vec<Checked>, Error> {
    if batch.batch.is_empty() {
        return Err(Error::EmptyBatch);
    }
    if super::timestamp::parse_rfc3339_ms(&batch.created_at).is_none() {
        return Err(Error::InvalidCreatedAt(batch.created_at));
    }
    let mut seen = HashSet::with_capacity(batch.batch.len());
    let mut checked = Vec::with_capacity(batch.batch.len());
    for event in batch.batch {
        let raw_uuid = event.uuid.trim();
        if raw_uuid.is_empty() {
            return Err(Error::MissingEventUuid);
        }
        let uuid =
            Uuid::parse_str(raw_uuid).map_err(|_| Error::InvalidEventUuid(raw_uuid.into()))?;
        if !seen.insert(uuid) {
            return Err(Error::DuplicateEventUuid(raw_uuid.into()));
        }
        checked.push(
            match rule_out(&event).and_then(|()| options(&event.options)) {
                Err(details) => Checked {
                    uuid,
                    status: Status::Drop,
                    details: Some(details),
                    batch_json: None,
                },
                Ok(options) => Checked {
                    uuid,
                    status: Status::Ok,
                    details: None,
                    batch_json: Some(batch_event(&event, uuid, &options, sdk)),
                },
            },
        );
    }
    Ok(checked)
}

/// The per-event rules, in PostHog's order; `Err` holds the drop's `details`.
fn rule_out(event: &Event) -> Result<(), &'static str> {
    let distinct_id = event.distinct_id.trim();
    if event.event == "$performance_event" {
        Err("dropped_performance_event")
    } else if event.event.is_empty() {
        Err("missing_event_name")
    } else if event.event.len() > MAX_EVENT_NAME_BYTES {
        Err("event_name_too_long")
    } else if distinct_id.is_empty() {
        Err("missing_distinct_id")
    } else if distinct_id.len() > MAX_DISTINCT_ID_BYTES {
        Err("distinct_id_too_large")
    } else if super::timestamp::parse_rfc3339_ms(&event.timestamp).is_none() {
        Err("invalid_event_timestamp")
    } else if !event
        .properties
        .as_ref()
        .is_none_or(|p| p.get().starts_with('{'))
    {
        Err("malformed_event_properties")
    } else {
        Ok(())
    }
}

/// The event's options, coerced as PostHog coerces them.
#[derive(Debug, Default, PartialEq)]
pub struct Options {
    pub cookieless_mode: Option<bool>,
    pub disable_skew_correction: Option<bool>,
    pub product_tour_id: Option<String>,
    pub process_person_profile: Option<bool>,
}

/// Null or absent is no options; an object has each known key coerced (unknown keys
/// are ignored); anything else, or a key that does not coerce, drops the event.
fn options(raw: &Value) -> Result<Options, &'static str> {
    const INVALID: &str = "invalid_options";
    let map = match raw {
        Value::Null => return Ok(Options::default()),
        Value::Object(map) => map,
        _ => return Err(INVALID),
    };
    let flag = |key: &str| match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => coerce_bool(v).map(Some).ok_or(INVALID),
    };
    Ok(Options {
        cookieless_mode: flag("cookieless_mode")?,
        disable_skew_correction: flag("disable_skew_correction")?,
        process_person_profile: flag("process_person_profile")?,
        product_tour_id: match map.get("product_tour_id") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Some(n.to_string()),
            Some(_) => return Err(INVALID),
        },
    })
}

/// A bool, `"true"`/`"false"`/`"1"`/`"0"` (trimmed, any case), or a number
/// (non-zero is true).
fn coerce_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
            "true" | "1" => Some(true),
            "false" | "0" => Some(false),
            _ => None,
        },
        Value::Number(n) => n.as_f64().map(|f| f != 0.0),
        _ => None,
    }
}

/// The event in the `/batch/` shape: `{event, distinct_id, uuid, timestamp,
/// properties}`, the properties as sent with the lifted fields appended.
fn batch_event(event: &Event, uuid: Uuid, options: &Options, sdk: Option<(&str, &str)>) -> Vec<u8> {
    let mut extra = Vec::new();
    let mut add = |key: &str, value: Value| {
        extra.push((key.to_owned(), value));
    };
    if let Some(s) = &event.session_id {
        add("$session_id", Value::from(s.as_str()));
    }
    if let Some(w) = &event.window_id {
        add("$window_id", Value::from(w.as_str()));
    }
    if let Some(b) = options.cookieless_mode {
        add("$cookieless_mode", Value::from(b));
    }
    if let Some(b) = options.disable_skew_correction {
        add("$ignore_sent_at", Value::from(b));
    }
    if let Some(t) = &options.product_tour_id {
        add("$product_tour_id", Value::from(t.as_str()));
    }
    if let Some(b) = options.process_person_profile {
        add("$process_person_profile", Value::from(b));
    }
    if let Some((lib, version)) = sdk {
        add("$lib", Value::from(lib));
        add("$lib_version", Value::from(version));
    }
    let props = event.properties.as_ref().map_or("{}", |p| p.get());
    let mut out = Vec::with_capacity(props.len() + event.event.len() + 256);
    out.extend_from_slice(b"{\"event\":");
    push_json(&mut out, &event.event);
    out.extend_from_slice(b",\"distinct_id\":");
    push_json(&mut out, event.distinct_id.trim());
    out.extend_from_slice(b",\"uuid\":\"");
    out.extend_from_slice(uuid.hyphenated().to_string().as_bytes());
    out.extend_from_slice(b"\",\"timestamp\":");
    push_json(&mut out, &event.timestamp);
    out.extend_from_slice(b",\"properties\":");
    // `rule_out` saw the properties open with `{`; serde_json's raw value ends with
    // the matching `}`, so the lifted fields go just before it.
    let body = &props[..props.len() - 1];
    out.extend_from_slice(body.as_bytes());
    let empty = body[1..].trim_start().is_empty();
    for (i, (key, value)) in extra.iter().enumerate() {
        if i > 0 || !empty {
            out.push(b',');
        }
        push_json(&mut out, key);
        out.push(b':');
        // Writing a value into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, value);
    }
    out.extend_from_slice(b"}}");
    out
}

fn push_json(out: &mut Vec<u8>, s: &str) {
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Store-ready records of the checked events, through the `/batch/` pipeline: each
/// event's `/batch/` form is parsed and normalised as that path would. An event the
/// pipeline drops or refuses becomes a `drop` here, with the reason as its details.
/// With `fixing` (edge mode), the keys forwarding relies on are fixed in each event.
pub fn encode(checked: &mut [Checked], ctx: &Context, fixing: Option<Fixing>) -> Vec<Vec<u8>> {
    let mut records = Vec::with_capacity(checked.len());
    let fixer = fixing.map(|fixing| Fixer::new(ctx, fixing));
    for c in checked.iter_mut() {
        let Some(mut json) = c.batch_json.take() else {
            continue;
        };
        let outcome = parse(&mut json, false).and_then(|payload| {
            let event = payload.events().next().ok_or(super::Error::EmptyBatch)?;
            match &fixer {
                None => encode_event(event, ctx),
                Some(fixer) => fixer.encode(event),
            }
        });
        match outcome {
            Ok(Encoded::Keep(record)) => records.push(record),
            Ok(Encoded::Drop(reason)) => {
                c.status = Status::Drop;
                c.details = Some(reason.as_str());
            }
            Err(_) => {
                c.status = Status::Drop;
                c.details = Some("malformed_event_properties");
            }
        }
    }
    records
}

/// `PostHog-Sdk-Info` (`<lib>/<version>`, split at the last `/`) as `$lib` and
/// `$lib_version`; `None` when either part is empty or the value is oversized.
pub fn sdk_lib_and_version(sdk_info: &str) -> Option<(&str, &str)> {
    if sdk_info.len() > MAX_SDK_INFO_BYTES {
        return None;
    }
    let (lib, version) = sdk_info.rsplit_once('/')?;
    let (lib, version) = (lib.trim(), version.trim());
    (!lib.is_empty() && !version.is_empty()).then_some((lib, version))
}

#[cfg(test)]
#[path = "tests/v1.rs"]
mod tests;
