//! posthog-js as sites load it, in Chromium, from a flagpost that serves everything the
//! library asks for: the official HTML snippet (its `array.js` from flagpost's
//! `/static/`, filled from the pinned npm package), the npm package's module build
//! (extensions lazy-loaded from `/static/`), and `array.full.js` with external
//! dependency loading left on. The optional features (heatmaps, web vitals, dead clicks,
//! exception autocapture, surveys) are switched on in the project's settings on the
//! server, none in the pages: each test makes one of them happen (the autocaptured
//! ones on each way) and checks the event the server stored. A plain load of each way
//! makes no failed request and logs no console error. `tests/sdk/browser/site.mjs`
//! drives the browser.

use std::path::Path;

use serde_json::{json, Value};

use super::super::*;
use crate::util::*;

/// The ways `site.mjs` loads posthog-js, as its results name them.
const WAYS: [&str; 3] = ["snippet", "npm", "full"];

/// The survey of `surveys/1.json`, in PostHog's public shape.
const SURVEY_ID: &str = "01937bd2-7e3a-0000-b5d0-0c2a8f9d1e11";
const QUESTION_ID: &str = "01937bd2-7e3a-0001-9a4c-5b7e2d3f4a22";
/// The early access feature of `early_access/1.json` and its flag.
const FEATURE_ID: &str = "01937bd2-7e3a-0002-8c1d-6e9f0a1b2c33";
const FEATURE_FLAG: &str = "new-dashboard";
/// What the test answers in the survey's text box.
const ANSWER: &str = "flagpost answer";

fn posthog_js_dist() -> std::path::PathBuf {
    sdk_dir().join("node/node_modules/posthog-js/dist")
}

fn survey() -> Value {
    json!({"surveys": [{
        "id": SURVEY_ID,
        "name": "What next",
        "description": "",
        "type": "popover",
        "questions": [{"id": QUESTION_ID, "type": "open", "question": "What should we build next?",
                       "description": "", "originalQuestionIndex": 0}],
        "appearance": {"position": "right", "displayThankYouMessage": false,
                       "surveyPopupDelaySeconds": 0},
        // Only on the survey test's page: elsewhere a popover appearing would make the
        // dead click a live one and add its events to every load.
        "conditions": {"url": "?with-survey", "urlMatchType": "icontains"},
        "start_date": "2026-01-01T00:00:00Z",
        "end_date": null,
        "current_iteration": null,
        "current_iteration_start_date": null,
        "linked_flag_key": null,
        "targeting_flag_key": null,
        "schedule": "once",
        "enable_partial_responses": false
    }]})
}

fn early_access() -> Value {
    json!({"earlyAccessFeatures": [{
        "id": FEATURE_ID,
        "name": "New dashboard",
        "description": "The dashboard, rebuilt",
        "stage": "beta",
        "documentationUrl": "https://example.com/docs/new-dashboard",
        "imageUrl": "",
        "flagKey": FEATURE_FLAG,
        "payload": {}
    }]})
}

/// The early access feature's flag: off for everyone, on for a person enrolled in it.
fn flags() -> Value {
    json!({
        "flags": [{"id": 1, "key": FEATURE_FLAG, "active": true,
                   "filters": {"groups": [{"properties": [], "rollout_percentage": 0}],
                               "feature_enrollment": true}}],
        "group_type_mapping": {},
        "cohorts": {}
    })
}

/// Project one with every optional browser feature switched on, as PostHog's project
/// settings would; surveys are on because the project has one.
fn projects() -> Value {
    json!({"projects": [{
        "id": 1, "name": "one", "api_key": KEY_ONE, "personal_api_keys": [PERSONAL_ONE],
        "remote_config": {
            "heatmaps": true,
            "autocapture_exceptions": true,
            "web_vitals": true,
            "capture_dead_clicks": true
        }
    }]})
}

