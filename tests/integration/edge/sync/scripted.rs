//! The sync against a scripted upstream: the weak ETag sent back byte for byte and a
//! 304 that compiles nothing, the fallback to the legacy endpoint, 429 with
//! `Retry-After`, 402 (quota limited, no stale flags), and 503, refused connections and
//! slow answers, through all of which the last good rules stay; upstream's
//! quota-limited `/flags` answer passed on in every shape; a project given its key
//! while serving keeps its file's flags until upstream first answers.

use std::time::Duration;

use serde_json::json;

use super::fake::{Fake, Reply, Seen};
use super::{
    decide, edge, edge_with, flag_sync_health, metric, projects_json, synced_key, wait_for_flag,
    SECRET,
};
use crate::util::*;

const WEAK: &str = r#"W/"0a1b2c""#;

fn definitions(rollout: u32) -> String {
    json!({"flags": [{"id": 1, "key": "beta", "active": true, "ensure_experience_continuity": false,
        "filters": {"groups": [{"properties": [], "rollout_percentage": rollout}]}}],
        "group_type_mapping": {}, "cohorts": {}})
    .to_string()
}

/// PostHog's answer: the body with a weak ETag, or a 304 when it matches.
fn posthog(seen: &Seen) -> Reply {
    if seen.header("if-none-match") == Some(WEAK) {
        return Reply::new(304).header("etag", WEAK);
    }
    Reply::new(200)
        .header("etag", WEAK)
        .header("cache-control", "private, must-revalidate")
        .header("content-type", "application/json")
        .body(&definitions(100))
}

const VERSION: &str = "flagpost_flags_snapshot_version";

#[test]
fn the_weak_etag_goes_back_byte_for_byte_and_a_304_compiles_nothing() {
    let fake = Fake::start(posthog);
    let edge = edge(&fake.url(), &[]);
    wait_for_flag(&edge, "beta", json!(true));
    let first = fake.wait_for_requests(2);
    let version = metric(&edge, VERSION);
    let seen = fake.wait_for_requests(first.len() + 3);
    assert_eq!(metric(&edge, VERSION), version, "a 304 published new rules");
    assert_eq!(seen[0].header("if-none-match"), None);
    for s in &seen {
        assert_eq!(s.path, "/flags/definitions?token=phc_test_one&send_cohorts");
        assert_eq!(
            s.header("authorization"),
            Some(format!("Bearer {SECRET}").as_str())
        );
    }
    for s in &seen[1..] {
        assert_eq!(s.header("if-none-match"), Some(WEAK), "{s:?}");
    }
    assert_eq!(
        std::fs::read_to_string(edge.dir.join("db/upstream/1/etag")).unwrap(),
        WEAK
    );
}

#[test]
fn the_same_body_again_compiles_nothing() {
    // As PostHog answers when it cannot read its ETag: a 200 every time.
    let fake = Fake::start(|_| Reply::new(200).header("etag", WEAK).body(&definitions(100)));
    let edge = edge(&fake.url(), &[]);
    wait_for_flag(&edge, "beta", json!(true));
    let first = fake.wait_for_requests(2);
    let version = metric(&edge, VERSION);
    fake.wait_for_requests(first.len() + 3);
    assert_eq!(
        metric(&edge, VERSION),
        version,
        "an unchanged body published new rules"
    );
}

#[test]
fn an_upstream_without_flags_definitions_is_polled_on_local_evaluation() {
    let fake = Fake::start(|seen| match seen.path.starts_with("/flags/definitions") {
        true => Reply::new(404),
        false => posthog(seen),
    });
    let edge = edge(&fake.url(), &[]);
    wait_for_flag(&edge, "beta", json!(true));
    let seen = fake.wait_for_requests(4);
    assert!(seen[1..].iter().all(|s| s.path == "/api/feature_flag/local_evaluation?token=phc_test_one&send_cohorts"), "{seen:?}");
    assert_eq!(
        metric(
            &edge,
            r#"flagpost_upstream_requests_total{endpoint="flags_definitions",status="404"}"#
        ),
        1.0
    );
    assert!(
        metric(
            &edge,
            r#"flagpost_upstream_requests_total{endpoint="local_evaluation",status="304"}"#
        ) >= 1.0
    );
}

