//! The tape-based parse and normalisation against the `serde_json::Value` pipeline
//! they replaced, kept here as the reference: for real client payloads and for
//! hostile ones, both give the same errors, keys, drops and records, down to the bytes
//! of `Record::data`.
//!
//! The reference shares only types with the code it checks (the record, the context,
//! the errors), never a helper: its depth limit, distinct id cleaning, time parsing
//! and clock-skew correction are written again below, so a bug in one of the
//! production helpers shows up as a difference instead of passing on both sides.

use serde_json::{Map, Value};
use uuid::Uuid;

use super::{encode_event, normalise_event, parse, Context, DropReason, Encoded, Error, Outcome};
use crate::log::Record;

/// The reference pipeline: parse into `serde_json::Value`, then normalise each map.
#[path = "reference.rs"]
mod reference;

const NOW: i64 = 1_750_000_000_000;

/// What a request turned into, comparable between the two pipelines.
#[derive(Debug, PartialEq)]
struct Outcomes {
    key: Result<String, Error>,
    historical: bool,
    sent_at: Option<String>,
    events: Vec<Result<Result<Record, DropReason>, Error>>,
}

/// The request's context; `sent_at` as parsed by the side under test.
fn context(sent_at: Option<i64>, query_sent_at: Option<i64>, historical: bool) -> Context {
    Context {
        project: 3,
        now: NOW,
        sent_at: sent_at.or(query_sent_at),
        historical,
        ip: Some("81.2.69.160".parse().expect("an address")),
    }
}

fn flatten(outcome: Result<Outcome, Error>) -> Result<Result<Record, DropReason>, Error> {
    outcome.map(|o| match o {
        Outcome::Keep(r) => Ok(*r),
        Outcome::Drop(d) => Err(d),
    })
}

fn old(body: &[u8], engage: bool, query_sent_at: Option<i64>) -> Result<Outcomes, Error> {
    let payload = reference::parse(&mut body.to_vec(), engage)?;
    let sent_at = payload.sent_at.as_deref().and_then(reference::parse_ms);
    let ctx = context(sent_at, query_sent_at, payload.historical);
    Ok(Outcomes {
        key: payload.key().map(str::to_owned),
        historical: payload.historical,
        sent_at: payload.sent_at.clone(),
        events: payload
            .events
            .into_iter()
            .map(|e| flatten(reference::normalise(e, &ctx)))
            .collect(),
    })
}

fn new(body: &[u8], engage: bool, query_sent_at: Option<i64>) -> Result<Outcomes, Error> {
    let mut bytes = body.to_vec();
    let payload = parse(&mut bytes, engage)?;
    let sent_at = payload.sent_at.and_then(super::timestamp::parse_ms);
    let ctx = context(sent_at, query_sent_at, payload.historical);
    Ok(Outcomes {
        key: payload.key().map(str::to_owned),
        historical: payload.historical,
        sent_at: payload.sent_at.map(str::to_owned),
        events: payload
            .events()
            .map(|e| {
                let mut outcome = flatten(normalise_event(e, &ctx));
                let mut direct = encoded(encode_event(e, &ctx));
                for o in [&mut outcome, &mut direct] {
                    if let Ok(Ok(record)) = o {
                        forget_made_up_uuid(record);
                    }
                }
                assert_eq!(direct, outcome, "encode_event");
                outcome
            })
            .collect(),
    })
}

/// What [`encode_event`] wrote, decoded; a made-up uuid as [`normalise_event`]'s.
fn encoded(e: Result<Encoded, Error>) -> Result<Result<Record, DropReason>, Error> {
    e.map(|e| match e {
        Encoded::Keep(bytes) => Ok(Record::decode(&bytes).expect("decodes")),
        Encoded::Drop(d) => Err(d),
    })
}

/// Both pipelines agree on `body`. A uuid made up for an event (v7, random) is the
/// one thing that may differ; it is compared as nil.
fn same(name: &str, body: &[u8]) {
    for engage in [false, true] {
        for query_sent_at in [None, Some(NOW - 3_600_000)] {
            let mut old = old(body, engage, query_sent_at);
            let mut new = new(body, engage, query_sent_at);
            for outcomes in [&mut old, &mut new].into_iter().flatten() {
                for record in outcomes.events.iter_mut().flatten().flatten() {
                    if record.uuid.get_version_num() == 7 && record.uuid.get_timestamp().is_some() {
                        let given = String::from_utf8_lossy(&record.data)
                            .contains(&record.uuid.to_string());
                        if !given {
                            record.uuid = Uuid::nil();
                        }
                    }
                }
            }
            assert_eq!(new, old, "{name} (engage {engage}, _ {query_sent_at:?})");
        }
    }
}

