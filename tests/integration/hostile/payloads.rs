//! Bodies that are not what they claim: malformed or mistyped JSON, deep nesting,
//! invalid UTF-8, NUL bytes, numbers past what JSON parsing represents.

use serde_json::json;

use super::*;

#[test]
fn malformed_json() {
    let s = Server::start();
    for body in [
        r#"{"event": "#,
        r#"{"event":"e","distinct_id":"d",}"#,
        r#"{"event":"e" "distinct_id":"d"}"#,
        "[{]",
        "nope",
        "{'event': 'e'}",
    ] {
        for path in [
            "/capture/",
            "/batch/",
            "/e/?ver=1",
            "/decide/?v=3",
            "/flags/?v=2",
        ] {
            hostile(&s, s.post(path, body), 400, "invalid_payload");
        }
    }
    still_serving(&s);
}

#[test]
fn wrong_types_everywhere() {
    let s = Server::start();
    let capture = [
        event(json!({"event": 42})),
        event(json!({"event": ["e"]})),
        event(json!({"properties": [1, 2]})),
        event(json!({"properties": "p"})),
        event(json!({"distinct_id": {"id": 1}})),
        event(json!({"distinct_id": [1]})),
        event(json!({"distinct_id": true})),
        event(json!({"api_key": 5})),
        json!({"api_key": KEY_ONE, "batch": {"event": "e"}}),
        json!({"api_key": KEY_ONE, "batch": ["e"]}),
        json!({"api_key": ["k"], "batch": [{"event": "e", "distinct_id": "d"}]}),
        json!([1, 2]),
        json!("event"),
        json!(42),
    ];
    for body in capture {
        hostile(
            &s,
            s.post("/capture/", body.to_string()),
            400,
            "invalid_payload",
        );
    }
    let decide = [
        json!({"token": KEY_ONE, "distinct_id": {"id": 1}}),
        json!({"token": KEY_ONE, "distinct_id": "d", "person_properties": [1]}),
        json!({"token": KEY_ONE, "distinct_id": "d", "groups": "org"}),
        json!({"token": KEY_ONE, "distinct_id": "d", "group_properties": 5}),
        json!({"token": 5, "distinct_id": "d"}),
        json!([{"token": KEY_ONE, "distinct_id": "d"}]),
    ];
    for body in decide {
        hostile(
            &s,
            s.post("/decide/?v=3", body.to_string()),
            400,
            "invalid_payload",
        );
    }
    still_serving(&s);
}

#[test]
fn nesting_100000_deep() {
    let s = Server::start();
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    hostile(
        &s,
        s.post("/capture/", deep.clone()),
        400,
        "invalid_payload",
    );
    hostile(&s, s.post("/decide/?v=3", deep), 400, "invalid_payload");
    let inside = format!(
        r#"{{"api_key":"{KEY_ONE}","event":"e","distinct_id":"d","properties":{{"a":{}1{}}}}}"#,
        "{\"a\":".repeat(100_000),
        "}".repeat(100_000)
    );
    hostile(&s, s.post("/capture/", inside), 400, "invalid_payload");
    // Deep and gzipped: the limit holds after decompression too.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    hostile(
        &s,
        s.post("/batch/", gzip(deep.as_bytes())),
        400,
        "invalid_payload",
    );
    still_serving(&s);
}

