//! posthog-js-lite, PostHog's reduced web client (analytics and flags on
//! `@posthog/core`), from its npm package: its ES module build in Debian's Chromium
//! (`tests/sdk/lite/browser.mjs`) and its CommonJS build in Node
//! (`tests/sdk/lite/node.mjs`). Both run `tests/sdk/lite/scenario.mjs` twice, gzipped
//! and plain: flags on load, capture, identify with `$set` and `$set_once`, group,
//! flag reloads, opt-out and opt-in, reset, four explicit flushes. The flags must be
//! exactly what the rules give, every event sent must be stored once with the
//! properties it was sent with, and nothing captured while opted out may be sent.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{json, Value};

use super::*;
use crate::util::*;

/// The flags as the client reports them before identify (and after reset): the rules
/// for a person with no properties and no group.
fn anonymous_flags() -> Value {
    json!({"always-on": true, "never": false, "pro-only": false, "checkout": "test",
           "big-orgs": false})
}

/// The flags an app reads, payloads included, for a person on the pro plan or not, in
/// a company of 50 seats or in none.
fn read_flags(pro: bool, big: bool) -> Value {
    json!({"always-on": true, "never": false, "pro-only": pro, "checkout": "test",
           "big-orgs": big, "checkout payload": {"color": "green"},
           "always-on payload": {"tier": 1}})
}

/// `$feature_flag_id` and `$feature_flag_version` of each flag of `rules()`: its id,
/// and its version, 0 where the rule has none (as PostHog's flags service answers).
fn flag_metadata(flag: &str) -> (u64, u64) {
    match flag {
        "always-on" => (1, 1),
        "never" => (2, 0),
        "pro-only" => (3, 0),
        "checkout" => (4, 0),
        "big-orgs" => (5, 0),
        other => panic!("a flag that does not exist: {other}"),
    }
}

/// Names of the events in a batch, `$feature_flag_called` as `flag:KEY=VALUE`, sorted.
fn batch_names(events: &[Value]) -> Vec<String> {
    let mut names: Vec<String> = events
        .iter()
        .map(|e| match e["event"].as_str().unwrap() {
            "$feature_flag_called" => format!(
                "flag:{}={}",
                e["properties"]["$feature_flag"].as_str().unwrap(),
                e["properties"]["$feature_flag_response"]
            ),
            name => name.to_string(),
        })
        .collect();
    names.sort();
    names
}

