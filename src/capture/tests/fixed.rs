//! The keys edge mode fixes at ingest, checked on the stored record: the uuid, the
//! corrected timestamp with `$ignore_sent_at`, `$sent_at`, and `$ip` only when the
//! event has none or a falsy one.

use serde_json::{json, Value};

use super::*;
use crate::capture::parse;
use crate::log::Record;

const NOW: i64 = 1_700_000_000_000;
const HOUR: i64 = 3_600_000;

fn ctx(sent_at: Option<i64>) -> Context {
    Context {
        project: 1,
        now: NOW,
        sent_at,
        historical: false,
        ip: Some("203.0.113.7".parse().unwrap()),
    }
}

fn fixed_with(body: &str, engage: bool, c: &Context, fixing: Fixing) -> Vec<Record> {
    let mut bytes = body.as_bytes().to_vec();
    let payload = parse(&mut bytes, engage).unwrap();
    payload
        .events()
        .map(|e| match encode_fixed(e, c, fixing).unwrap() {
            Encoded::Keep(bytes) => Record::decode(&bytes).unwrap(),
            Encoded::Drop(d) => panic!("dropped: {d:?}"),
        })
        .collect()
}

fn one(body: &str, c: &Context) -> (Record, Value) {
    let mut all = fixed_with(body, false, c, Fixing::default());
    assert_eq!(all.len(), 1);
    let r = all.remove(0);
    let data: Value = serde_json::from_slice(&r.data).unwrap();
    (r, data)
}

