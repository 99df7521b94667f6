//! One event, validated and normalised into a write-ahead log record: the rules of
//! the reference service for names, distinct ids, uuids and times.

use std::net::IpAddr;

use serde_json::{Map, Value};
use uuid::Uuid;

use super::timestamp::{self, Claims};
use super::Error;
use crate::store::Record;

/// Longer distinct ids are cut to this many characters.
pub const MAX_DISTINCT_ID_CHARS: usize = 200;

/// The request-level facts every event of a request shares.
#[derive(Debug, Clone, Copy)]
pub struct Context {
    pub project: u64,
    /// Server time at arrival, unix milliseconds.
    pub now: i64,
    /// The client's send time: the batch `sent_at`, else the `_` query parameter.
    pub sent_at: Option<i64>,
    pub historical: bool,
    pub ip: Option<IpAddr>,
}

/// Events dropped by rule: the request still succeeds, the event is never stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    MissingEventName,
    MissingDistinctId,
    EmptyDistinctId,
}

impl DropReason {
    pub const ALL: [DropReason; 3] = [
        DropReason::MissingEventName,
        DropReason::MissingDistinctId,
        DropReason::EmptyDistinctId,
    ];

    /// The label used in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::MissingEventName => "missing_event_name",
            DropReason::MissingDistinctId => "missing_distinct_id",
            DropReason::EmptyDistinctId => "empty_distinct_id",
        }
    }
}

#[derive(Debug)]
pub enum Outcome {
    Keep(Box<Record>),
    Drop(DropReason),
}

/// Validate and normalise one event object.
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
    let claims = Claims {
        timestamp: match event.get("timestamp") {
            Some(Value::String(s)) => timestamp::parse_ms(s),
            _ => None,
        },
        sent_at: if ignore_sent_at { None } else { ctx.sent_at },
        offset: event
            .get("offset")
            .and_then(Value::as_f64)
            .filter(|o| o.is_finite())
            .map(|o| o as i64),
    };
    let data = serde_json::to_vec(&event).map_err(|e| Error::InvalidJson(e.to_string()))?;
    Ok(Outcome::Keep(Box::new(Record {
        project: ctx.project,
        received_at: ctx.now,
        timestamp: timestamp::resolve(ctx.now, claims),
        sent_at: ctx.sent_at,
        uuid,
        historical: ctx.historical,
        ip: ctx.ip,
        event: name,
        distinct_id,
        data,
    })))
}

/// The root `distinct_id`, else `properties.distinct_id` (batch items), else the
/// legacy `$distinct_id`; a number becomes its decimal string.
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

/// NUL becomes U+FFFD (stores and queries choke on it) and the id is cut to
/// [`MAX_DISTINCT_ID_CHARS`] characters.
pub fn clean_distinct_id(id: &str) -> String {
    id.chars()
        .take(MAX_DISTINCT_ID_CHARS)
        .map(|c| if c == '\0' { '\u{FFFD}' } else { c })
        .collect()
}

