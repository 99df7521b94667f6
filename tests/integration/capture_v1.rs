//! The v1 capture path (`/i/v1/analytics/events`) end to end, as posthog-rs's
//! `capture-v1` feature sends it: every encoding, the per-event answer, PostHog's
//! error answers, and each event stored exactly once, as `/batch/` would store it.

use std::io::Write;

use serde_json::{json, Value};

use crate::util::*;

const PATH: &str = "/i/v1/analytics/events";
const SDK: &str = "posthog-rs/0.30.0";

/// A v1 request as posthog-rs builds it; `encoding` names the `Content-Encoding`.
fn v1(path: &str, body: Vec<u8>, encoding: Option<&str>) -> Req {
    let mut r = Req::post(path, body)
        .header("Authorization", &format!("Bearer {KEY_ONE}"))
        .header("Content-Type", "application/json")
        .header("User-Agent", SDK)
        .header("PostHog-Sdk-Info", SDK)
        .header("PostHog-Attempt", "1")
        .header("PostHog-Request-Id", &uuid::Uuid::now_v7().to_string())
        .header("PostHog-Request-Timestamp", &now_rfc3339(0));
    if let Some(e) = encoding {
        r = r.header("Content-Encoding", e);
    }
    r
}

fn now_rfc3339(offset_ms: i64) -> String {
    let now = time::OffsetDateTime::now_utc() + time::Duration::milliseconds(offset_ms);
    now.format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

fn encode(encoding: &str, data: &[u8]) -> Vec<u8> {
    match encoding {
        "gzip" => gzip(data),
        "deflate" => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(data).unwrap();
            e.finish().unwrap()
        }
        "raw-deflate" => {
            let mut e =
                flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(data).unwrap();
            e.finish().unwrap()
        }
        "br" => {
            let mut out = Vec::new();
            {
                let mut w = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
                w.write_all(data).unwrap();
            }
            out
        }
        "zstd" => {
            ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
        }
        _ => data.to_vec(),
    }
}

fn v1_event(name: &str, uuid: &str) -> Value {
    json!({"event": name, "uuid": uuid, "distinct_id": "user-1",
           "timestamp": "2024-05-01T10:00:00.250Z", "session_id": "sess-1", "window_id": "win-1",
           "options": {"disable_skew_correction": true, "process_person_profile": true},
           "properties": {"$current_url": "https://example.com/ü", "plan": "pro",
                          "$groups": {"company": "acme"}}})
}

fn body(events: &[Value]) -> Vec<u8> {
    serde_json::to_vec(&json!({"created_at": now_rfc3339(0), "batch": events})).unwrap()
}

fn ok_results(uuids: &[&str]) -> Value {
    let results: serde_json::Map<String, Value> = uuids
        .iter()
        .map(|u| (u.to_string(), json!({"result": "ok"})))
        .collect();
    json!({ "results": results })
}

fn by_id<'a>(events: &'a [Value], uuid: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["id"] == uuid).collect()
}

#[test]
fn every_encoding_is_stored_once_as_batch_would_store_it() {
    let server = Server::start();
    let mut sent = Vec::new();
    for (i, encoding) in ["none", "gzip", "deflate", "raw-deflate", "br", "zstd"]
        .into_iter()
        .enumerate()
    {
        for (j, path) in [PATH, "/i/v1/analytics/events/"].into_iter().enumerate() {
            let a = format!("0190f7b4-6a36-7c5d-8b8e-00000000{i}{j}0a");
            let b = format!("0190f7b4-6a36-7c5d-8b8e-00000000{i}{j}0b");
            let raw = body(&[v1_event(encoding, &a), v1_event(encoding, &b)]);
            let header = match encoding {
                "none" => None,
                "raw-deflate" => Some("deflate"),
                e => Some(e),
            };
            let r = server.request(v1(path, encode(encoding, &raw), header));
            assert_eq!(r.status, 200, "{encoding} {path}: {}", r.text());
            assert_eq!(r.header("content-type"), Some("application/json"));
            assert_eq!(r.json(), ok_results(&[&a, &b]), "{encoding} {path}");
            sent.extend([a, b]);
        }
    }
    // The same event sent to /batch/ the way posthog-rs's default mode sends it.
    let batch_uuid = "0190f7b4-6a36-7c5d-8b8e-0000000000ff";
    let batch = json!({"api_key": KEY_ONE, "batch": [{
        "event": "none", "uuid": batch_uuid, "distinct_id": "user-1",
        "timestamp": "2024-05-01T10:00:00.250Z",
        "properties": {"$current_url": "https://example.com/ü", "plan": "pro",
                       "$groups": {"company": "acme"}, "$session_id": "sess-1",
                       "$window_id": "win-1", "$ignore_sent_at": true,
                       "$process_person_profile": true, "$lib": "posthog-rs",
                       "$lib_version": "0.30.0"}}]});
    assert_eq!(server.post("/batch/", batch.to_string()).status, 200);

    let stored = server.settle(1);
    assert_eq!(stored.len(), sent.len() + 1);
    let reference = by_id(&stored, batch_uuid)[0];
    for uuid in &sent {
        let copies = by_id(&stored, uuid);
        assert_eq!(copies.len(), 1, "{uuid}");
        let e = copies[0];
        assert_eq!(e["distinct_id"], "user-1");
        assert_eq!(e["timestamp"], reference["timestamp"], "{uuid}");
        assert_eq!(e["properties"], reference["properties"], "{uuid}");
        assert_eq!(e["properties"]["$session_id"], "sess-1");
        assert_eq!(e["properties"]["$window_id"], "win-1");
        assert_eq!(e["properties"]["$lib"], "posthog-rs");
        assert_eq!(e["properties"]["plan"], "pro");
    }
    assert_eq!(
        reference["timestamp"].as_str().map(|t| &t[..23]),
        Some("2024-05-01T10:00:00.250")
    );
}

