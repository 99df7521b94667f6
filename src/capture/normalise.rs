//! One event, validated and normalised into a write-ahead log record: the rules of
//! the reference service for names, distinct ids, uuids and times.

use std::borrow::Cow;
use std::net::IpAddr;

use serde_json::{Map, Value};
use uuid::Uuid;

use super::parse::{parse, Event, IDENTIFY};
use super::tape::{Object, Value as TapeValue};
use super::timestamp::{self, Claims};
use super::{data, Error};
use crate::log::record::Head;
use crate::log::Record;

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

/// Validate and normalise one event of a parsed payload.
pub fn normalise_event(event: Event<'_, '_>, ctx: &Context) -> Result<Outcome, Error> {
    let n = match resolve(event, ctx)? {
        Ok(n) => n,
        Err(reason) => return Ok(Outcome::Drop(reason)),
    };
    let head = n.head(ctx);
    let mut data = Vec::with_capacity(event.size_hint);
    data::write(&mut data, event);
    Ok(Outcome::Keep(Box::new(Record {
        project: head.project,
        received_at: head.received_at,
        timestamp: head.timestamp,
        sent_at: head.sent_at,
        uuid: head.uuid,
        historical: head.historical,
        ip: head.ip,
        event: n.name.into_owned(),
        distinct_id: n.distinct_id.into_owned(),
        data,
    })))
}

/// [`normalise_event`] straight to the encoded record the log stores: the event's
/// JSON is written into it, with no `Record` in between.
pub fn encode_event(event: Event<'_, '_>, ctx: &Context) -> Result<Encoded, Error> {
    Ok(match resolve(event, ctx)? {
        Ok(n) => Encoded::Keep(match data::as_sent(event) {
            Some(sent) => n
                .head(ctx)
                .encode_with(sent.len(), |out| out.extend_from_slice(sent)),
            None => n
                .head(ctx)
                .encode_with(event.size_hint, |out| data::write(out, event)),
        }),
        Err(reason) => Encoded::Drop(reason),
    })
}

/// What [`encode_event`] made of an event.
#[derive(Debug)]
pub enum Encoded {
    Keep(Vec<u8>),
    Drop(DropReason),
}

/// An event that passed the rules, borrowing from the payload where it can.
pub(super) struct Normalised<'a> {
    name: Cow<'a, str>,
    distinct_id: Cow<'a, str>,
    uuid: Uuid,
    claims: Claims,
}

impl Normalised<'_> {
    pub(super) fn head(&self, ctx: &Context) -> Head<'_> {
        Head {
            project: ctx.project,
            received_at: ctx.now,
            timestamp: timestamp::resolve(ctx.now, self.claims),
            sent_at: ctx.sent_at,
            uuid: self.uuid,
            historical: ctx.historical,
            ip: ctx.ip,
            event: &self.name,
            distinct_id: &self.distinct_id,
        }
    }
}

/// The rules, in the order the reference service applies them: an event without a
/// name or a distinct id is dropped; fields of the wrong type are errors.
pub(super) fn resolve<'a>(
    event: Event<'_, 'a>,
    ctx: &Context,
) -> Result<Result<Normalised<'a>, DropReason>, Error> {
    let f = Fields::read(event.object);
    let name = if event.implied_identify() {
        Cow::Borrowed(IDENTIFY)
    } else {
        match f.event {
            None => return Ok(Err(DropReason::MissingEventName)),
            Some(v) if v.is_null() => return Ok(Err(DropReason::MissingEventName)),
            Some(v) => match v.as_str() {
                Some("") => return Ok(Err(DropReason::MissingEventName)),
                Some(s) => Cow::Borrowed(s),
                None => return Err(wrong("event", "a string")),
            },
        }
    };
    let properties = match f.properties {
        None => None,
        Some(v) if v.is_null() => None,
        Some(v) => Some(v.as_object().ok_or(wrong("properties", "an object"))?),
    };
    let props = properties.map(Properties::read).unwrap_or_default();
    let raw_id = [f.distinct_id, f.legacy_distinct_id, props.distinct_id]
        .into_iter()
        .flatten()
        .find(|v| !v.is_null());
    let distinct_id = match distinct_id(raw_id)? {
        Ok(id) => id,
        Err(reason) => return Ok(Err(reason)),
    };
    let uuid = f
        .uuid
        .and_then(|v| v.as_str())
        .and_then(|s| Uuid::parse_str(s).ok())
        .unwrap_or_else(|| super::ids::new_v7(ctx.now));
    let claims = Claims {
        timestamp: f
            .timestamp
            .and_then(|v| v.as_str())
            .and_then(timestamp::parse_ms),
        sent_at: if props.ignore_sent_at {
            None
        } else {
            ctx.sent_at
        },
        offset: f
            .offset
            .and_then(|v| v.as_f64())
            .filter(|o| o.is_finite())
            .map(|o| o as i64),
    };
    Ok(Ok(Normalised {
        name,
        distinct_id,
        uuid,
        claims,
    }))
}