fn wrong(field: &'static str, expected: &'static str) -> Error {
    Error::WrongType { field, expected }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: i64 = 1_700_000_000_000;

    fn ctx() -> Context {
        Context {
            project: 1,
            now: NOW,
            sent_at: None,
            historical: false,
            ip: Some("127.0.0.1".parse().unwrap()),
        }
    }

    fn run(v: Value) -> Result<Outcome, Error> {
        run_with(v, &ctx())
    }

    fn run_with(v: Value, c: &Context) -> Result<Outcome, Error> {
        match v {
            Value::Object(m) => normalise(m, c),
            _ => unreachable!(),
        }
    }

    fn kept(v: Value) -> Record {
        match run(v).unwrap() {
            Outcome::Keep(r) => *r,
            Outcome::Drop(d) => panic!("dropped: {d:?}"),
        }
    }

    fn dropped(v: Value) -> DropReason {
        match run(v).unwrap() {
            Outcome::Drop(d) => d,
            Outcome::Keep(r) => panic!("kept: {r:?}"),
        }
    }

    #[test]
    fn drops_by_rule() {
        assert_eq!(
            dropped(json!({"distinct_id": "d"})),
            DropReason::MissingEventName
        );
        assert_eq!(
            dropped(json!({"event": "", "distinct_id": "d"})),
            DropReason::MissingEventName
        );
        assert_eq!(
            dropped(json!({"event": "e"})),
            DropReason::MissingDistinctId
        );
        assert_eq!(
            dropped(json!({"event": "e", "distinct_id": null})),
            DropReason::MissingDistinctId
        );
        assert_eq!(
            dropped(json!({"event": "e", "distinct_id": ""})),
            DropReason::EmptyDistinctId
        );
    }

    #[test]
    fn wrong_types_are_errors() {
        assert_eq!(
            run(json!({"event": 5, "distinct_id": "d"})).unwrap_err(),
            wrong("event", "a string")
        );
        assert_eq!(
            run(json!({"event": "e", "distinct_id": {"a": 1}})).unwrap_err(),
            wrong("distinct_id", "a string or a number")
        );
        assert_eq!(
            run(json!({"event": "e", "distinct_id": "d", "properties": [1]})).unwrap_err(),
            wrong("properties", "an object")
        );
    }

    #[test]
    fn distinct_id_coercion() {
        assert_eq!(
            kept(json!({"event": "e", "distinct_id": 42})).distinct_id,
            "42"
        );
        assert_eq!(
            kept(json!({"event": "e", "distinct_id": 1.5})).distinct_id,
            "1.5"
        );
        let batch_item = json!({"event": "e", "properties": {"distinct_id": "p"}});
        assert_eq!(kept(batch_item).distinct_id, "p");
        assert_eq!(
            kept(json!({"event": "e", "distinct_id": "a\0b"})).distinct_id,
            "a\u{FFFD}b"
        );
        let long = "é".repeat(300);
        let r = kept(json!({"event": "e", "distinct_id": long}));
        assert_eq!(r.distinct_id.chars().count(), MAX_DISTINCT_ID_CHARS);
        assert_eq!(r.distinct_id, "é".repeat(200));
    }

    #[test]
    fn uuid_kept_when_valid() {
        let id = "0190f7b4-6a36-7c5d-8b8e-4c6a2d5e9f01";
        assert_eq!(
            kept(json!({"event": "e", "distinct_id": "d", "uuid": id}))
                .uuid
                .to_string(),
            id
        );
        let fresh = kept(json!({"event": "e", "distinct_id": "d", "uuid": "nope"})).uuid;
        assert_eq!(fresh.get_version_num(), 7);
    }

    #[test]
    fn time_claims() {
        let c = Context {
            sent_at: Some(NOW + 3_600_000),
            ..ctx()
        };
        let ev = json!({"event": "e", "distinct_id": "d", "timestamp": "2023-11-14T23:13:18Z"});
        // Client one hour fast, event 2 s before sending.
        let r = match run_with(ev.clone(), &c).unwrap() {
            Outcome::Keep(r) => r,
            Outcome::Drop(_) => unreachable!(),
        };
        assert_eq!(r.timestamp, NOW - 2000);
        assert_eq!(r.sent_at, Some(NOW + 3_600_000));
        // $ignore_sent_at turns the correction off.
        let mut ignore = ev;
        ignore["properties"] = json!({"$ignore_sent_at": true});
        let r = match run_with(ignore, &c).unwrap() {
            Outcome::Keep(r) => r,
            Outcome::Drop(_) => unreachable!(),
        };
        assert_eq!(r.timestamp, NOW + 3_600_000 - 2000);
        assert_eq!(
            kept(json!({"event": "e", "distinct_id": "d", "offset": 250})).timestamp,
            NOW - 250
        );
        assert_eq!(
            kept(json!({"event": "e", "distinct_id": "d", "timestamp": "junk"})).timestamp,
            NOW
        );
    }

    #[test]
    fn record_keeps_the_event_as_sent() {
        let ev = json!({"event": "$pageview", "distinct_id": "d", "properties": {"$current_url": "https://x/"}});
        let r = kept(ev.clone());
        assert_eq!(serde_json::from_slice::<Value>(&r.data).unwrap(), ev);
        assert_eq!(r.event, "$pageview");
        assert_eq!(r.project, 1);
        assert_eq!(r.received_at, NOW);
        assert_eq!(r.ip, Some("127.0.0.1".parse().unwrap()));
    }
}
