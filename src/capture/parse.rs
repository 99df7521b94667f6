//! The JSON shapes a capture request may carry, tried in the reference order: an array
//! of events, a batch envelope, a single event; on `/engage`, an object without `event`
//! is an `$identify`.
//!
//! The body is parsed once into a simd-json tape that borrows its strings from the
//! body; events are views into it, never trees of owned values.

use simd_json::Node;

use super::json::{parse_tape_keeping, recycle, recycle_original};
use super::tape::{Array, Object, Value};
use super::Error;

/// A decoded capture request, borrowing from the body it was parsed from.
#[derive(Debug)]
pub struct Payload<'a> {
    tape: Vec<Node<'a>>,
    /// Where the events are: the tape index of an array of them or of the one event.
    events: Events,
    engage: bool,
    /// The length of the body parsed.
    body_len: usize,
    /// The body as sent, when it was copied before parsing, and where the parsed
    /// buffer starts: see [`Sent`].
    original: Option<Vec<u8>>,
    base: usize,
    /// The batch envelope's `api_key` or `token`, which wins over the events' own.
    pub batch_key: Option<&'a str>,
    /// `historical_migration: true` on the envelope.
    pub historical: bool,
    /// The envelope's `sent_at`, unparsed.
    pub sent_at: Option<&'a str>,
}

#[derive(Debug, Clone, Copy)]
enum Events {
    /// The array at this tape index; every element is an object.
    Array(usize),
    /// The root object is the only event.
    Single,
}

/// Room for what writing an event back out may add over its share of the body:
/// escapes serde_json writes differently, an implied `$identify`.
const EVENT_SLACK_BYTES: usize = 64;

/// The body as sent, beside the tape parsed from it: an event already in the stored
/// form is copied from it (see `data`).
#[derive(Debug, Clone, Copy)]
pub struct Sent<'t> {
    /// The body before parsing: simd-json rewrites escaped strings in place.
    pub original: &'t [u8],
    /// The address of the buffer the tape was parsed from. A string of the tape sits
    /// at the same offset in that buffer as in `original`.
    pub base: usize,
}

/// The event name `/engage` gives an object without one.
pub(super) const IDENTIFY: &str = "$identify";

/// One event object of a [`Payload`].
#[derive(Debug, Clone, Copy)]
pub struct Event<'t, 'a> {
    pub(super) object: Object<'t, 'a>,
    /// On `/engage`, an event without an `event` key is an `$identify`.
    pub(super) engage: bool,
    /// About how many bytes the event takes as JSON.
    pub(super) size_hint: usize,
    /// The body as sent, to copy the event from when it is in the stored form.
    pub(super) sent: Option<Sent<'t>>,
}

impl Event<'_, '_> {
    /// The `event` key is missing and the request came to `/engage`: the event is
    /// read and stored as if it had `"event":"$identify"` last.
    pub(super) fn implied_identify(&self) -> bool {
        self.engage && !self.object.contains_key("event")
    }
}

/// Parse a decoded body. `engage` is true on the `/engage` paths. The buffer is used
/// as scratch space by simd-json, and the payload borrows its strings.
pub fn parse(bytes: &mut [u8], engage: bool) -> Result<Payload<'_>, Error> {
    let body_len = bytes.len();
    let base = bytes.as_ptr() as usize;
    let parsed = parse_tape_keeping(bytes)?;
    let (tape, original) = (parsed.tape, parsed.original);
    let root =
        Value::root(&tape).ok_or(wrong("the payload", "an event, an array or a batch object"))?;
    let mut batch_key = None;
    let mut historical = false;
    let mut sent_at = None;
    let (events, count) = if let Some(items) = root.as_array() {
        (Events::Array(0), objects(items)?)
    } else if let Some(obj) = root.as_object() {
        if let Some(batch) = obj.get("batch") {
            let items = batch
                .as_array()
                .ok_or(wrong("batch", "an array of events"))?;
            let count = objects(items)?;
            batch_key = key_field(obj, &["api_key", "token"])?;
            historical = obj
                .get("historical_migration")
                .and_then(|v| v.as_bool())
                .unwrap_or(false);
            sent_at = obj.get("sent_at").and_then(|v| v.as_str());
            (Events::Array(index_of(&tape, batch)), count)
        } else {
            (Events::Single, 1)
        }
    } else {
        return Err(wrong("the payload", "an event, an array or a batch object"));
    };
    if count == 0 {
        return Err(Error::EmptyBatch);
    }
    Ok(Payload {
        tape,
        events,
        engage,
        body_len,
        original,
        base,
        batch_key,
        historical,
        sent_at,
    })
}

impl Drop for Payload<'_> {
    fn drop(&mut self) {
        recycle(std::mem::take(&mut self.tape));
        if let Some(original) = self.original.take() {
            recycle_original(original);
        }
    }
}