/// [`normalise_event`] for an event held as a `serde_json` map (tests, benches,
/// tools): it is written out and parsed as a request body would be.
pub fn normalise(event: Map<String, Value>, ctx: &Context) -> Result<Outcome, Error> {
    let mut bytes = serde_json::to_vec(&event).map_err(|e| Error::InvalidJson(e.to_string()))?;
    let payload = parse(&mut bytes, false)?;
    let event = payload
        .events()
        .next()
        .ok_or(wrong("the payload", "an event"))?;
    normalise_event(event, ctx)
}

/// The top-level fields normalisation reads, found in one pass; the last of a
/// repeated key, as everywhere.
#[derive(Default)]
struct Fields<'t, 'a> {
    event: Option<TapeValue<'t, 'a>>,
    properties: Option<TapeValue<'t, 'a>>,
    distinct_id: Option<TapeValue<'t, 'a>>,
    legacy_distinct_id: Option<TapeValue<'t, 'a>>,
    uuid: Option<TapeValue<'t, 'a>>,
    timestamp: Option<TapeValue<'t, 'a>>,
    offset: Option<TapeValue<'t, 'a>>,
}

impl<'t, 'a> Fields<'t, 'a> {
    fn read(event: Object<'t, 'a>) -> Self {
        let mut f = Fields::default();
        for (key, v) in event.iter() {
            let slot = match key {
                "event" => &mut f.event,
                "properties" => &mut f.properties,
                "distinct_id" => &mut f.distinct_id,
                "$distinct_id" => &mut f.legacy_distinct_id,
                "uuid" => &mut f.uuid,
                "timestamp" => &mut f.timestamp,
                "offset" => &mut f.offset,
                _ => continue,
            };
            *slot = Some(v);
        }
        f
    }
}

/// What normalisation reads from `properties`.
#[derive(Default)]
struct Properties<'t, 'a> {
    distinct_id: Option<TapeValue<'t, 'a>>,
    ignore_sent_at: bool,
}

impl<'t, 'a> Properties<'t, 'a> {
    fn read(properties: Object<'t, 'a>) -> Self {
        let mut p = Properties::default();
        for (key, v) in properties.iter() {
            match key {
                "distinct_id" => p.distinct_id = Some(v),
                "$ignore_sent_at" => p.ignore_sent_at = v.as_bool() == Some(true),
                _ => {}
            }
        }
        p
    }
}

/// The distinct id from the first of root `distinct_id`, `$distinct_id` (legacy),
/// `properties.distinct_id` (batch items) that is not null; a number becomes its
/// decimal string.
fn distinct_id<'a>(
    raw: Option<TapeValue<'_, 'a>>,
) -> Result<Result<Cow<'a, str>, DropReason>, Error> {
    let Some(raw) = raw else {
        return Ok(Err(DropReason::MissingDistinctId));
    };
    let id = match raw.as_str() {
        Some(s) => clean(s),
        None => {
            let number = raw
                .number_string()
                .ok_or(wrong("distinct_id", "a string or a number"))?;
            Cow::Owned(clean(&number).into_owned())
        }
    };
    if id.is_empty() {
        return Ok(Err(DropReason::EmptyDistinctId));
    }
    Ok(Ok(id))
}

/// NUL becomes U+FFFD (stores and queries choke on it) and the id is cut to
/// [`MAX_DISTINCT_ID_CHARS`] characters.
pub fn clean_distinct_id(id: &str) -> String {
    clean(id).into_owned()
}

fn clean(id: &str) -> Cow<'_, str> {
    // Bytes bound characters: a short id without NUL is already clean.
    if id.len() <= MAX_DISTINCT_ID_CHARS && !id.contains('\0') {
        return Cow::Borrowed(id);
    }
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
