//! The v1 rules and the mapping of a v1 event to its `/batch/` form.

use serde_json::{json, Value};

use super::*;
use crate::log::Record;

const UUID: &str = "0190f7b4-6a36-7c5d-8b8e-4c6a2d5e9f01";
const UUID2: &str = "0190f7b4-6a36-7c5d-8b8e-4c6a2d5e9f02";
const NOW: i64 = 1_700_000_000_000;

fn batch(events: Value) -> Batch {
    serde_json::from_value(json!({"created_at": "2023-11-14T22:13:20Z", "batch": events})).unwrap()
}

fn event(extra: Value) -> Value {
    let mut e = json!({"event": "$pageview", "uuid": UUID, "distinct_id": "user-1",
                       "timestamp": "2023-11-14T22:13:18.500Z"});
    for (k, v) in extra.as_object().unwrap() {
        e[k] = v.clone();
    }
    e
}

fn one(extra: Value) -> Checked {
    let mut checked = check(batch(json!([event(extra)])), Some(("posthog-rs", "0.30.0"))).unwrap();
    checked.pop().unwrap()
}

fn as_batch_event(extra: Value) -> Value {
    serde_json::from_slice(&one(extra).batch_json.unwrap()).unwrap()
}

fn ctx() -> Context {
    Context {
        project: 1,
        now: NOW,
        sent_at: Some(NOW),
        historical: false,
        ip: None,
    }
}

