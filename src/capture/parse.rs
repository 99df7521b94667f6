//! The JSON shapes a capture request may carry, tried in the reference order: an array
//! of events, a batch envelope, a single event; on `/engage`, an object without `event`
//! is an `$identify`.

use serde_json::{Map, Value};

use super::json::parse_value;
use super::Error;

/// A decoded capture request.
#[derive(Debug, Default)]
pub struct Payload {
    pub events: Vec<Map<String, Value>>,
    /// The batch envelope's `api_key` or `token`, which wins over the events' own.
    pub batch_key: Option<String>,
    /// `historical_migration: true` on the envelope.
    pub historical: bool,
    /// The envelope's `sent_at`, unparsed.
    pub sent_at: Option<String>,
}

/// Parse a decoded body. `engage` is true on the `/engage` paths.
pub fn parse(bytes: &mut [u8], engage: bool) -> Result<Payload, Error> {
    let mut payload = match parse_value(bytes)? {
        Value::Array(items) => Payload {
            events: objects(items)?,
            ..Payload::default()
        },
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
        Value::Object(obj) => Payload {
            events: vec![obj],
            ..Payload::default()
        },
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
    /// The one project key of this request: the envelope's, else the single key every
    /// event carries. Events that disagree (including some with a key and some
    /// without) are an error, as in the reference service.
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

/// An event's own key: `api_key`, `token`, `$token`, then `properties.token`.
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

fn wrong(field: &'static str, expected: &'static str) -> Error {
    Error::WrongType { field, expected }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(json: &str, engage: bool) -> Result<Payload, Error> {
        parse(&mut json.as_bytes().to_vec(), engage)
    }

    #[test]
    fn shapes() {
        let single = p(r#"{"event":"a","distinct_id":"d","api_key":"k"}"#, false).unwrap();
        assert_eq!(single.events.len(), 1);
        assert_eq!(single.key().unwrap(), "k");

        let array = p(
            r#"[{"event":"a","token":"k"},{"event":"b","$token":"k"}]"#,
            false,
        )
        .unwrap();
        assert_eq!(array.events.len(), 2);
        assert_eq!(array.key().unwrap(), "k");

        let batch = p(
            r#"{"api_key":"k","historical_migration":true,"sent_at":"2024-01-01T00:00:00Z",
                "batch":[{"event":"a","properties":{"distinct_id":"d"}}]}"#,
            false,
        )
        .unwrap();
        assert!(batch.historical);
        assert_eq!(batch.sent_at.as_deref(), Some("2024-01-01T00:00:00Z"));
        assert_eq!(batch.key().unwrap(), "k");

        let props = p(r#"[{"event":"a","properties":{"token":"k"}}]"#, false).unwrap();
        assert_eq!(props.key().unwrap(), "k");
    }

    #[test]
    fn engage_without_event_is_identify() {
        let e = p(r#"{"$set":{"a":1},"distinct_id":"d","api_key":"k"}"#, true).unwrap();
        assert_eq!(e.events[0]["event"], "$identify");
        let not_engage = p(r#"{"$set":{"a":1},"distinct_id":"d","api_key":"k"}"#, false).unwrap();
        assert!(not_engage.events[0].get("event").is_none());
    }

    #[test]
    fn key_errors() {
        let none = p(r#"[{"event":"a"}]"#, false).unwrap();
        assert_eq!(none.key(), Err(Error::MissingKey));
        let mixed = p(
            r#"[{"event":"a","api_key":"k1"},{"event":"b","api_key":"k2"}]"#,
            false,
        )
        .unwrap();
        assert_eq!(mixed.key(), Err(Error::MixedKeys));
        let partly = p(r#"[{"event":"a","api_key":"k1"},{"event":"b"}]"#, false).unwrap();
        assert_eq!(partly.key(), Err(Error::MixedKeys));
        let numeric = p(r#"{"event":"a","api_key":5}"#, false).unwrap();
        assert_eq!(numeric.key(), Err(wrong("api_key", "a string")));
        // The envelope's key wins over the events'.
        let batch = p(
            r#"{"token":"k","batch":[{"event":"a","api_key":"other"}]}"#,
            false,
        )
        .unwrap();
        assert_eq!(batch.key().unwrap(), "k");
    }

    #[test]
    fn shape_errors() {
        assert_eq!(p("[]", false).unwrap_err(), Error::EmptyBatch);
        assert_eq!(p(r#"{"batch":[]}"#, false).unwrap_err(), Error::EmptyBatch);
        assert_eq!(
            p("42", false).unwrap_err(),
            wrong("the payload", "an event, an array or a batch object")
        );
        assert_eq!(
            p("[1]", false).unwrap_err(),
            wrong("each event", "a JSON object")
        );
        assert_eq!(
            p(r#"{"batch":{}}"#, false).unwrap_err(),
            wrong("batch", "an array of events")
        );
        assert!(matches!(p("{", false), Err(Error::InvalidJson(_))));
    }
}