#[test]
fn a_429_is_waited_out_as_retry_after_says() {
    let fake = Fake::start(posthog);
    let edge = edge(&fake.url(), &[]);
    wait_for_flag(&edge, "beta", json!(true));
    fake.script(|_| Reply::new(429).header("retry-after", "4"));
    let before = fake.seen().len();
    let seen = fake.wait_for_requests(before + 2);
    let limited = &seen[before];
    let next = &seen[before + 1];
    assert!(
        next.at.duration_since(limited.at) >= Duration::from_secs(4),
        "polled again {:?} after a 429 asking for 4 s",
        next.at.duration_since(limited.at)
    );
    assert_eq!(decide(&edge, "ada")["featureFlags"]["beta"], json!(true));
}

#[test]
fn a_402_clears_the_flags_and_answers_quota_limited() {
    let fake = Fake::start(posthog);
    let edge = edge(&fake.url(), &[]);
    wait_for_flag(&edge, "beta", json!(true));
    fake.script(|_| {
        Reply::new(402).body(r#"{"type":"quota_limited","code":"payment_required","detail":"You have exceeded your feature flag request quota"}"#)
    });
    let d = wait_for("quota_limited at the edge", || {
        let d = decide(&edge, "ada");
        d.get("quotaLimited").is_some().then_some(d)
    });
    assert_eq!(d["quotaLimited"], json!(["feature_flags"]));
    assert_eq!(d["featureFlags"], json!({}), "no stale flags");
    let v2 = edge
        .post(
            "/flags/?v=2",
            json!({"api_key": KEY_ONE, "distinct_id": "ada"}).to_string(),
        )
        .json();
    assert_eq!(
        (v2["flags"].clone(), v2["quotaLimited"].clone()),
        (json!({}), json!(["feature_flags"]))
    );
    let feed = edge.request(
        Req::get("/flags/definitions?token=phc_test_one")
            .header("Authorization", &format!("Bearer {PERSONAL_ONE}")),
    );
    assert_eq!(feed.status, 402, "{}", feed.text());
    assert!(
        !edge.dir.join("db/upstream/1/definitions.json").exists(),
        "a restart would serve stale flags"
    );
    // Quota back: flags back, without quotaLimited.
    fake.script(posthog);
    let d = wait_for_flag(&edge, "beta", json!(true));
    assert!(d.get("quotaLimited").is_none(), "{d}");
}

#[test]
fn the_last_good_rules_stay_through_503s_refused_connections_and_slow_answers() {
    let fake = Fake::start(posthog);
    let edge = edge(&fake.url(), &[]);
    wait_for_flag(&edge, "beta", json!(true));
    let label = |status: &str| {
        format!(
            r#"flagpost_upstream_requests_total{{endpoint="flags_definitions",status="{status}"}}"#
        )
    };

    fake.script(|_| Reply::new(503).body("upstream unavailable"));
    wait_for("503s", || {
        (metric(&edge, &label("503")) >= 2.0).then_some(())
    });
    assert_eq!(decide(&edge, "ada")["featureFlags"]["beta"], json!(true));
    assert_eq!(edge.get("/_readiness").status, 200);

    // Slower than the poll's 10 s deadline.
    fake.script(|_| {
        Reply::new(200)
            .body(&definitions(0))
            .delay(Duration::from_secs(15))
    });
    wait_for("a timed-out poll", || {
        (metric(&edge, &label("timeout")) >= 1.0).then_some(())
    });
    assert_eq!(decide(&edge, "ada")["featureFlags"]["beta"], json!(true));

    fake.close();
    wait_for("a refused poll", || {
        (metric(&edge, &label("refused")) >= 1.0).then_some(())
    });
    assert_eq!(decide(&edge, "ada")["featureFlags"]["beta"], json!(true));
    assert_eq!(edge.get("/_readiness").status, 200);
    // Each state was logged once, not once a poll.
    let log = edge.log();
    assert!(log.matches("flag sync failing").count() <= 3, "{log}");
}

/// What PostHog's flags service answers a project over its flag quota
/// (`billing::check_limits`): no flags, `quotaLimited`, no error.
const QUOTA_LIMITED_FLAGS: &str = r#"{"errorsWhileComputingFlags":false,"flags":{},"quotaLimited":["feature_flags"],"requestId":"0190d1a2-0000-7000-8000-000000000000"}"#;

/// The synced definitions from [`posthog`]; `/flags` answered by `flags`.
fn posthog_with_flags(flags: &'static str) -> impl FnMut(&Seen) -> Reply + Send + 'static {
    move |seen| match seen.path.starts_with("/flags/?") {
        true => Reply::new(200)
            .header("content-type", "application/json")
            .body(flags),
        false => posthog(seen),
    }
}

#[test]
fn upstreams_quota_limited_flags_answer_is_passed_on_in_every_shape() {
    let fake = Fake::start(posthog);
    let edge = edge(&fake.url(), &[]);
    wait_for_flag(&edge, "beta", json!(true));
    fake.script(posthog_with_flags(QUOTA_LIMITED_FLAGS));
    // A request for every flag goes upstream (for the flags the feed leaves out), and a
    // flag the rules lack does too: upstream's quota answer stands for the whole body,
    // the edge's own `beta` included, as PostHog's would.
    let every = json!({"api_key": KEY_ONE, "distinct_id": "ada"});
    let unknown =
        json!({"api_key": KEY_ONE, "distinct_id": "ada", "flag_keys": ["beta", "elsewhere"]});
    // (path, where the flags are, their empty value)
    let shapes = [
        ("/flags/?v=2", "flags", json!({})),
        ("/flags/", "featureFlags", json!({})),
        ("/decide/?v=3", "featureFlags", json!({})),
        ("/decide/?v=2", "featureFlags", json!({})),
        ("/decide/", "featureFlags", json!([])),
    ];
    for body in [&every, &unknown] {
        for (path, member, empty) in &shapes {
            let asked = fake.seen_at("/flags/?v=2").len();
            let r = edge.post(path, body.to_string());
            assert_eq!(r.status, 200, "{path}: {}", r.text());
            let answer = r.json();
            assert_eq!(
                answer["quotaLimited"],
                json!(["feature_flags"]),
                "{path} {body}: {answer}"
            );
            assert_eq!(&answer[*member], empty, "{path} {body}: {answer}");
            if let Some(payloads) = answer.get("featureFlagPayloads") {
                assert_eq!(payloads, &json!({}), "{path}");
            }
            if let Some(errors) = answer.get("errorsWhileComputingFlags") {
                assert_eq!(errors, &json!(false), "{path}");
            }
            let calls = fake.seen_at("/flags/?v=2");
            assert_eq!(calls.len(), asked + 1, "{path} {body}: one upstream call");
            let sent: serde_json::Value = serde_json::from_slice(&calls[asked].body).unwrap();
            assert_eq!(sent["distinct_id"], "ada");
        }
    }
    // Quota back upstream: the flags come back, without `quotaLimited`.
    let answered = r#"{"errorsWhileComputingFlags":false,"flags":{"elsewhere":{"key":"elsewhere","enabled":true,"variant":null,"reason":{"code":"condition_match","condition_index":0,"description":"Matched condition set 1"},"metadata":{"id":2,"version":1,"description":null,"payload":null}}},"requestId":"0190d1a2-0000-7000-8000-000000000001"}"#;
    fake.script(posthog_with_flags(answered));
    let d = edge.post("/decide/?v=3", unknown.to_string()).json();
    assert!(d.get("quotaLimited").is_none(), "{d}");
    assert_eq!(d["featureFlags"], json!({"beta": true, "elsewhere": true}));
}

#[test]
fn a_project_given_its_key_while_serving_keeps_its_file_until_upstream_answers() {
    let fake = Fake::start(|_| Reply::new(503).body("upstream unavailable"));
    let edge = edge_with(&fake.url(), "", &[]);
    wait_for_flag(&edge, "from-the-file", json!(true));
    write_atomically(
        &edge.data().join("projects.json"),
        projects_json(&synced_key()),
    );
    // The sync starts and upstream fails: the file's flags stay, and health says so.
    let sync = wait_for("the failing sync on the health page", || {
        let sync = flag_sync_health(&edge);
        (sync["last_status"] == "503").then_some(sync)
    });
    assert_eq!(sync["serving"], "flag file", "{sync}");
    assert_eq!(sync["last_success"], json!(null));
    let d = decide(&edge, "ada");
    assert_eq!(d["featureFlags"]["from-the-file"], json!(true), "{d}");
    // Upstream's first answer replaces them.
    fake.script(posthog);
    let d = wait_for_flag(&edge, "beta", json!(true));
    assert!(d["featureFlags"].get("from-the-file").is_none(), "{d}");
    // (The health page is told just after the rules are published.)
    wait_for("upstream's rules on the health page", || {
        (flag_sync_health(&edge)["serving"] == "upstream").then_some(())
    });
}