#[test]
fn clock_skew_is_corrected_from_the_request_timestamp() {
    let server = Server::start();
    // The client's clock is an hour fast; its event happened 2 s before it sent.
    let uuid = "0190f7b4-6a36-7c5d-8b8e-000000000c10";
    let fast = now_rfc3339(3_600_000);
    let ts = now_rfc3339(3_600_000 - 2_000);
    let event = json!({"event": "skewed", "uuid": uuid, "distinct_id": "d", "timestamp": ts});
    let mut req = v1(PATH, body(&[event]), None);
    req.headers
        .retain(|(k, _)| k != "PostHog-Request-Timestamp");
    let before = time::OffsetDateTime::now_utc();
    let r = server.request(req.header("PostHog-Request-Timestamp", &fast));
    let after = time::OffsetDateTime::now_utc();
    assert_eq!(r.json(), ok_results(&[uuid]));
    let stored = server.settle(1);
    let t =
        flagpost::capture::timestamp::parse_ms(stored[0]["timestamp"].as_str().unwrap()).unwrap();
    let ms = |t: time::OffsetDateTime| (t.unix_timestamp_nanos() / 1_000_000) as i64;
    // Within the request's own time, 2 s back, give or take the clock's millisecond.
    assert!(
        t >= ms(before) - 2_001 && t <= ms(after) - 1_999,
        "{t} not within {before} - 2 s .. {after} - 2 s"
    );
}

#[test]
fn a_bad_event_among_good_ones_is_dropped_alone() {
    let server = Server::start();
    let good = [
        "0190f7b4-6a36-7c5d-8b8e-000000000d01",
        "0190f7b4-6a36-7c5d-8b8e-000000000d05",
    ];
    let mut unnamed = v1_event("", "0190f7b4-6a36-7c5d-8b8e-000000000d02");
    unnamed["event"] = json!("");
    let mut late = v1_event("late", "0190f7b4-6a36-7c5d-8b8e-000000000d03");
    late["timestamp"] = json!("yesterday");
    let mut listed = v1_event("listed", "0190f7b4-6a36-7c5d-8b8e-000000000d04");
    listed["properties"] = json!([1, 2]);
    let events = [
        v1_event("good", good[0]),
        unnamed,
        late,
        listed,
        v1_event("good", good[1]),
    ];
    let r = server.request(v1(PATH, body(&events), None));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.text(),
        concat!(
            r#"{"results":{"0190f7b4-6a36-7c5d-8b8e-000000000d01":{"result":"ok"},"#,
            r#""0190f7b4-6a36-7c5d-8b8e-000000000d02":{"result":"drop","details":"missing_event_name"},"#,
            r#""0190f7b4-6a36-7c5d-8b8e-000000000d03":{"result":"drop","details":"invalid_event_timestamp"},"#,
            r#""0190f7b4-6a36-7c5d-8b8e-000000000d04":{"result":"drop","details":"malformed_event_properties"},"#,
            r#""0190f7b4-6a36-7c5d-8b8e-000000000d05":{"result":"ok"}}}"#
        )
    );
    let stored = server.settle(1);
    let mut ids: Vec<&str> = stored.iter().map(|e| e["id"].as_str().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, good);
}