/// A flagpost whose project one has the features on, the survey and the early access
/// feature, and posthog-js's `dist/` in its static directory; None (after saying why)
/// when Chromium or the npm packages are not installed.
fn start_site() -> Server {
    let modules = sdk_dir().join("node/node_modules");
    let deps = [
        Path::new("/usr/bin/chromium"),
        &modules.join("playwright-core"),
        &modules.join("posthog-js"),
    ];
    require("posthog-js site", &deps);
    let server = Server::start();
    let data = server.data();
    // What an operator does: copy the package's scripts into the static directory.
    let static_dir = data.join("static");
    std::fs::create_dir_all(&static_dir).unwrap();
    for entry in std::fs::read_dir(posthog_js_dist()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "js") {
            std::fs::copy(&path, static_dir.join(path.file_name().unwrap())).unwrap();
        }
    }
    for dir in ["surveys", "early_access"] {
        std::fs::create_dir_all(data.join(dir)).unwrap();
    }
    write_atomically(&data.join("surveys/1.json"), survey().to_string());
    write_atomically(
        &data.join("early_access/1.json"),
        early_access().to_string(),
    );
    write_atomically(&data.join("flags/1.json"), flags().to_string());
    write_atomically(&data.join("projects.json"), projects().to_string());
    server.sighup();
    // Every file is read before a browser asks: the config says heatmaps (projects.json)
    // and surveys (surveys/1.json) are on, and the flags include the feature's.
    wait_for("the project's switches, survey and flags", || {
        let config = server.get(&format!("/array/{KEY_ONE}/config")).json();
        let on = config["heatmaps"] == true && config["surveys"] == true;
        let body = json!({"token": KEY_ONE, "distinct_id": "x"}).to_string();
        let flags = server.post("/flags/?v=2", body).json();
        (on && flags["flags"].get(FEATURE_FLAG).is_some()).then_some(())
    });
    server
}

/// Runs a scenario of `site.mjs`; returns its result.
fn visit(server: &Server, scenario: &str) -> Value {
    let host = format!("http://{}", server.addr);
    let summary = run(
        Path::new("node"),
        &["browser/site.mjs", &host, KEY_ONE, scenario],
    );
    assert_eq!(summary["sdk"], "posthog-js");
    eprintln!(
        "posthog-js {} in Chromium {}: {scenario}",
        summary["version"], summary["chromium"]
    );
    summary["result"].clone()
}

/// Nothing failed, nothing was logged as an error, nothing was thrown.
fn clean(what: &str, visit: &Value) {
    assert_eq!(visit["failures"], json!([]), "{what}: failed requests");
    assert_eq!(visit["console_errors"], json!([]), "{what}: console errors");
    assert_eq!(
        visit["page_errors"],
        json!([]),
        "{what}: uncaught exceptions"
    );
}

