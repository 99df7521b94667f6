//! The reference pipeline the tape-based parse and normalisation are checked against:
//! parse into `serde_json::Value`, then normalise each map, sharing only types with the
//! code it checks.

use super::*;
use time::format_description::well_known::{Iso8601, Rfc3339};
use time::{OffsetDateTime, PrimitiveDateTime, UtcOffset};

/// PostHog's limits as the wire reference gives them: JSON nested at most this
/// deep, distinct ids cut to this many characters, events at most this far ahead.
const MAX_DEPTH: usize = 128;
const MAX_ID_CHARS: usize = 200;
const MAX_AHEAD_MS: i64 = 23 * 3_600_000;

/// Parse with simd-json's serde front end, after counting the nesting outside
/// strings.
fn parse_value(bytes: &mut [u8]) -> Result<Value, Error> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in bytes.iter() {
        match (in_string, escaped, b) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') => in_string = false,
            (true, false, _) => {}
            (false, _, b'"') => in_string = true,
            (false, _, b'[' | b'{') => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(Error::InvalidJson(format!(
                        "nested deeper than {MAX_DEPTH} levels"
                    )));
                }
            }
            (false, _, b']' | b'}') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    simd_json::serde::from_slice::<Value>(bytes).map_err(|e| Error::InvalidJson(e.to_string()))
}

/// At most [`MAX_ID_CHARS`] characters, NUL replaced.
fn clean_distinct_id(id: &str) -> String {
    id.chars()
        .take(MAX_ID_CHARS)
        .map(|c| if c == '\0' { '\u{FFFD}' } else { c })
        .collect()
}