#[test]
fn invalid_utf8() {
    let s = Server::start();
    let mut in_string = br#"{"api_key":"phc_test_one","event":"e"#.to_vec();
    in_string.extend_from_slice(b"\xff\xfe\xc3\x28");
    in_string.extend_from_slice(br#"","distinct_id":"d"}"#);
    hostile(
        &s,
        s.post("/capture/", in_string.clone()),
        400,
        "invalid_payload",
    );
    hostile(
        &s,
        s.post("/decide/?v=3", in_string),
        400,
        "invalid_payload",
    );
    hostile(
        &s,
        s.post("/capture/", b"\xff\xfe\xfd\xfc".to_vec()),
        400,
        "invalid_payload",
    );
    // Percent-encoded in data= of a GET.
    hostile(&s, s.get("/e/?data=%FF%FE%FD%FC"), 400, "invalid_payload");
    // In a header value: not text, so ignored; the request itself is fine.
    let body = event(json!({})).to_string();
    let mut bytes =
        b"POST /capture/ HTTP/1.1\r\nHost: x\r\nContent-Type: text/\xffplain\r\n".to_vec();
    bytes.extend_from_slice(
        format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    let r = raw(s.addr, &bytes).expect("a response");
    assert_eq!(r.status, 200, "{}", r.text());
    still_serving(&s);
}

#[test]
fn nul_bytes() {
    let s = Server::start();
    // Raw NUL: not JSON.
    let mut body = br#"{"api_key":"phc_test_one","event":"a"#.to_vec();
    body.extend_from_slice(b"\0");
    body.extend_from_slice(br#"b","distinct_id":"d"}"#);
    hostile(&s, s.post("/capture/", body), 400, "invalid_payload");
    hostile(
        &s,
        s.post("/capture/", vec![0u8; 64]),
        400,
        "invalid_payload",
    );
    // Escaped NUL is valid JSON: accepted, and never stored in a distinct id.
    let r = s.post(
        "/capture/",
        event(json!({"distinct_id": "nul\u{0}id", "event": "nul\u{0}event"})).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s.post(
        "/decide/?v=3",
        json!({"token": KEY_ONE, "distinct_id": "nul\u{0}id"}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let stored = s.settle(1);
    let nul = stored
        .iter()
        .find(|e| e["event"] == "nul\u{0}event")
        .unwrap();
    assert_eq!(nul["distinct_id"], "nul\u{FFFD}id");
    // NUL in a header value or the request line: refused by the HTTP parser.
    let r = raw(
        s.addr,
        b"GET /_liveness HTTP/1.1\r\nHost: x\r\nX-A: a\0b\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.map(|r| r.status), Some(400));
    still_serving(&s);
    let r = raw(s.addr, b"GET /_live\0ness HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.map(|r| r.status), Some(400));
    still_serving(&s);
    still_serving(&s);
}

#[test]
fn huge_numbers() {
    let s = Server::start();
    let bodies = [
        r#"{"api_key":"phc_test_one","event":"big-id","distinct_id":123456789012345678901234567890}"#,
        r#"{"api_key":"phc_test_one","event":"neg-id","distinct_id":-1e308}"#,
        r#"{"api_key":"phc_test_one","event":"offset-far-back","distinct_id":"d","offset":1e300}"#,
        r#"{"api_key":"phc_test_one","event":"offset-far-ahead","distinct_id":"d","offset":-1e300}"#,
        r#"{"api_key":"phc_test_one","event":"props","distinct_id":"d","properties":{"n":1e308,"m":-1e308,"i":18446744073709551616,"z":-0}}"#,
        r#"{"api_key":"phc_test_one","event":"number-timestamp","distinct_id":"d","timestamp":1e300}"#,
    ];
    for body in bodies {
        let r = s.post("/capture/?_=1e300", body);
        assert_eq!(r.status, 200, "{body}: {}", r.text());
    }
    // Past f64: not a number JSON parsing can represent, refused as such.
    for body in [
        r#"{"api_key":"phc_test_one","event":"inf","distinct_id":1e400}"#,
        r#"{"api_key":"phc_test_one","event":"inf","distinct_id":"d","properties":{"n":-1e999}}"#,
    ] {
        hostile(&s, s.post("/capture/", body), 400, "invalid_payload");
    }
    hostile(
        &s,
        s.post(
            "/decide/?v=3",
            r#"{"token":"phc_test_one","distinct_id":"d","person_properties":{"n":1e999}}"#,
        ),
        400,
        "invalid_payload",
    );
    let r = s.post(
        "/decide/?v=99999999999999999999",
        r#"{"token":"phc_test_one","distinct_id":1e300,"person_properties":{"n":1e308}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // The compactor got through all of them, and the read API shows them.
    let stored = s.settle(1);
    let names: Vec<&str> = stored.iter().filter_map(|e| e["event"].as_str()).collect();
    for name in [
        "big-id",
        "neg-id",
        "offset-far-ahead",
        "props",
        "number-timestamp",
    ] {
        assert!(names.contains(&name), "{name} not in {names:?}");
    }
    still_serving(&s);
}