/// The position of `v` in `tape`, which it is a part of.
fn index_of(tape: &[Node<'_>], v: Value<'_, '_>) -> usize {
    let start = tape.as_ptr() as usize;
    (v.node() as *const Node<'_> as usize - start) / std::mem::size_of::<Node<'_>>()
}

impl<'a> Payload<'a> {
    /// How many events the request carries (at least one).
    pub fn len(&self) -> usize {
        self.array().map_or(1, |a| a.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn array(&self) -> Option<Array<'_, 'a>> {
        match self.events {
            Events::Array(at) => Value::root(self.tape.get(at..)?)?.as_array(),
            Events::Single => None,
        }
    }

    /// The events, in the order sent.
    pub fn events(&self) -> impl Iterator<Item = Event<'_, 'a>> + '_ {
        let single = match self.events {
            Events::Single => Value::root(&self.tape),
            Events::Array(_) => None,
        };
        let engage = self.engage;
        let size_hint = self.body_len / self.len().max(1) + EVENT_SLACK_BYTES;
        let sent = self.original.as_deref().map(|original| Sent {
            original,
            base: self.base,
        });
        self.array()
            .into_iter()
            .flat_map(|a| a.iter())
            .chain(single)
            .filter_map(move |v| {
                Some(Event {
                    object: v.as_object()?,
                    engage,
                    size_hint,
                    sent,
                })
            })
    }

    /// The one project key of this request: the envelope's, else the single key every
    /// event carries. Events that disagree (including some with a key and some
    /// without) are an error, as in the reference service.
    pub fn key(&self) -> Result<&'a str, Error> {
        if let Some(key) = self.batch_key {
            return Ok(key);
        }
        let mut found: Option<Option<&'a str>> = None;
        for event in self.events() {
            let key = event_key(event.object)?;
            match found {
                None => found = Some(key),
                Some(prev) if prev != key => return Err(Error::MixedKeys),
                Some(_) => {}
            }
        }
        found.flatten().ok_or(Error::MissingKey)
    }
}

/// How many items there are, all of them objects.
fn objects(items: Array<'_, '_>) -> Result<usize, Error> {
    if items.iter().all(|item| item.as_object().is_some()) {
        Ok(items.len())
    } else {
        Err(wrong("each event", "a JSON object"))
    }
}

/// An event's own key: `api_key`, `token`, `$token`, then `properties.token`.
fn event_key<'a>(event: Object<'_, 'a>) -> Result<Option<&'a str>, Error> {
    if let Some(key) = key_field(event, &["api_key", "token", "$token"])? {
        return Ok(Some(key));
    }
    match event.get("properties").and_then(|p| p.get("token")) {
        None => Ok(None),
        Some(v) if v.is_null() => Ok(None),
        Some(v) => v.as_str().map(Some).ok_or(wrong("api_key", "a string")),
    }
}

fn key_field<'a>(obj: Object<'_, 'a>, names: &[&str]) -> Result<Option<&'a str>, Error> {
    for name in names {
        match obj.get(name) {
            None => {}
            Some(v) if v.is_null() => {}
            Some(v) => return v.as_str().map(Some).ok_or(wrong("api_key", "a string")),
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

    /// The payload borrows its body, which a test keeps for its whole run.
    fn p(json: &str, engage: bool) -> Result<Payload<'static>, Error> {
        parse(json.as_bytes().to_vec().leak(), engage)
    }

    /// The first event as the log would store it.
    fn first(payload: &Payload<'_>) -> crate::capture::Outcome {
        let event = payload.events().next().unwrap();
        crate::capture::normalise_event(event, &ctx()).unwrap()
    }

    fn ctx() -> crate::capture::Context {
        crate::capture::Context {
            project: 1,
            now: 0,
            sent_at: None,
            historical: false,
            ip: None,
        }
    }

    #[test]
    fn shapes() {
        let single = p(r#"{"event":"a","distinct_id":"d","api_key":"k"}"#, false).unwrap();
        assert_eq!(single.len(), 1);
        assert_eq!(single.key().unwrap(), "k");

        let array = p(
            r#"[{"event":"a","token":"k"},{"event":"b","$token":"k"}]"#,
            false,
        )
        .unwrap();
        assert_eq!(array.len(), 2);
        assert_eq!(array.key().unwrap(), "k");

        let batch = p(
            r#"{"api_key":"k","historical_migration":true,"sent_at":"2024-01-01T00:00:00Z",
                "batch":[{"event":"a","properties":{"distinct_id":"d"}}]}"#,
            false,
        )
        .unwrap();
        assert!(batch.historical);
        assert_eq!(batch.sent_at, Some("2024-01-01T00:00:00Z"));
        assert_eq!(batch.key().unwrap(), "k");

        let props = p(r#"[{"event":"a","properties":{"token":"k"}}]"#, false).unwrap();
        assert_eq!(props.key().unwrap(), "k");
    }

    #[test]
    fn engage_without_event_is_identify() {
        use crate::capture::{DropReason, Outcome};
        let e = p(r#"{"$set":{"a":1},"distinct_id":"d","api_key":"k"}"#, true).unwrap();
        let Outcome::Keep(r) = first(&e) else {
            panic!("dropped")
        };
        assert_eq!(r.event, "$identify");
        assert_eq!(
            r.data,
            br#"{"$set":{"a":1},"distinct_id":"d","api_key":"k","event":"$identify"}"#
        );
        let not_engage = p(r#"{"$set":{"a":1},"distinct_id":"d","api_key":"k"}"#, false).unwrap();
        assert!(matches!(
            first(&not_engage),
            Outcome::Drop(DropReason::MissingEventName)
        ));
        // An event that has a name, even null, keeps it on /engage.
        let null = p(r#"{"event":null,"distinct_id":"d","api_key":"k"}"#, true).unwrap();
        assert!(matches!(
            first(&null),
            Outcome::Drop(DropReason::MissingEventName)
        ));
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