/// PostHog's error body for a tag and its description.
fn error(tag: &str, description: &str) -> Value {
    json!({"error": tag, "error_description": description,
           "error_uri": "https://posthog.com/docs/api"})
}

#[test]
fn refusals_answer_as_posthog_and_store_nothing() {
    let server = Server::start_with(&["--max-decompressed-bytes", "1048576"]);
    let good = body(&[v1_event("e", "0190f7b4-6a36-7c5d-8b8e-000000000e01")]);
    let without = |name: &str| {
        let mut r = v1(PATH, good.clone(), None);
        r.headers.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
        r
    };
    let replaced = |name: &str, value: &str| without(name).header(name, value);
    let cases: Vec<(&str, Req, u16, Value)> = vec![
        (
            "no Authorization",
            without("Authorization"),
            401,
            error(
                "missing_authorization",
                "request is missing the Authorization header",
            ),
        ),
        (
            "Basic auth",
            replaced("Authorization", "Basic abc"),
            400,
            error(
                "invalid_header_value",
                "invalid header value: Authorization must use Bearer scheme",
            ),
        ),
        (
            "unknown key",
            replaced("Authorization", "Bearer phc_nobody"),
            401,
            error("invalid_api_token", "The provided API token is not valid."),
        ),
        (
            "personal key",
            replaced("Authorization", &format!("Bearer {PERSONAL_ONE}")),
            401,
            error("invalid_api_token", "The provided API token is not valid."),
        ),
        (
            "no SDK info",
            without("PostHog-Sdk-Info"),
            400,
            error(
                "missing_required_headers",
                r#"request is missing required headers: ["PostHog-Sdk-Info"]"#,
            ),
        ),
        (
            "malformed JSON",
            v1(PATH, b"not json at all {{{".to_vec(), None),
            400,
            error("request_parsing_error", "Failed to parse request body."),
        ),
        (
            "missing created_at",
            v1(PATH, br#"{"batch":[]}"#.to_vec(), None),
            400,
            error("request_parsing_error", "Failed to parse request body."),
        ),
        (
            "empty batch",
            v1(PATH, body(&[]), None),
            400,
            error("empty_batch", "request batch is empty"),
        ),
        (
            "empty body",
            v1(PATH, Vec::new(), None),
            400,
            error("empty_body", "request body is empty"),
        ),
        (
            "not gzip",
            v1(PATH, good.clone(), Some("gzip")),
            400,
            error("request_decoding_error", "Failed to decode request body."),
        ),
        (
            "lz4",
            v1(PATH, good.clone(), Some("lz4")),
            415,
            error("unsupported_encoding", "unsupported content encoding: lz4"),
        ),
        (
            "text/plain",
            replaced("Content-Type", "text/plain"),
            415,
            error(
                "unsupported_content_type",
                "unsupported content type: text/plain",
            ),
        ),
    ];
    for (what, req, status, expected) in cases {
        let r = server.request(req);
        assert_eq!((r.status, r.json()), (status, expected), "{what}");
        assert_eq!(r.header("accept-encoding"), Some("gzip, deflate, br, zstd"));
    }
    // Bombs over the 1 MiB cap: a few KiB that would inflate to 64 MiB.
    let bomb_json = {
        let mut b = br#"{"created_at":"2024-05-01T10:00:00Z","batch":[],"pad":""#.to_vec();
        b.extend(std::iter::repeat_n(b'a', 64 << 20));
        b.extend_from_slice(br#""}"#);
        b
    };
    for encoding in ["gzip", "deflate", "br", "zstd"] {
        let bomb = encode(encoding, &bomb_json);
        assert!(bomb.len() < 256 << 10, "{encoding}: {}", bomb.len());
        let r = server.request(v1(PATH, bomb, Some(encoding)));
        assert_eq!(
            (r.status, r.json()),
            (
                413,
                error(
                    "payload_too_large",
                    &format!(
                        "payload too large: decompressed {encoding} payload exceeds limit of 1048576 bytes"
                    )
                )
            ),
            "{encoding}"
        );
    }
    assert_eq!(server.settle(1), Vec::<Value>::new());
    // Still serving.
    let r = server.request(v1(PATH, good, None));
    assert_eq!(
        r.json(),
        ok_results(&["0190f7b4-6a36-7c5d-8b8e-000000000e01"])
    );
}