/// A uuid made up for an event (v7, not in the event as sent) becomes nil.
fn forget_made_up_uuid(record: &mut Record) {
    let made_up = record.uuid.get_version_num() == 7
        && !String::from_utf8_lossy(&record.data).contains(&record.uuid.to_string());
    if made_up {
        record.uuid = Uuid::nil();
    }
}

/// The posthog-js batch the decode bench uses, as the browser sends it.
fn posthog_js_batch() -> Vec<u8> {
    let lz64 = include_str!("../../../benches/fixtures/posthog-js-batch.lz64");
    crate::lz64::decompress_from_base64(lz64.trim().as_bytes(), 1 << 24)
        .expect("the fixture decodes")
        .into_bytes()
}

#[test]
fn real_client_payloads() {
    let batch = posthog_js_batch();
    same("posthog-js batch", &batch);
    let Ok(Value::Array(events)) = serde_json::from_slice::<Value>(&batch) else {
        panic!("the fixture is an array of events");
    };
    assert_eq!(events.len(), 30);
    // Each event on its own, as a single-event capture request.
    for (n, event) in events.iter().enumerate() {
        same(&format!("event {n}"), &serde_json::to_vec(event).unwrap());
    }
    // Wrapped as the server SDKs send them: an envelope with a key and sent_at.
    let envelope = serde_json::json!({
        "api_key": "phc_envelope",
        "historical_migration": true,
        "sent_at": "2025-06-15T15:06:40.250Z",
        "batch": events,
    });
    same("envelope", &serde_json::to_vec(&envelope).unwrap());
    // Past the parse's scratch (256 KiB), as an edge forwards 1000 events at once:
    // the same records, and every event in the stored form copied as sent.
    let many: Vec<Value> = events
        .iter()
        .cycle()
        .take(events.len() * 12)
        .cloned()
        .collect();
    let big = serde_json::to_vec(&serde_json::json!({"api_key": "phc_k", "batch": many})).unwrap();
    assert!(big.len() > 256 * 1024, "{} bytes", big.len());
    same("large envelope", &big);
    let mut bytes = big.clone();
    let payload = parse(&mut bytes, false).unwrap();
    let copied = payload
        .events()
        .filter(|e| super::data::as_sent(*e).is_some());
    let plain = many
        .iter()
        .filter(|e| !serde_json::to_vec(e).unwrap().contains(&b'\\'));
    assert!(
        plain.clone().count() > 0,
        "the fixture has events without escapes"
    );
    assert_eq!(copied.count(), plain.count());
    // The lz64 capture fixture's payloads, one per path.
    let fixture: Map<String, Value> =
        serde_json::from_str(include_str!("../../../tests/fixtures/lz64_capture.json")).unwrap();
    // One per capture path today: a fixture cut down to nothing would compare nothing.
    assert!(fixture.len() >= 12, "{} lz64 payloads", fixture.len());
    for (path, lz64) in fixture {
        let body = crate::lz64::decompress_from_base64(
            lz64.as_str().expect("a string").as_bytes(),
            1 << 20,
        )
        .expect("decodes");
        same(&path, body.as_bytes());
    }
}

/// The inputs the `capture_parse` fuzzer found (a flags byte, then the body).
#[test]
fn fuzz_findings() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fuzz/capture_parse");
    let mut count = 0;
    for entry in std::fs::read_dir(dir).expect("the fuzz fixtures") {
        let path = entry.expect("an entry").path();
        let input = std::fs::read(&path).expect("a fixture");
        if let Some((_, body)) = input.split_first() {
            same(&path.display().to_string(), body);
            count += 1;
        }
    }
    // The findings committed today: fewer means a fixture went missing.
    assert!(count >= 3, "{count} capture_parse findings");
}

