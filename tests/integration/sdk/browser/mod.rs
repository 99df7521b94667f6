//! posthog-js from its npm package in Debian's Chromium, headless, driven by
//! playwright-core: pageview, capture, identify, group, flags, and both of its
//! compressed encodings (gzip-js and, for beacons, base64). `site` loads it the ways
//! sites do, with the optional features on.

mod console;
mod site;

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{json, Value};

use super::*;
use crate::util::*;

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_js_in_chromium() {
    let modules = sdk_dir().join("node/node_modules");
    let deps = [
        Path::new("/usr/bin/chromium"),
        &modules.join("playwright-core"),
        &modules.join("posthog-js"),
    ];
    require("posthog-js", &deps);
    let server = start();
    let host = format!("http://{}", server.addr);
    let summary = run(
        Path::new("node"),
        &["browser/run.mjs", &host, KEY_ONE, "js"],
    );
    assert_eq!(summary["sdk"], "posthog-js");
    eprintln!(
        "posthog-js {} in Chromium {}",
        summary["version"], summary["chromium"]
    );
    let config = format!("GET /array/{KEY_ONE}/config empty");
    // posthog-js takes gzip-js from the remote config and sends it as raw gzip with no
    // `compression` parameter, flags included; with `disable_compression` it sends
    // JSON, and base64 only where a beacon needs a CORS-simple body. Events go to `/e/`
    // until the remote config arrives, then to its `analytics.endpoint` (PostHog names
    // `/i/v0/e/`): both read `<intake>`.
    let visits = [
        (
            "gzip",
            vec![
                config.as_str(),
                "POST <intake> gzip",
                "POST /flags/?v=2 gzip",
            ],
        ),
        (
            "base64",
            vec![
                config.as_str(),
                "POST <intake> json",
                "POST <intake>?compression=base64 base64",
                "POST /flags/?v=2 json",
            ],
        ),
    ];
    let mut all_requests = Vec::new();
    for (mode, expected) in &visits {
        let visit = &summary["visits"][mode];
        assert_eq!(visit["blocked"], json!([]), "requests off loopback");
        let requests = array(&visit["requests"]);
        let made: BTreeSet<String> = requests_made(&server, requests)
            .into_iter()
            .zip(requests)
            .map(|(made, r)| {
                let made = made.replacen("POST /i/v0/e/", "POST <intake>", 1).replacen(
                    "POST /e/",
                    "POST <intake>",
                    1,
                );
                format!("{made} {}", r["body"].as_str().unwrap())
            })
            .collect();
        assert_eq!(
            made,
            expected.iter().map(|s| s.to_string()).collect(),
            "{mode}"
        );
        let beacon = requests
            .iter()
            .find(|r| array(&r["events"]).iter().any(|e| e["event"] == "beacon"))
            .unwrap();
        let want = if *mode == "gzip" { "gzip" } else { "base64" };
        assert_eq!(beacon["body"], want, "the beacon, {mode}");
        assert_eq!(visit["flags_before"], json!({"pro-only": false}), "{mode}");
        assert_eq!(visit["flags"], js_flags_identified(), "{mode}");
        all_requests.extend(requests.iter().cloned());
    }

    let stored = stored_exactly_what_was_sent(&server, &all_requests);
    assert_eq!(app_events(&stored, &[]), js_events_stored());
    for (mode, _) in &visits {
        let visit = &summary["visits"][mode];
        let (anon, user) = (
            visit["anon"].as_str().unwrap(),
            visit["user"].as_str().unwrap(),
        );
        assert_eq!(visit["distinct_id"], user);
        let by = |name: &str, id: &str| {
            stored
                .iter()
                .find(|e| e["event"] == name && e["distinct_id"] == id)
                .unwrap_or_else(|| panic!("no {name} by {id}"))
        };
        let pageview = by("$pageview", anon);
        let url = pageview["properties"]["$current_url"].as_str().unwrap();
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        let click = event(&stored, &visit["ids"]["clicked buy"]);
        assert_eq!(
            (&click["distinct_id"], &click["properties"]["color"]),
            (&json!(anon), &json!("blue"))
        );
        assert_eq!(
            by("$identify", user)["properties"]["$anon_distinct_id"],
            anon
        );
        // Identify merges the anonymous id into the person. posthog-js's default
        // (person_profiles: identified_only) keeps the events before it personless.
        let person = merged_person(&server, anon, user);
        for e in stored.iter().filter(|e| e["distinct_id"] == anon) {
            assert_eq!(e["person_id"], Value::Null, "{e}");
        }
        for e in stored.iter().filter(|e| e["distinct_id"] == user) {
            assert_eq!(e["person_id"], person["id"], "{e}");
        }
        assert_eq!(
            group_properties(&server, visit["company"].as_str().unwrap()),
            json!({"seats": 50, "name": "Acme"})
        );
    }
}