#[test]
fn fields_go_back_into_properties() {
    let e = as_batch_event(json!({
        "session_id": "s-1", "window_id": "w-1",
        "options": {"cookieless_mode": true, "disable_skew_correction": "1",
                    "product_tour_id": 42, "process_person_profile": false},
        "properties": {"$current_url": "https://x/", "$groups": {"company": "acme"}}
    }));
    assert_eq!(
        e,
        json!({"event": "$pageview", "distinct_id": "user-1", "uuid": UUID,
               "timestamp": "2023-11-14T22:13:18.500Z",
               "properties": {"$current_url": "https://x/", "$groups": {"company": "acme"},
                              "$session_id": "s-1", "$window_id": "w-1",
                              "$cookieless_mode": true, "$ignore_sent_at": true,
                              "$product_tour_id": "42", "$process_person_profile": false,
                              "$lib": "posthog-rs", "$lib_version": "0.30.0"}})
    );
    // No properties, no options: only what the header gives.
    let bare = as_batch_event(json!({}));
    assert_eq!(
        bare["properties"],
        json!({"$lib": "posthog-rs", "$lib_version": "0.30.0"})
    );
    // An empty object, spaced as a client may send it, gets no stray comma.
    let spaced: Batch = serde_json::from_str(&format!(
        r#"{{"created_at":"2023-11-14T22:13:20Z","batch":[{{"event":"e","uuid":"{UUID}",
            "distinct_id":"d","timestamp":"2023-11-14T22:13:20Z","properties": {{ }} }}]}}"#
    ))
    .unwrap();
    let bytes = check(spaced, Some(("posthog-rs", "0.30.0"))).unwrap()[0]
        .batch_json
        .clone()
        .unwrap();
    assert!(String::from_utf8(bytes)
        .unwrap()
        .ends_with(r#""properties":{ "$lib":"posthog-rs","$lib_version":"0.30.0"}}"#));
}

#[test]
fn lifted_fields_win_over_the_clients_own() {
    let mut checked = one(json!({"session_id": "from-field",
                                 "properties": {"$session_id": "from-props", "$lib": "x"}}));
    let mut json = checked.batch_json.take().unwrap();
    let payload = parse(&mut json, false).unwrap();
    let Encoded::Keep(bytes) = encode_event(payload.events().next().unwrap(), &ctx()).unwrap()
    else {
        panic!("dropped")
    };
    let record = Record::decode(&bytes).unwrap();
    let stored: Value = serde_json::from_slice(&record.data).unwrap();
    assert_eq!(stored["properties"]["$session_id"], "from-field");
    assert_eq!(stored["properties"]["$lib"], "posthog-rs");
}

#[test]
fn encoded_as_batch_would_store_it() {
    let mut checked = check(
        batch(json!([
            event(json!({"session_id": "s-1", "distinct_id": "  user-1  "})),
            event(json!({"uuid": UUID2, "options": {"disable_skew_correction": true}})),
        ])),
        None,
    )
    .unwrap();
    let records = encode(&mut checked, &ctx(), None);
    assert_eq!(records.len(), 2);
    let first = Record::decode(&records[0]).unwrap();
    assert_eq!(first.uuid.to_string(), UUID);
    assert_eq!(first.distinct_id, "user-1");
    assert_eq!(first.event, "$pageview");
    // The client's clock agrees with the server's (its request timestamp is
    // `sent_at`): the event time is its timestamp.
    assert_eq!(first.timestamp, NOW - 1_500);
    assert_eq!(first.sent_at, Some(NOW));
    let data: Value = serde_json::from_slice(&first.data).unwrap();
    assert_eq!(data["properties"], json!({"$session_id": "s-1"}));
    let second = Record::decode(&records[1]).unwrap();
    assert_eq!(second.timestamp, NOW - 1_500);
    assert_eq!(second.uuid.to_string(), UUID2);
    assert!(checked.iter().all(|c| c.status == Status::Ok));
}

#[test]
fn skew_correction_off_keeps_the_timestamp() {
    let fast = Context {
        sent_at: Some(NOW + 60_000),
        ..ctx()
    };
    let mut checked = check(
        batch(json!([event(
            json!({"options": {"disable_skew_correction": true}})
        )])),
        None,
    )
    .unwrap();
    let record = Record::decode(&encode(&mut checked, &fast, None)[0]).unwrap();
    assert_eq!(record.timestamp, NOW - 1_500);
    let mut checked = check(batch(json!([event(json!({}))])), None).unwrap();
    let record = Record::decode(&encode(&mut checked, &fast, None)[0]).unwrap();
    assert_eq!(record.timestamp, NOW - 61_500);
}

#[test]
fn per_event_drops() {
    let dropped = |extra: Value| {
        let c = one(extra);
        assert_eq!(c.status, Status::Drop);
        assert!(c.batch_json.is_none());
        c.details.unwrap()
    };
    assert_eq!(dropped(json!({"event": ""})), "missing_event_name");
    assert_eq!(
        dropped(json!({"event": "$performance_event"})),
        "dropped_performance_event"
    );
    assert_eq!(
        dropped(json!({"event": "e".repeat(201)})),
        "event_name_too_long"
    );
    assert_eq!(
        dropped(json!({"distinct_id": "   "})),
        "missing_distinct_id"
    );
    assert_eq!(
        dropped(json!({"distinct_id": "d".repeat(201)})),
        "distinct_id_too_large"
    );
    assert_eq!(
        dropped(json!({"timestamp": "yesterday"})),
        "invalid_event_timestamp"
    );
    assert_eq!(
        dropped(json!({"properties": [1]})),
        "malformed_event_properties"
    );
    assert_eq!(
        dropped(json!({"properties": null})),
        "malformed_event_properties"
    );
    assert_eq!(
        dropped(json!({"options": {"cookieless_mode": "maybe"}})),
        "invalid_options"
    );
    assert_eq!(dropped(json!({"options": [true]})), "invalid_options");
    assert_eq!(
        dropped(json!({"options": {"product_tour_id": 1.5}})),
        "invalid_options"
    );
    // At the limits: kept.
    assert_eq!(one(json!({"event": "e".repeat(200)})).status, Status::Ok);
    assert_eq!(one(json!({"options": null})).status, Status::Ok);
    assert_eq!(
        one(json!({"options": {"unknown": [1], "cookieless_mode": null}})).status,
        Status::Ok
    );
}

#[test]
fn batch_errors() {
    let run = |events: Value| check(batch(events), None).map(|c| c.len());
    assert_eq!(run(json!([])), Err(Error::EmptyBatch));
    assert_eq!(
        run(json!([event(json!({"uuid": " "}))])),
        Err(Error::MissingEventUuid)
    );
    assert_eq!(
        run(json!([event(json!({"uuid": "nope"}))])),
        Err(Error::InvalidEventUuid("nope".into()))
    );
    assert_eq!(
        run(json!([
            event(json!({})),
            event(json!({"uuid": format!(" {UUID} ")}))
        ])),
        Err(Error::DuplicateEventUuid(UUID.into()))
    );
    let bad_created_at: Batch =
        serde_json::from_value(json!({"created_at": "today", "batch": [event(json!({}))]}))
            .unwrap();
    assert_eq!(
        check(bad_created_at, None).map(|c| c.len()),
        Err(Error::InvalidCreatedAt("today".into()))
    );
    // Strict fields: a missing uuid or a numeric event name fails the body's parse.
    for body in [
        json!({"created_at": "x", "batch": [{"event": "e", "distinct_id": "d", "timestamp": "t"}]}),
        json!({"created_at": "x", "batch": [event(json!({"event": 5}))]}),
        json!({"batch": []}),
    ] {
        assert!(serde_json::from_value::<Batch>(body).is_err());
    }
}

#[test]
fn sdk_info() {
    assert_eq!(
        sdk_lib_and_version("posthog-rs/0.30.0"),
        Some(("posthog-rs", "0.30.0"))
    );
    assert_eq!(
        sdk_lib_and_version("posthog/sub/2.3.4"),
        Some(("posthog/sub", "2.3.4"))
    );
    assert_eq!(
        sdk_lib_and_version(" posthog-rs / 1.2.3 "),
        Some(("posthog-rs", "1.2.3"))
    );
    for bad in ["no-slash", "/1.0.0", "posthog-rs/", "   /   "] {
        assert_eq!(sdk_lib_and_version(bad), None, "{bad}");
    }
    assert_eq!(
        sdk_lib_and_version(&format!("posthog-rs/{}", "9".repeat(200))),
        None
    );
}