fn names(list: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = list.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

/// Check one run of the scenario: its requests and answers, the flags, what was sent
/// in which batch. Returns its requests.
fn check_run(server: &Server, mode: &str, run: &Value) -> Vec<Value> {
    assert_eq!(
        run["errors"],
        json!([]),
        "{mode}: errors the client reported"
    );
    let requests = array(&run["requests"]);
    let made: BTreeSet<String> = requests_made(server, requests).into_iter().collect();
    assert_eq!(
        made,
        names(&["POST /batch/", "POST /flags/?v=2"])
            .into_iter()
            .collect(),
        "{mode}: requests"
    );

    // Only a write's answer may go unread (see browser.mjs): the flags are read.
    for r in requests.iter().filter(|r| r["body_cancelled"] == true) {
        assert_eq!(r["path"], "/batch/", "{mode}: {r}");
    }
    // PostHog leaves `quotaLimited` out of a flags answer unless a quota is hit.
    for r in requests.iter().filter(|r| r["path"] == "/flags/") {
        let answer = r["response"].as_object().unwrap_or_else(|| panic!("{r}"));
        assert_eq!(
            answer.get("quotaLimited"),
            None,
            "{mode}: the answer to {} {}",
            r["url"],
            r["request"]
        );
        assert_eq!(r["request"]["token"], KEY_ONE, "{r}");
    }

    let (anon, user, fresh) = (
        run["anon"].as_str().unwrap(),
        run["user"].as_str().unwrap(),
        run["fresh"].as_str().unwrap(),
    );
    assert_eq!(run["identified"], user, "{mode}");
    assert!(fresh != anon && fresh != user, "{mode}: reset kept {fresh}");
    assert_eq!(
        (&run["opted_out"], &run["opted_in"]),
        (&json!(true), &json!(true)),
        "{mode}"
    );

    let flags = &run["flags"];
    assert_eq!(flags["loaded"], anonymous_flags(), "{mode}: onFeatureFlags");
    assert_eq!(flags["before"], read_flags(false, false), "{mode}: before");
    assert_eq!(flags["after"], read_flags(true, true), "{mode}: after");
    assert_eq!(
        flags["reset reload"],
        anonymous_flags(),
        "{mode}: reloadFeatureFlags after reset"
    );
    assert_eq!(
        flags["after reset"],
        read_flags(false, false),
        "{mode}: after reset"
    );

    // Four flushes, four batches; the one while opted out sent nothing. The client
    // reports a flag once per value, and every flag again after reset.
    let batches: Vec<&Value> = requests.iter().filter(|r| r["path"] == "/batch/").collect();
    let got: Vec<Vec<String>> = batches
        .iter()
        .map(|b| batch_names(array(&b["events"])))
        .collect();
    let anonymous = [
        "flag:always-on=true",
        "flag:never=false",
        "flag:pro-only=false",
        "flag:checkout=\"test\"",
        "flag:big-orgs=false",
    ];
    let want = vec![
        names(&[&anonymous[..], &["clicked buy", "$identify"]].concat()),
        names(&["$groupidentify"]),
        names(&["flag:pro-only=true", "flag:big-orgs=true", "order placed"]),
        names(&[&anonymous[..], &["opted in", "after reset"]].concat()),
    ];
    assert_eq!(got, want, "{mode}: batches");
    let (encoding, body) = if mode == "on" {
        (json!("gzip"), "gzip")
    } else {
        (Value::Null, "json")
    };
    for b in &batches {
        assert_eq!(
            (&b["content_encoding"], b["body"].as_str().unwrap()),
            (&encoding, body),
            "{mode}: a batch's encoding"
        );
    }

    // Who sent what: the anonymous id until identify, the user until reset, then the
    // fresh anonymous id.
    let by = |id: &str| {
        let events: Vec<Value> = batches
            .iter()
            .flat_map(|b| array(&b["events"]).iter())
            .filter(|e| e["distinct_id"] == id)
            .cloned()
            .collect();
        batch_names(&events)
    };
    assert_eq!(
        by(anon),
        names(&[&anonymous[..], &["clicked buy"]].concat()),
        "{mode}"
    );
    assert_eq!(
        by(user),
        names(&[
            "$identify",
            "$groupidentify",
            "flag:pro-only=true",
            "flag:big-orgs=true",
            "order placed",
            "opted in"
        ]),
        "{mode}"
    );
    assert_eq!(
        by(fresh),
        names(&[&anonymous[..], &["after reset"]].concat()),
        "{mode}"
    );
    requests.clone()
}

/// Every sent event is stored once (`stored_exactly_what_was_sent`), each with every
/// property it was sent with, its flag events naming the flag's id and version.
fn check_stored(server: &Server, summary: &Value) -> Vec<Value> {
    let mut requests = Vec::new();
    for mode in ["on", "off"] {
        requests.extend(check_run(server, mode, &summary["runs"][mode]));
    }
    let stored = stored_exactly_what_was_sent(server, &requests);
    app_events(&stored, &[]);
    let sent = requests.iter().flat_map(|r| array(&r["events"]).iter());
    for e in sent {
        let kept = event(&stored, &e["uuid"]);
        assert_eq!(
            (&kept["event"], &kept["distinct_id"]),
            (&e["event"], &e["distinct_id"])
        );
        for (key, value) in e["properties"].as_object().unwrap() {
            assert_eq!(
                &kept["properties"][key], value,
                "{key} of {} as sent: {e}\nas stored: {kept}",
                e["event"]
            );
        }
        assert_eq!(kept["properties"]["$lib"], "js", "{kept}");
        assert_eq!(kept["properties"]["$lib_version"], summary["version"]);
        if e["event"] == "$feature_flag_called" {
            let flag = e["properties"]["$feature_flag"].as_str().unwrap();
            let (id, version) = flag_metadata(flag);
            assert_eq!(
                (
                    &e["properties"]["$feature_flag_id"],
                    &e["properties"]["$feature_flag_version"]
                ),
                (&json!(id), &json!(version)),
                "{e}"
            );
        }
    }
    stored
}

/// The person and group each run made: identify merged the anonymous id into a person
/// with what `$set` and `$set_once` said; only events of identified users are
/// processed as a person's (posthog-js-lite's default `identified_only`).
fn check_people(server: &Server, summary: &Value, stored: &[Value]) {
    for mode in ["on", "off"] {
        let run = &summary["runs"][mode];
        let (anon, user, fresh) = (
            run["anon"].as_str().unwrap(),
            run["user"].as_str().unwrap(),
            run["fresh"].as_str().unwrap(),
        );
        let person = merged_person(server, anon, user);
        assert_eq!(
            person["properties"],
            json!({"plan": "pro", "email": format!("{user}@example.com"), "first_plan": "pro"}),
            "{mode}"
        );
        for e in stored.iter().filter(|e| e["distinct_id"] == user) {
            assert_eq!(e["person_id"], person["id"], "{e}");
        }
        for e in stored
            .iter()
            .filter(|e| e["distinct_id"] == anon || e["distinct_id"] == fresh)
        {
            assert_eq!(e["person_id"], Value::Null, "{e}");
        }
        let company = run["company"].as_str().unwrap();
        assert_eq!(
            group_properties(server, company),
            json!({"seats": 50, "name": "Acme"})
        );
        let order = stored
            .iter()
            .find(|e| e["event"] == "order placed" && e["distinct_id"] == user)
            .unwrap_or_else(|| panic!("no order placed by {user}"));
        assert_eq!(
            (
                &order["properties"]["$groups"],
                &order["properties"]["amount"]
            ),
            (&json!({"company": company}), &json!(30))
        );
    }
}

fn require_lite(browser: bool) {
    let modules = sdk_dir().join("node/node_modules");
    let mut deps = vec![
        modules.join("posthog-js-lite/dist"),
        modules.join("@posthog/core/dist"),
    ];
    if browser {
        deps.push(Path::new("/usr/bin/chromium").to_path_buf());
        deps.push(modules.join("playwright-core"));
    }
    let deps: Vec<&Path> = deps.iter().map(|p| p.as_path()).collect();
    require("posthog-js-lite", &deps);
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_js_lite_in_chromium() {
    require_lite(true);
    let server = start();
    let host = format!("http://{}", server.addr);
    let summary = run(
        Path::new("node"),
        &["lite/browser.mjs", &host, KEY_ONE, "lite-web"],
    );
    assert_eq!(summary["sdk"], "posthog-js-lite");
    eprintln!(
        "posthog-js-lite {} (@posthog/core {}) in Chromium {}",
        summary["version"], summary["core"], summary["chromium"]
    );
    for mode in ["on", "off"] {
        let run = &summary["runs"][mode];
        assert_eq!(run["failures"], json!([]), "{mode}: failed requests");
        assert_eq!(run["console_errors"], json!([]), "{mode}: console errors");
        assert_eq!(
            run["console_warnings"],
            json!([]),
            "{mode}: console warnings"
        );
        assert_eq!(run["page_errors"], json!([]), "{mode}: uncaught exceptions");
    }
    let stored = check_stored(&server, &summary);
    check_people(&server, &summary, &stored);
    // The browser's context on every event: the page it was captured on.
    for e in &stored {
        let url = e["properties"]["$current_url"].as_str().unwrap_or("");
        assert!(url.starts_with("http://127.0.0.1:"), "{e}");
    }
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_js_lite_in_node() {
    require_lite(false);
    let server = start();
    let host = format!("http://{}", server.addr);
    let summary = run(
        Path::new("node"),
        &["lite/node.mjs", &host, KEY_ONE, "lite-node"],
    );
    assert_eq!(summary["sdk"], "posthog-js-lite");
    eprintln!(
        "posthog-js-lite {} (@posthog/core {}) in Node {}",
        summary["version"], summary["core"], summary["node"]
    );
    assert_eq!(summary["console_errors"], json!([]), "console errors");
    let stored = check_stored(&server, &summary);
    check_people(&server, &summary, &stored);
    // Node has no window: no page context on any event.
    for e in &stored {
        assert_eq!(e["properties"].get("$current_url"), None, "{e}");
    }
}