#[test]
fn an_event_without_a_uuid_gets_one_written_into_it() {
    let (r, data) = one(r#"{"event":"e","distinct_id":"d"}"#, &ctx(None));
    assert_eq!(r.uuid.get_version_num(), 7);
    assert_eq!(
        data,
        json!({"event": "e", "distinct_id": "d",
               "properties": {"$ip": "203.0.113.7", "$ignore_sent_at": true},
               "uuid": r.uuid.to_string(), "timestamp": "2023-11-14T22:13:20.000Z"})
    );
    assert_eq!(r.timestamp, NOW);
}

#[test]
fn a_clients_uuid_is_kept_in_its_canonical_form() {
    let body = r#"{"event":"e","distinct_id":"d","uuid":"0190F7B4-6A36-7C5D-8B8E-4C6A2D5E9F01"}"#;
    let (r, data) = one(body, &ctx(None));
    assert_eq!(r.uuid.to_string(), "0190f7b4-6a36-7c5d-8b8e-4c6a2d5e9f01");
    assert_eq!(data["uuid"], "0190f7b4-6a36-7c5d-8b8e-4c6a2d5e9f01");
    // Sent again: the same keys, byte for byte, but for the arrival time.
    let (again, _) = one(body, &ctx(None));
    assert_eq!(again.data, r.data);
}

#[test]
fn an_hour_of_skew_is_corrected_and_kept_fixed() {
    // The client's clock is an hour fast; the event happened 2 s before sending.
    let fast = NOW + HOUR;
    let body = r#"{"event":"e","distinct_id":"d","timestamp":"2023-11-14T23:13:18Z","properties":{"$ignore_sent_at":false,"a":1}}"#;
    let (r, data) = one(body, &ctx(Some(fast)));
    assert_eq!(r.timestamp, NOW - 2000);
    assert_eq!(data["timestamp"], "2023-11-14T22:13:18.000Z");
    assert_eq!(
        data["properties"],
        json!({"a": 1, "$ip": "203.0.113.7", "$sent_at": "2023-11-14T23:13:20.000Z", "$ignore_sent_at": true})
    );
    // The stored event read again (as the forwarder's resend would carry it) keeps
    // its timestamp whatever the request's `sent_at` says now.
    let mut again =
        serde_json::to_vec(&json!({"batch": [data], "sent_at": "2030-01-01T00:00:00Z"})).unwrap();
    let payload = parse(&mut again, false).unwrap();
    let later = Context {
        now: NOW + 5 * HOUR,
        ..ctx(Some(NOW + 5 * HOUR + HOUR))
    };
    let e = payload.events().next().unwrap();
    let Encoded::Keep(bytes) = encode_fixed(e, &later, Fixing::default()).unwrap() else {
        panic!("kept")
    };
    assert_eq!(Record::decode(&bytes).unwrap().timestamp, NOW - 2000);
}

#[test]
fn offset_and_the_future_clamp_are_folded_in() {
    let (r, data) = one(
        r#"{"event":"e","distinct_id":"d","offset":1500}"#,
        &ctx(None),
    );
    assert_eq!(r.timestamp, NOW - 1500);
    assert_eq!(data.get("offset"), None);
    assert_eq!(data["timestamp"], "2023-11-14T22:13:18.500Z");
    let far = r#"{"event":"e","distinct_id":"d","timestamp":"2023-11-16T22:13:20Z"}"#;
    assert_eq!(one(far, &ctx(None)).0.timestamp, NOW);
}

#[test]
fn ip_only_when_absent_or_falsy() {
    for (sent, kept) in [
        (json!("198.51.100.1"), json!("198.51.100.1")),
        (json!(""), json!("203.0.113.7")),
        (json!(null), json!("203.0.113.7")),
        (json!(false), json!("203.0.113.7")),
        (json!(0), json!("203.0.113.7")),
    ] {
        let body =
            json!({"event": "e", "distinct_id": "d", "properties": {"$ip": sent}}).to_string();
        let (_, data) = one(&body, &ctx(None));
        assert_eq!(data["properties"]["$ip"], kept, "{body}");
    }
    let anonymized = fixed_with(
        r#"{"event":"e","distinct_id":"d"}"#,
        false,
        &ctx(None),
        Fixing {
            anonymize_ips: true,
        },
    );
    let data: Value = serde_json::from_slice(&anonymized[0].data).unwrap();
    assert_eq!(data["properties"], json!({"$ignore_sent_at": true}));
}

#[test]
fn repeated_keys_and_implied_identify() {
    // A repeated key goes through serde_json: the last wins, the keys are fixed.
    let (r, data) = one(
        r#"{"event":"e","distinct_id":"d","properties":{"$ip":"","$ip":"","x":1}}"#,
        &ctx(None),
    );
    assert_eq!(
        data["properties"],
        json!({"$ip": "203.0.113.7", "x": 1, "$ignore_sent_at": true})
    );
    assert_eq!(data["uuid"], r.uuid.to_string());
    let identify = fixed_with(
        r#"{"$set":{"a":1},"distinct_id":"d"}"#,
        true,
        &ctx(None),
        Fixing::default(),
    );
    let data: Value = serde_json::from_slice(&identify[0].data).unwrap();
    assert_eq!(data["event"], "$identify");
    assert_eq!(identify[0].event, "$identify");
    assert_eq!(data["$set"], json!({"a": 1}));
}

#[test]
fn drops_and_errors_are_those_of_capture() {
    let mut bytes =
        br#"{"batch":[{"distinct_id":"d"},{"event":"e","distinct_id":"d","properties":[1]}]}"#
            .to_vec();
    let payload = parse(&mut bytes, false).unwrap();
    let mut events = payload.events();
    assert!(matches!(
        encode_fixed(events.next().unwrap(), &ctx(None), Fixing::default()),
        Ok(Encoded::Drop(_))
    ));
    assert!(encode_fixed(events.next().unwrap(), &ctx(None), Fixing::default()).is_err());
}

/// The event copied from the body with its keys fixed, and written from the tape
/// (`None` when it is not in the stored form and so never copied).
fn both_ways(body: &str, fixer: &Fixer) -> Vec<(Option<Vec<u8>>, Vec<u8>)> {
    let mut bytes = body.as_bytes().to_vec();
    let payload = parse(&mut bytes, false).unwrap();
    payload
        .events()
        .map(|e| {
            let keys = Added {
                uuid: uuid::Uuid::from_u128(0x0190_f7b4_6a36_7c5d_8b8e_4c6a_2d5e_9f01),
                timestamp: NOW - 1500,
                sent_at: fixer.sent_at.as_deref(),
                ip: fixer.ip.as_deref(),
            };
            let copied = crate::capture::data::as_sent_at(e).map(|(bytes, origin)| {
                let mut out = b"head".to_vec();
                let sent = Sent { bytes, origin };
                fixer.spliced(&mut out, e.object, sent, &keys).unwrap();
                out.split_off(4)
            });
            let mut reference = Vec::new();
            written(&mut reference, e, &keys).unwrap();
            (copied, reference)
        })
        .collect()
}

#[test]
fn events_copied_from_the_body_are_written_byte_for_byte_the_same() {
    let bodies = [
        r#"{"event":"e","distinct_id":"d"}"#,
        r#"{"event":"e","distinct_id":"d","properties":{}}"#,
        r#"{"event":"e","distinct_id":"d","properties":null}"#,
        r#"{"properties":null,"event":"e","distinct_id":"d"}"#,
        r#"{"uuid":"0190f7b4-6a36-7c5d-8b8e-4c6a2d5e9f01","event":"e","distinct_id":"d"}"#,
        r#"{"event":"e","timestamp":"2023-11-14T22:13:18Z","offset":5,"distinct_id":"d","uuid":"x"}"#,
        r#"{"timestamp":"2023-11-14T22:13:18Z","event":"e","distinct_id":"d"}"#,
        r#"{"event":"e","properties":{"$ip":"","a":[1,{"$ip":"x"}],"$sent_at":"y","$ignore_sent_at":false},"distinct_id":"d"}"#,
        r#"{"event":"e","properties":{"$ignore_sent_at":true},"distinct_id":"d"}"#,
        r#"{"event":"e","properties":{"$ip":"198.51.100.1","b":{"c":"é 日本"}},"distinct_id":"d","x":[]}"#,
        r#"{"event":"e","properties":{"$ip":0,"$sent_at":null,"z":1.5},"distinct_id":"d","offset":3}"#,
        r#"{"batch":[{"event":"a","distinct_id":"d","properties":{"distinct_id":"p","k":"v"}},{"event":"b","distinct_id":"d","uuid":"u","properties":{"$ip":false}}],"api_key":"k"}"#,
    ];
    let contexts = [
        ctx(None),
        ctx(Some(NOW + HOUR)),
        Context {
            ip: None,
            ..ctx(Some(NOW))
        },
    ];
    let mut copies = 0;
    for c in &contexts {
        for fixing in [
            Fixing::default(),
            Fixing {
                anonymize_ips: true,
            },
        ] {
            let fixer = Fixer::new(c, fixing);
            for body in bodies {
                for (copied, reference) in both_ways(body, &fixer) {
                    let copied = copied.unwrap_or_else(|| panic!("not copied: {body}"));
                    assert_eq!(
                        String::from_utf8_lossy(&copied),
                        String::from_utf8_lossy(&reference),
                        "{body}"
                    );
                    copies += 1;
                }
            }
        }
    }
    assert_eq!(copies, 6 * (bodies.len() + 1));
    // What is not in the stored form is written, through the same keys.
    let [(copied, reference)] = &both_ways(
        r#"{"event" : "e","distinct_id":"d"}"#,
        &Fixer::new(&ctx(None), Fixing::default()),
    )[..] else {
        panic!("one event")
    };
    assert_eq!(*copied, None);
    let v: Value = serde_json::from_slice(reference).unwrap();
    assert_eq!(v["properties"]["$ip"], "203.0.113.7");
}
