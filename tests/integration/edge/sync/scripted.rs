//! The sync against a scripted upstream: the weak ETag sent back byte for byte and a
//! 304 that compiles nothing, the fallback to the legacy endpoint, 429 with
//! `Retry-After`, 402 (quota limited, no stale flags), and 503, refused connections and
//! slow answers, through all of which the last good rules stay.

use std::time::Duration;

use serde_json::json;

use super::fake::{Fake, Reply, Seen};
use super::{decide, edge, metric, wait_for_flag, SECRET};
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
