//! A compression hint that contradicts the body: the body is decoded as what it is
//! (gzip by its magic bytes, JSON as it stands, a form's base64 `data=`), and each
//! event is stored once.

use serde_json::{json, Value};

use crate::util::*;

fn event(name: &str) -> Value {
    json!({"event": name, "distinct_id": "user-1", "api_key": KEY_ONE,
           "properties": {"$current_url": "https://example.com/ü", "hint": name}})
}

#[test]
fn contradicting_hints_are_not_errors() {
    let server = Server::start();
    let form = "application/x-www-form-urlencoded";
    let json_of = |name: &str| serde_json::to_vec(&[event(name)]).unwrap();
    let form_of = |name: &str| format!("data={}", urlencode(&base64(&json_of(name))));
    let requests = [
        // posthog-js's base64 form posted to a gzip-js URL.
        (
            "form on gzip-js",
            Req::post(
                "/e/?compression=gzip-js&ver=1.200.0",
                form_of("form on gzip-js"),
            )
            .header("Content-Type", form),
        ),
        // Plain JSON announced as gzip, by the query and by the header.
        (
            "json on gzip query",
            Req::post("/batch/?compression=gzip", json_of("json on gzip query")),
        ),
        (
            "json on gzip header",
            Req::post("/batch/", json_of("json on gzip header")).header("Content-Encoding", "gzip"),
        ),
        // A base64 form posted to an lz64 URL.
        (
            "form on lz64",
            Req::post("/e/?compression=lz64", form_of("form on lz64")).header("Content-Type", form),
        ),
    ];
    for (name, req) in requests {
        let r = server.request(req);
        assert_eq!((r.status, r.json()), (200, json!({"status": 1})), "{name}");
    }
    let stored = server.settle(1);
    let mut names: Vec<&str> = stored
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "form on gzip-js",
            "form on lz64",
            "json on gzip header",
            "json on gzip query"
        ]
    );
    for e in &stored {
        assert_eq!(e["distinct_id"], "user-1");
        assert_eq!(e["properties"]["hint"], e["event"]);
        assert_eq!(e["properties"]["$current_url"], "https://example.com/ü");
    }
}