/// "METHOD /path" of each request to the flagpost server, query left out (it carries
/// timestamps), each once, sorted. posthog-js sends events to `/e/` until the remote
/// config arrives, then to its `analytics.endpoint` (PostHog names `/i/v0/e/`): both
/// read "intake".
fn asked(server: &Server, visit: &Value) -> Vec<String> {
    let base = format!("http://{}", server.addr);
    let mut out: Vec<String> = array(&visit["requests"])
        .iter()
        .filter(|r| r["url"].as_str().unwrap().starts_with(&base))
        .map(|r| {
            let method = r["method"].as_str().unwrap();
            match r["path"].as_str().unwrap() {
                "/e/" | "/i/v0/e/" => format!("{method} intake"),
                path => format!("{method} {path}"),
            }
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The stored event with the id posthog-js gave it.
fn stored(server: &Server, sent: &Value) -> Value {
    let id = sent["uuid"]
        .as_str()
        .unwrap_or_else(|| panic!("no uuid: {sent}"));
    let events = server.settle(1);
    event(&events, &json!(id)).clone()
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn plain_loads_make_no_failed_request_and_no_console_error() {
    let server = start_site();
    let result = visit(&server, "plain");
    let package = std::fs::read(posthog_js_dist().join("../package.json")).unwrap();
    let version = serde_json::from_slice::<Value>(&package).unwrap()["version"].clone();
    let version = version.as_str().unwrap();
    let config = format!("GET /array/{KEY_ONE}/config.js");
    // Each way's extensions, as posthog-js (1.449.2 checked) asks for them first: the
    // path with its own version, which flagpost serves from the same files.
    let lazy = |names: &[&str]| -> Vec<String> {
        names
            .iter()
            .map(|n| format!("GET /static/{version}/{n}.js"))
            .collect()
    };
    let extensions = [
        "dead-clicks-autocapture",
        "exception-autocapture",
        "surveys",
        "web-vitals-with-attribution",
    ];
    let mut snippet = vec!["GET /static/array.js".to_string()];
    snippet.extend(lazy(&extensions));
    let npm = lazy(&extensions);
    let common = [
        config.clone(),
        "GET /api/surveys/".into(),
        "POST /flags/".into(),
        "POST intake".into(),
    ];
    for (way, mut want) in WAYS.into_iter().zip([snippet, npm, vec![]]) {
        let visit = &result[way];
        clean(way, visit);
        want.extend(common.iter().cloned());
        want.sort();
        assert_eq!(
            asked(&server, visit),
            want,
            "{way}: what it asked flagpost for"
        );
        let pageview = stored(&server, &visit["pageview"]);
        assert_eq!(pageview["event"], "$pageview");
        assert_eq!(
            pageview["properties"]["$current_url"], visit["url"],
            "{way}"
        );
    }
    // Every event a load sent is stored, once.
    let events = server.settle(1);
    for way in WAYS {
        for sent in array(&result[way]["requests"])
            .iter()
            .flat_map(|r| array(&r["events"]))
        {
            let n = events.iter().filter(|e| e["id"] == sent["uuid"]).count();
            assert_eq!(n, 1, "{way}: {sent} stored {n} times");
        }
        // Leaving the page sent the page leave by beacon (which Playwright cannot see).
        let visit = &result[way];
        let leaves: Vec<&Value> = events
            .iter()
            .filter(|e| e["event"] == "$pageleave")
            .filter(|e| e["properties"]["$current_url"] == visit["url"])
            .collect();
        assert_eq!(leaves.len(), 1, "{way}: page leaves {leaves:?}");
        assert_eq!(
            leaves[0]["distinct_id"], visit["pageview"]["distinct_id"],
            "{way}"
        );
    }
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn heatmaps_dead_clicks_and_web_vitals_arrive_as_events() {
    let server = start_site();
    let result = visit(&server, "autocapture");
    for way in WAYS {
        let visit = &result[way];
        clean(way, visit);
        let url = visit["url"].as_str().unwrap();
        let (x, y) = (&visit["button"]["x"], &visit["button"]["y"]);
        let events = &visit["events"];

        let click = stored(&server, &events["$autocapture"]);
        let props = &click["properties"];
        assert_eq!(
            (&props["$event_type"], &props["$el_text"]),
            (&json!("click"), &json!("Does nothing")),
            "{way}: {click}"
        );

        let dead = stored(&server, &events["$dead_click"]);
        let props = &dead["properties"];
        assert_eq!(
            (&props["$current_url"], &props["$el_text"]),
            (&json!(url), &json!("Does nothing")),
            "{way}: {dead}"
        );

        // Heatmaps send their points, by page, every few seconds: the click is among
        // them where the mouse clicked.
        let heatmap = stored(&server, &events["$$heatmap"]);
        let points = array(&heatmap["properties"]["$heatmap_data"][url]);
        let at = json!({"x": x, "y": y, "target_fixed": false, "type": "click"});
        assert!(points.contains(&at), "{way}: no {at} in {heatmap}");

        let vitals = stored(&server, &events["$web_vitals"]);
        let props = &vitals["properties"];
        assert_eq!(props["$current_url"], url, "{way}: {vitals}");
        assert_eq!(
            props["$web_vitals_FCP_event"]["name"], "FCP",
            "{way}: {vitals}"
        );
        let fcp = props["$web_vitals_FCP_value"].as_f64().unwrap();
        assert!(fcp > 0.0 && fcp < 20_000.0, "{way}: {vitals}");
    }
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn an_uncaught_error_arrives_as_an_exception_event() {
    let server = start_site();
    let result = visit(&server, "exception");
    let message = "flagpost test: nobody catches this";
    for way in WAYS {
        let visit = &result[way];
        // The thrown error is the page's only error, and reported as uncaught.
        assert_eq!(visit["failures"], json!([]), "{way}");
        assert_eq!(visit["console_errors"], json!([]), "{way}");
        assert_eq!(
            visit["page_errors"],
            json!([format!("Error: {message}")]),
            "{way}"
        );
        let exception = stored(&server, &visit["exception"]);
        assert_eq!(exception["event"], "$exception");
        let first = &exception["properties"]["$exception_list"][0];
        assert_eq!(
            (
                &first["type"],
                &first["value"],
                &first["mechanism"]["handled"]
            ),
            (&json!("Error"), &json!(message), &json!(false)),
            "{way}: {exception}"
        );
    }
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn the_survey_popover_is_answered_and_not_shown_again() {
    let server = start_site();
    let result = visit(&server, "survey");
    clean("survey", &result);
    clean("survey after reload", &result["reload"]);
    let survey = &result["survey"];
    assert_eq!(
        (&survey["id"], &survey["type"]),
        (&json!(SURVEY_ID), &json!("popover"))
    );
    let flag = survey["internal_targeting_flag_key"]
        .as_str()
        .unwrap_or_else(|| panic!("no internal targeting flag: {survey}"));
    assert_eq!(result["before"], json!({"visible": true}));

    let shown = stored(&server, &result["shown"]);
    assert_eq!(shown["event"], "survey shown");
    assert_eq!(shown["properties"]["$survey_id"], SURVEY_ID);
    let sent = stored(&server, &result["sent"]);
    let props = &sent["properties"];
    assert_eq!(sent["event"], "survey sent");
    assert_eq!(props["$survey_id"], SURVEY_ID, "{sent}");
    assert_eq!(
        props[format!("$survey_response_{QUESTION_ID}")],
        ANSWER,
        "{sent}"
    );
    assert_eq!(props["$survey_completed"], true, "{sent}");
    assert_eq!(
        props["$set"][format!("$survey_responded/{SURVEY_ID}")],
        true,
        "{sent}"
    );

    // After the reload posthog-js no longer remembers showing it: the server's flag,
    // evaluated with the person properties posthog-js sends, holds it back.
    assert_eq!(result["flag_after_reload"], false);
    assert_eq!(result["reload"]["flags"]["flags"][flag]["enabled"], false);
    assert_eq!(result["rendered_after_reload"], 0);
    assert_eq!(
        result["after"],
        json!({"visible": false, "disabledReason": "Survey internal targeting flag is not enabled and survey cannot activate repeatedly and survey is not in progress"})
    );
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn early_access_features_are_listed_and_enrollment_flips_the_flag() {
    let server = start_site();
    let result = visit(&server, "early-access");
    clean("early access", &result);
    assert_eq!(result["features"], early_access()["earlyAccessFeatures"]);
    assert_eq!(result["before"], false);
    assert_eq!(result["flags_requests"], 1);
    let after = &result["after"];
    assert_eq!(
        (&after["enabled"], &after["reason"]["code"]),
        (&json!(true), &json!("super_condition_value")),
        "{after}"
    );
    let enrollment = stored(&server, &result["enrollment"]);
    assert_eq!(enrollment["event"], "$feature_enrollment_update");
    let props = &enrollment["properties"];
    assert_eq!(
        (&props["$feature_flag"], &props["$feature_enrollment"]),
        (&json!(FEATURE_FLAG), &json!(true)),
        "{enrollment}"
    );
    assert_eq!(
        props["$set"][format!("$feature_enrollment/{FEATURE_FLAG}")],
        true,
        "{enrollment}"
    );
}