#[test]
fn hostile_payloads() {
    let bodies: &[&str] = &[
        // Escapes, unicode, control characters, in keys and values.
        r#"{"event":"e\u0000\"\\\/\b\f\n\r\t","distinct_id":"a\u0000b","api_key":"k","properties":{"k\ney":"\ud83d\ude00 é 日本","\u001f":"\u007f"}}"#,
        // Numbers of every kind.
        r#"{"event":"n","distinct_id":123456789012345678901234567890,"api_key":"k","properties":{"a":-0,"b":-0.0,"c":1E5,"d":1e300,"e":-1e-300,"f":18446744073709551615,"g":-9223372036854775808,"h":0.1,"i":1.0,"j":[1,2.5,-3]}}"#,
        r#"{"event":"n","distinct_id":-1.5e10,"api_key":"k","offset":1e300}"#,
        r#"{"event":"n","distinct_id":18446744073709551615,"api_key":"k","offset":-250.7}"#,
        r#"{"event":"n","distinct_id":1.0,"api_key":"k","offset":"12"}"#,
        // Repeated keys, at the top and nested: the last value wins, stored once.
        r#"{"event":"first","event":"second","distinct_id":"d","api_key":"k","distinct_id":"d2"}"#,
        r#"{"event":"e","distinct_id":"d","api_key":"k","properties":{"x":1,"y":{"z":1,"z":2},"x":3}}"#,
        r#"{"event":"e","distinct_id":null,"distinct_id":"late","api_key":"k"}"#,
        r#"{"event":"e","distinct_id":"d","api_key":"k","api_key":"k2"}"#,
        // Where the distinct id comes from.
        r#"{"event":"e","$distinct_id":"legacy","api_key":"k"}"#,
        r#"{"event":"e","distinct_id":null,"$distinct_id":null,"properties":{"distinct_id":7},"api_key":"k"}"#,
        r#"{"event":"e","distinct_id":"","properties":{"distinct_id":"p"},"api_key":"k"}"#,
        r#"{"event":"e","distinct_id":true,"api_key":"k"}"#,
        r#"{"event":"e","api_key":"k"}"#,
        r#"{"event":"","distinct_id":"d","api_key":"k"}"#,
        r#"{"event":null,"distinct_id":"d","api_key":"k"}"#,
        r#"{"event":5,"distinct_id":"d","api_key":"k"}"#,
        r#"{"event":"e","distinct_id":"d","properties":[1],"api_key":"k"}"#,
        r#"{"event":"e","distinct_id":"d","properties":null,"token":"k"}"#,
        // Times.
        r#"{"event":"t","distinct_id":"d","api_key":"k","timestamp":"2025-06-15T14:00:00Z","properties":{"$ignore_sent_at":true}}"#,
        r#"{"event":"t","distinct_id":"d","api_key":"k","timestamp":"2025-06-15T14:00:00Z","properties":{"$ignore_sent_at":"true"}}"#,
        r#"{"event":"t","distinct_id":"d","api_key":"k","timestamp":"2099-01-01"}"#,
        r#"{"event":"t","distinct_id":"d","api_key":"k","timestamp":12,"offset":null}"#,
        // uuids.
        r#"{"event":"u","distinct_id":"d","api_key":"k","uuid":"0190f7b4-6a36-7c5d-8b8e-4c6a2d5e9f01"}"#,
        r#"{"event":"u","distinct_id":"d","api_key":"k","uuid":"0190F7B46A367C5D8B8E4C6A2D5E9F01"}"#,
        // Shapes and keys.
        r#"[{"event":"a","token":"k"},{"event":"b","$token":"k","distinct_id":"d"},{"distinct_id":"d","properties":{"token":"k"}}]"#,
        r#"[{"event":"a","api_key":"k1","distinct_id":"d"},{"event":"b","api_key":"k2","distinct_id":"d"}]"#,
        r#"[{"event":"a","properties":{"token":5},"distinct_id":"d"}]"#,
        r#"[{"event":"a","properties":"p","distinct_id":"d"}]"#,
        r#"{"token":"k","batch":[{"event":"a","distinct_id":"d"}],"batch":[{"event":"b","distinct_id":"d"}],"sent_at":5}"#,
        r#"{"api_key":null,"token":"t","batch":[{}],"historical_migration":"yes"}"#,
        r#"{"api_key":["k"],"batch":[{"event":"e","distinct_id":"d"}]}"#,
        r#"{"api_key":"k","batch":[1]}"#,
        r#"{"api_key":"k","batch":{}}"#,
        r#"{"batch":[]}"#,
        "[]",
        "{}",
        "[{}]",
        r#"{"$set":{"a":1},"distinct_id":"d","api_key":"k"}"#,
        r#"{"$set":{"a":1},"$set":{"b":2},"distinct_id":"d","api_key":"k"}"#,
        "42",
        r#""event""#,
        "null",
        // Not JSON, or not JSON serde accepts.
        r#"{"event":"#,
        r#"{"event":"e",}"#,
        "[{]",
        "{'event': 'e'}",
        r#"{"event":"inf","distinct_id":1e400}"#,
        r#"{"event":"e"} {"event":"f"}"#,
        "[1] x",
        "\u{feff}{}",
    ];
    for body in bodies {
        same(body, body.as_bytes());
    }
    same(
        "invalid UTF-8",
        b"{\"event\":\"\xff\xfe\",\"distinct_id\":\"d\",\"api_key\":\"k\"}",
    );
    let long = format!(
        r#"{{"event":"e","distinct_id":"{}","api_key":"k"}}"#,
        "é".repeat(300)
    );
    same("long distinct id", long.as_bytes());
    let deep = format!("[{}{}]", "[".repeat(200), "]".repeat(200));
    same("deep", deep.as_bytes());
    let nested = format!(
        r#"{{"event":"e","distinct_id":"d","api_key":"k","properties":{{"p":{}1{}}}}}"#,
        "[".repeat(120),
        "]".repeat(120)
    );
    same("nested within the limit", nested.as_bytes());
}
