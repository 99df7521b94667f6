//! The console in Debian's Chromium, driven by playwright-core (tests/sdk/browser/
//! console.mjs): every page used as a person would, axe-core on each, and nothing
//! failing but the one refusal the script asks for. The browser runs in New York's
//! time zone, so the insights' local days are not UTC days. With
//! `FLAGPOST_CONSOLE_SCREENSHOTS=docs/console` the run also refreshes the screenshots
//! the documentation shows.

use std::path::Path;

use serde_json::json;

use super::super::*;
use crate::util::*;

#[test]
#[ignore = "needs tests/sdk/install.sh (Chromium, playwright-core, axe-core): run by .ci/run, cargo test -- --include-ignored"]
fn the_console_in_chromium() {
    let modules = sdk_dir().join("node/node_modules");
    let deps = [
        Path::new("/usr/bin/chromium"),
        &modules.join("playwright-core"),
        &modules.join("axe-core/axe.min.js"),
    ];
    require("console", &deps);
    let server = Server::start();
    let host = format!("http://{}", server.addr);
    let shots = tempfile::tempdir().unwrap();
    let dir = match std::env::var("FLAGPOST_CONSOLE_SCREENSHOTS") {
        Ok(d) if !d.is_empty() => Path::new(env!("CARGO_MANIFEST_DIR")).join(d),
        _ => shots.path().to_path_buf(),
    };
    std::fs::create_dir_all(&dir).unwrap();
    let dir = dir.to_str().unwrap();
    let s = run(
        Path::new("node"),
        &["browser/console.mjs", &host, PERSONAL_ONE, KEY_ONE, dir],
    );
    eprintln!("console in Chromium, axe-core {}", s["axe"]);
    let none: Vec<String> = Vec::new();
    for page in [
        "sign-in",
        "flag-form",
        "flags",
        "events",
        "persons",
        "persons-list",
        "flag-page",
        "phone-flag-page",
        "insights",
        "health",
    ] {
        assert_eq!(
            s["accessibility"][page],
            json!(none),
            "serious or critical: {page}"
        );
    }
    assert_eq!(s["signed_in_as"], "one (project 1) · phx_..._one");
    assert_eq!(s["decide_on"], json!({"pro": true, "free": false}));
    assert_eq!(s["created_notice"], "console-made was created.");
    assert_eq!(
        s["rules_in_words"],
        "Group 1: 100% of users where plan is \"pro\"."
    );
    // Saying no to the confirmation changes nothing.
    assert_eq!(
        s["confirm_text"],
        "Switch console-made off?Every user then gets false for it from /decide within a \
         second.Switch offCancel"
    );
    assert_eq!(s["cancel_keeps"], json!({"switch": "true", "decide": true}));
    assert_eq!(
        s["confirm_on_text"],
        "Switch console-made on?It then answers true (or a variant) to 100% where 1 \
         condition.Switch onCancel"
    );
    assert_eq!(s["flag_search"], json!(["console-made"]));
    assert_eq!(s["flag_filter_on_hides_it"], true);
    assert_eq!(s["flag_filter_off"], json!(["console-made"]));
    assert_eq!(
        s["duplicate_error"],
        "There is already a feature flag with this key."
    );
    assert_eq!(s["duplicate_invalid"], "true");
    assert_eq!(
        s["rollout_error"],
        "groups[0].rollout_percentage must be between 0 and 100, got 130"
    );
    assert_eq!(s["rollout_invalid"], "true");
    assert_eq!(s["decide_off_within"], "a second");
    assert_eq!((&s["live_rows"], &s["event_json"]), (&json!(1), &json!(1)));
    assert_eq!(
        s["person"],
        json!({"distinct_ids": ["ada"], "flag_now": "true"})
    );
    assert_eq!(s["person_by_property"], json!(["ada"]));
    assert_eq!(s["event_filter"], json!(["console live check"]));
    assert_eq!(s["event_time_text"], s["event_time_expected"]);
    // Newest first by first event: late-bird now, early-bird two days ago.
    let newest = s["persons_newest_first"].as_array().unwrap();
    assert_eq!(newest.first(), Some(&json!("late-bird")), "{newest:?}");
    assert_eq!(newest.last(), Some(&json!("early-bird")), "{newest:?}");
    assert_eq!(
        s["persons_without_email"],
        json!(["early-bird", "late-bird"])
    );
    let note = s["persons_search_note"].as_str().unwrap();
    assert!(
        note.starts_with("Searched to the oldest person: "),
        "{note}"
    );
    assert_eq!(s["persons_by_prefix"], json!(["early-bird"]));
    assert_eq!(s["flag_exposures"], json!({"true": 2, "false": 1}));
    let reach = s["flag_reach"].as_str().unwrap();
    assert!(reach.starts_with("1 of "), "{reach}");
    assert_eq!(s["flag_reach_examples"], json!(["ada"]));
    assert_eq!(
        s["flag_history"].as_array().unwrap().len(),
        3,
        "{}",
        s["flag_history"]
    );
    assert_eq!(s["flag_history"][0], "active: false → true");
    assert_eq!(s["flag_history"][1], "active: true → false");
    // The chart's numbers are the read API's.
    for event in ["console live check", "$identify"] {
        let r = server.api(
            &format!("/api/projects/1/events/?event={}", urlencode(event)),
            PERSONAL_ONE,
        );
        let n = r.json()["results"].as_array().unwrap().len();
        assert_eq!(n, 1, "{event}");
        assert_eq!(s["chart_totals"][event], json!(n), "{event}");
    }
    assert_eq!(s["chart_days"], 7);
    assert_eq!(s["chart_day_label"], s["chart_day_expected"]);
    // The range's unique persons are the union of the days': late-bird was seen on two.
    assert_eq!(s["union"], json!({"buckets_summed": 3, "range_unique": 2}));
    assert_eq!(s["today"]["total"], 1);
    assert_eq!(s["today"]["hours"], s["today"]["hours_expected"]);
    assert_eq!(s["custom_day"], json!({"rows": 1, "unique": 2, "total": 2}));
    let german = s["german_event_time"].as_str().unwrap();
    let shape: Vec<bool> = german.chars().map(|c| c.is_ascii_digit()).collect();
    assert_eq!(
        (german.len(), &german[2..3], &german[5..6], &german[10..12]),
        (20, ".", ".", ", "),
        "{german}"
    );
    assert_eq!(shape.iter().filter(|d| **d).count(), 14, "{german}");
    assert_eq!(s["health_errors"], "Every file loaded.");
    assert_eq!(s["phone_overflow"], false);
    assert_eq!(
        s["phone_overflow_pages"],
        json!({"flag": false, "persons": false, "insights": false})
    );
    assert_eq!(
        s["cookie"],
        json!({"httpOnly": true, "sameSite": "Strict", "path": "/console/"})
    );
    assert_eq!(
        s["cross_site"],
        json!({"foreign_origin": 403, "no_token": 403})
    );
    assert_eq!(s["after_sign_out"], 401);
    // The only refusals are the duplicate key and the rollout of 130 the script sends
    // on purpose, and the browser's console line about each.
    let refused = format!("POST {host}/console/api/feature_flags/: 400");
    assert_eq!(s["failed_requests"], json!([refused, refused]));
    let line = "Failed to load resource: the server responded with a status of 400 (Bad Request)";
    assert_eq!(s["console_errors"], json!([line, line]));
    assert_eq!(s["page_errors"], json!([]));
}