/// RFC 3339, ISO 8601 with or without an offset (UTC then), a space for the `T`,
/// or a bare date (its midnight, UTC).
pub fn parse_ms(s: &str) -> Option<i64> {
    let s = s.trim();
    let utc = |t: PrimitiveDateTime| t.assume_offset(UtcOffset::UTC);
    let t = OffsetDateTime::parse(s, &Rfc3339)
        .ok()
        .or_else(|| OffsetDateTime::parse(s, &Iso8601::DEFAULT).ok())
        .or_else(|| PrimitiveDateTime::parse(s, &Iso8601::DEFAULT).ok().map(utc))
        .or_else(|| {
            let spaced = s.replacen(' ', "T", 1);
            PrimitiveDateTime::parse(&spaced, &Iso8601::DEFAULT)
                .ok()
                .map(utc)
        })
        .or_else(|| {
            let day = time::Date::parse(s, &Iso8601::DEFAULT).ok()?;
            Some(day.midnight().assume_offset(UtcOffset::UTC))
        })?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// The event's time: `now - offset`; else the timestamp moved by the client's clock
/// error (`now - sent_at`); else the timestamp; else now. Too far ahead is now.
fn event_time(now: i64, timestamp: Option<i64>, sent_at: Option<i64>, offset: Option<i64>) -> i64 {
    let t = match (offset, timestamp, sent_at) {
        (Some(offset), _, _) => now.saturating_sub(offset),
        (None, Some(ts), Some(sent)) => now.saturating_add(ts.saturating_sub(sent)),
        (None, Some(ts), None) => ts,
        (None, None, _) => now,
    };
    if t > now.saturating_add(MAX_AHEAD_MS) {
        now
    } else {
        t
    }
}

pub struct Payload {
    pub events: Vec<Map<String, Value>>,
    pub batch_key: Option<String>,
    pub historical: bool,
    pub sent_at: Option<String>,
}

pub fn parse(bytes: &mut [u8], engage: bool) -> Result<Payload, Error> {
    let empty = |events| Payload {
        events,
        batch_key: None,
        historical: false,
        sent_at: None,
    };
    let mut payload = match parse_value(bytes)? {
        Value::Array(items) => empty(objects(items)?),
        Value::Object(mut obj) if obj.contains_key("batch") => {
            let items = match obj.remove("batch") {
                Some(Value::Array(items)) => items,
                _ => return Err(wrong("batch", "an array of events")),
            };
            Payload {
                events: objects(items)?,
                batch_key: key_field(&obj, &["api_key", "token"])?,
                historical: matches!(obj.get("historical_migration"), Some(Value::Bool(true))),
                sent_at: match obj.get("sent_at") {
                    Some(Value::String(s)) => Some(s.clone()),
                    _ => None,
                },
            }
        }
        Value::Object(obj) => empty(vec![obj]),
        _ => return Err(wrong("the payload", "an event, an array or a batch object")),
    };
    if payload.events.is_empty() {
        return Err(Error::EmptyBatch);
    }
    if engage {
        for event in &mut payload.events {
            if !event.contains_key("event") {
                event.insert("event".into(), Value::String("$identify".into()));
            }
        }
    }
    Ok(payload)
}

impl Payload {
    pub fn key(&self) -> Result<&str, Error> {
        if let Some(key) = &self.batch_key {
            return Ok(key);
        }
        let mut found: Option<Option<&str>> = None;
        for event in &self.events {
            let key = event_key(event)?;
            match found {
                None => found = Some(key),
                Some(prev) if prev != key => return Err(Error::MixedKeys),
                Some(_) => {}
            }
        }
        found.flatten().ok_or(Error::MissingKey)
    }
}

fn objects(items: Vec<Value>) -> Result<Vec<Map<String, Value>>, Error> {
    items
        .into_iter()
        .map(|item| match item {
            Value::Object(obj) => Ok(obj),
            _ => Err(wrong("each event", "a JSON object")),
        })
        .collect()
}

fn event_key(event: &Map<String, Value>) -> Result<Option<&str>, Error> {
    for name in ["api_key", "token", "$token"] {
        match event.get(name) {
            Some(Value::String(s)) => return Ok(Some(s)),
            None | Some(Value::Null) => {}
            Some(_) => return Err(wrong("api_key", "a string")),
        }
    }
    match event.get("properties").and_then(|p| p.get("token")) {
        Some(Value::String(s)) => Ok(Some(s)),
        None | Some(Value::Null) => Ok(None),
        Some(_) => Err(wrong("api_key", "a string")),
    }
}

fn key_field(obj: &Map<String, Value>, names: &[&str]) -> Result<Option<String>, Error> {
    for name in names {
        match obj.get(*name) {
            Some(Value::String(s)) => return Ok(Some(s.clone())),
            None | Some(Value::Null) => {}
            Some(_) => return Err(wrong("api_key", "a string")),
        }
    }
    Ok(None)
}

pub fn normalise(event: Map<String, Value>, ctx: &Context) -> Result<Outcome, Error> {
    let name = match event.get("event") {
        None | Some(Value::Null) => return Ok(Outcome::Drop(DropReason::MissingEventName)),
        Some(Value::String(s)) if s.is_empty() => {
            return Ok(Outcome::Drop(DropReason::MissingEventName))
        }
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(wrong("event", "a string")),
    };
    let properties = match event.get("properties") {
        None | Some(Value::Null) => None,
        Some(Value::Object(p)) => Some(p),
        Some(_) => return Err(wrong("properties", "an object")),
    };
    let distinct_id = match distinct_id(&event, properties)? {
        Ok(id) => id,
        Err(reason) => return Ok(Outcome::Drop(reason)),
    };
    let uuid = match event.get("uuid") {
        Some(Value::String(s)) => Uuid::parse_str(s).ok(),
        _ => None,
    }
    .unwrap_or_else(Uuid::now_v7);
    let ignore_sent_at = properties
        .and_then(|p| p.get("$ignore_sent_at"))
        .is_some_and(|v| v == &Value::Bool(true));
    let claimed = match event.get("timestamp") {
        Some(Value::String(s)) => parse_ms(s),
        _ => None,
    };
    let sent_at = if ignore_sent_at { None } else { ctx.sent_at };
    let offset = event
        .get("offset")
        .and_then(Value::as_f64)
        .filter(|o| o.is_finite())
        .map(|o| o as i64);
    let data = serde_json::to_vec(&event).map_err(|e| Error::InvalidJson(e.to_string()))?;
    Ok(Outcome::Keep(Box::new(Record {
        project: ctx.project,
        received_at: ctx.now,
        timestamp: event_time(ctx.now, claimed, sent_at, offset),
        sent_at: ctx.sent_at,
        uuid,
        historical: ctx.historical,
        ip: ctx.ip,
        event: name,
        distinct_id,
        data,
    })))
}

fn distinct_id(
    event: &Map<String, Value>,
    properties: Option<&Map<String, Value>>,
) -> Result<Result<String, DropReason>, Error> {
    let raw = [event.get("distinct_id"), event.get("$distinct_id")]
        .into_iter()
        .chain([properties.and_then(|p| p.get("distinct_id"))])
        .flatten()
        .find(|v| !v.is_null());
    let id = match raw {
        None => return Ok(Err(DropReason::MissingDistinctId)),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(_) => return Err(wrong("distinct_id", "a string or a number")),
    };
    if id.is_empty() {
        return Ok(Err(DropReason::EmptyDistinctId));
    }
    Ok(Ok(clean_distinct_id(&id)))
}

fn wrong(field: &'static str, expected: &'static str) -> Error {
    Error::WrongType { field, expected }
}
