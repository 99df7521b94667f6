//! Flags at the edge (issue 39): an edge flagpost in front of an upstream flagpost with
//! the same rules, a recording fake between them. The edge's `/flags?v=2` and
//! `/decide?v=3` equal upstream's for generated definitions and requests; every class
//! the edge cannot decide goes upstream in exactly one call with `flag_keys` and the
//! client's address; a slow or failing upstream leaves the local answer with
//! `errorsWhileComputingFlags`.

mod fake;

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use crate::util::*;
use fake::{Fake, Mode};

/// The client address the edge's trusted proxy (the test, on loopback) reports.
const CLIENT: &str = "203.0.113.7";
/// Budget for the upstream call: short, so the slow fake is past it.
const BUDGET_MS: &str = "400";
/// Budget for the parity test, which compares answers and never slows upstream down:
/// long enough that a loaded machine does not turn upstream's answer into a timeout.
const PARITY_BUDGET_MS: &str = "10000";

struct Pair {
    upstream: Server,
    fake: Fake,
    edge: Server,
}

fn pair(definitions: &Value) -> Pair {
    pair_with(definitions, BUDGET_MS)
}

fn pair_with(definitions: &Value, budget_ms: &str) -> Pair {
    let upstream = Server::start();
    load(&upstream, definitions);
    let fake = Fake::start(upstream.addr);
    let url = format!("http://{}", fake.addr);
    let edge = Server::start_with(&[
        "--upstream",
        &url,
        "--upstream-flags-budget-ms",
        budget_ms,
        "--trusted-proxies",
        "127.0.0.1/32",
    ]);
    load(&edge, definitions);
    Pair {
        upstream,
        fake,
        edge,
    }
}

fn load(server: &Server, definitions: &Value) {
    let want = definitions["flags"].as_array().map(Vec::len);
    std::fs::write(server.data().join("flags/1.json"), definitions.to_string()).unwrap();
    server.sighup();
    let feed = format!("/flags/definitions?token={KEY_ONE}");
    wait_for("the flags to load", || {
        let body = server.api(&feed, PERSONAL_ONE).json();
        (body["flags"].as_array().map(Vec::len) == want).then_some(())
    });
}

/// A flags request as a client behind the edge's proxy sends it; the answer without
/// what differs between any two answers (its id and time).
fn ask(server: &Server, path: &str, body: &Value) -> Value {
    let req = Req::post(path, body.to_string()).header("X-Forwarded-For", CLIENT);
    let r = server.request(req);
    assert_eq!(r.status, 200, "{}", r.text());
    let mut answer = r.json();
    let object = answer.as_object_mut().unwrap();
    object.remove("requestId");
    object.remove("evaluatedAt");
    answer
}

/// The edge's answer, checking it cost at most one upstream call, sent as `/flags?v=2`
/// with the client's address; the calls it made. Calls are told apart by distinct id,
/// so requests for different ids may run at once.
fn ask_edge(pair: &Pair, path: &str, body: &Value) -> (Value, Vec<fake::Seen>) {
    let id = &body["distinct_id"];
    let before = pair.fake.seen_for(id).len();
    let answer = ask(&pair.edge, path, body);
    let calls = pair.fake.seen_for(id).split_off(before);
    assert!(
        calls.len() <= 1,
        "{} upstream calls for {body}",
        calls.len()
    );
    for call in &calls {
        assert_eq!(call.path, "/flags/?v=2");
        assert_eq!(call.header("x-forwarded-for"), Some(CLIENT));
    }
    (answer, calls)
}

/// Generated cases, and requests at once: enough for thousands of answers compared.
const CASES: usize = 800;
const CONCURRENCY: usize = 4;

#[test]
#[ignore = "needs python3 (tests/sdk/differential/generate.py): run by .ci/run, cargo test -- --include-ignored"]
fn the_edge_answers_as_upstream_for_generated_flags_and_requests() {
    let out = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/differential/generate.py");
    let status = Command::new("python3")
        .arg(&script)
        .args(["11", "50", &CASES.to_string()])
        .arg(out.path())
        .stdout(std::process::Stdio::null())
        .status()
        .expect("python3 runs the generator");
    assert!(status.success());
    let read = |name: &str| -> Value {
        serde_json::from_slice(&std::fs::read(out.path().join(name)).unwrap()).unwrap()
    };
    let definitions = read("definitions.json");
    let keys: Vec<Value> = definitions["flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["key"].clone())
        .collect();
    let cases = read("cases.json");
    let cases = cases.as_array().unwrap();
    let pair = pair_with(&definitions, PARITY_BUDGET_MS);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let counts = std::sync::Mutex::new((0, 0));
    std::thread::scope(|scope| {
        for _ in 0..CONCURRENCY {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(case) = cases.get(i) else { break };
                let mut every = case.clone();
                every["token"] = json!(KEY_ONE);
                // The same request naming one flag, as a server SDK asks.
                let mut one = every.clone();
                one["flag_keys"] = json!([keys[i % keys.len()]]);
                for body in [&every, &one] {
                    for path in ["/flags/?v=2", "/decide/?v=3"] {
                        let (edge, calls) = ask_edge(&pair, path, body);
                        assert_eq!(edge, ask(&pair.upstream, path, body), "{path} {body}");
                        let mut counts = counts.lock().unwrap();
                        match calls.is_empty() {
                            true => counts.0 += 1,
                            false => counts.1 += 1,
                        }
                    }
                }
            });
        }
    });
    let (local, upstream) = counts.into_inner().unwrap();
    eprintln!("{local} answered locally, {upstream} with one upstream call");
    assert_eq!(local + upstream, CASES * 4);
    assert!(
        local > 0 && upstream > 0,
        "{local} local, {upstream} upstream"
    );
}

fn person_flag(id: i64, key: &str, operator: &str, value: Value) -> Value {
    json!({"id": id, "key": key, "active": true, "version": 1, "filters": {"groups": [{"properties": [
        {"key": "email", "type": "person", "operator": operator, "value": value}
    ], "rollout_percentage": 100}]}})
}

fn class_rules() -> Value {
    json!({"group_type_mapping": {"0": "company"}, "cohorts": {}, "flags": [
        person_flag(1, "email-flag", "icontains", json!("@corp")),
        person_flag(2, "unset-flag", "is_not_set", json!("is_not_set")),
        {"id": 3, "key": "static-flag", "active": true, "version": 1, "filters": {"groups": [
            {"properties": [{"key": "id", "type": "cohort", "value": 99}], "rollout_percentage": 100}]}},
        {"id": 4, "key": "continuity-flag", "active": true, "version": 1,
         "ensure_experience_continuity": true,
         "filters": {"groups": [{"properties": [], "rollout_percentage": 50}]}},
        {"id": 5, "key": "rollout", "active": true, "version": 1,
         "filters": {"groups": [{"properties": [], "rollout_percentage": 40}],
                     "payloads": {"true": "{\"tier\": 2}"}}},
        {"id": 6, "key": "depends", "active": true, "version": 1, "filters": {"groups": [
            {"properties": [{"key": "email-flag", "type": "flag", "operator": "flag_evaluates_to", "value": true}],
             "rollout_percentage": 100}]}}
    ]})
}

/// An edge and upstream on [`class_rules`], with a person upstream stores and the edge
/// does not: upstream's answers for it differ from what the edge would guess.
fn class_pair() -> Pair {
    let pair = pair(&class_rules());
    let batch = json!({"api_key": KEY_ONE, "batch": [
        {"event": "$identify", "properties": {"distinct_id": "stored", "$set": {"email": "ada@corp.com"}}}
    ]});
    assert_eq!(pair.upstream.post("/batch/", batch.to_string()).status, 200);
    wait_for("upstream to store the person", || {
        let body = json!({"token": KEY_ONE, "distinct_id": "stored", "flag_keys": ["email-flag"]});
        let answer = ask(&pair.upstream, "/flags/?v=2", &body);
        (answer["flags"]["email-flag"]["enabled"] == true).then_some(())
    });
    pair
}

#[test]
fn each_class_the_edge_cannot_decide_goes_upstream_in_one_call() {
    let pair = class_pair();
    let request = |keys: &[&str], extra: Value| {
        let mut body = json!({"token": KEY_ONE, "distinct_id": "stored", "flag_keys": keys});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    // (flag keys, extra members, the flag_keys expected upstream; empty: no call)
    let cases: &[(&[&str], Value, &[&str])] = &[
        (&["rollout"], json!({}), &[]),
        (
            &["email-flag"],
            json!({"person_properties": {"email": "bob@corp.com"}}),
            &[],
        ),
        (&["email-flag"], json!({}), &["email-flag"]),
        (&["unset-flag"], json!({}), &["unset-flag"]),
        (&["static-flag"], json!({}), &["static-flag"]),
        (
            &["continuity-flag"],
            json!({"$anon_distinct_id": "anon-1"}),
            &["continuity-flag"],
        ),
        (&["depends"], json!({}), &["depends"]),
        (&["not-in-the-rules"], json!({}), &["not-in-the-rules"]),
        (
            &[
                "rollout",
                "email-flag",
                "unset-flag",
                "static-flag",
                "continuity-flag",
                "depends",
                "not-in-the-rules",
            ],
            json!({"$anon_distinct_id": "anon-1"}),
            &[
                "continuity-flag",
                "depends",
                "email-flag",
                "not-in-the-rules",
                "static-flag",
                "unset-flag",
            ],
        ),
    ];
    for (keys, extra, expected) in cases {
        let body = request(keys, extra.clone());
        for path in ["/flags/?v=2", "/decide/?v=3"] {
            let (edge, calls) = ask_edge(&pair, path, &body);
            match expected.is_empty() {
                true => assert!(calls.is_empty(), "{path} {body}: {calls:?}"),
                false => {
                    assert_eq!(calls.len(), 1, "{path} {body}");
                    assert_eq!(calls[0].flag_keys().unwrap(), *expected, "{path} {body}");
                }
            }
            assert_eq!(edge, ask(&pair.upstream, path, &body), "{path} {body}");
        }
    }
    // Upstream's stored person wins over what the edge would have answered alone.
    let body = request(&["email-flag", "unset-flag"], json!({}));
    let (edge, _) = ask_edge(&pair, "/flags/?v=2", &body);
    assert_eq!(edge["flags"]["email-flag"]["enabled"], true);
    assert_eq!(edge["flags"]["unset-flag"]["enabled"], false);
}

#[test]
fn a_request_for_every_flag_learns_what_upstream_has_beyond_the_rules() {
    let pair = class_pair();
    // Upstream has a flag the edge's rules lack, as a survey-targeting flag is left out
    // of PostHog's definitions feed.
    let mut upstream_rules = class_rules();
    upstream_rules["flags"].as_array_mut().unwrap().push(json!(
        {"id": 7, "key": "survey-targeting", "active": true, "version": 1,
         "filters": {"groups": [{"properties": [], "rollout_percentage": 100}]}}));
    load(&pair.upstream, &upstream_rules);
    let body = json!({"token": KEY_ONE, "distinct_id": "stored",
                      "person_properties": {"email": "bob@corp.com"}});
    // The first asks for every flag; the next only for the one beyond the rules and
    // those the edge cannot decide.
    let (first, calls) = ask_edge(&pair, "/flags/?v=2", &body);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].flag_keys(), None);
    assert_eq!(first, ask(&pair.upstream, "/flags/?v=2", &body));
    for path in ["/flags/?v=2", "/decide/?v=3", "/decide/?v=2"] {
        let (edge, calls) = ask_edge(&pair, path, &body);
        assert_eq!(calls.len(), 1, "{path}");
        assert_eq!(
            calls[0].flag_keys().unwrap(),
            ["continuity-flag", "static-flag", "survey-targeting"]
        );
        assert_eq!(edge, ask(&pair.upstream, path, &body), "{path}");
    }
}

#[test]
fn a_slow_or_failing_upstream_leaves_the_local_answer_with_errors() {
    let pair = class_pair();
    let body = json!({"token": KEY_ONE, "distinct_id": "stored",
                      "flag_keys": ["rollout", "email-flag", "depends"]});
    let direct = ask(&pair.upstream, "/flags/?v=2", &body);
    for mode in [
        Mode::Slow(std::time::Duration::from_secs(3)),
        Mode::Status(503),
    ] {
        pair.fake.set(mode);
        let (edge, calls) = ask_edge(&pair, "/flags/?v=2", &body);
        assert_eq!(calls.len(), 1, "{mode:?}");
        assert_eq!(edge["errorsWhileComputingFlags"], true, "{mode:?}");
        // The conclusive flag stands as upstream would answer it; the others are
        // left out, so clients keep what they had.
        assert_eq!(edge["flags"]["rollout"], direct["flags"]["rollout"]);
        let keys: Vec<&String> = edge["flags"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["rollout"], "{mode:?}");
        let v3 = ask_edge(&pair, "/decide/?v=3", &body).0;
        assert_eq!(v3["errorsWhileComputingFlags"], true);
        assert_eq!(v3["featureFlags"].as_object().unwrap().len(), 1);
    }
    let metrics = pair.edge.get("/metrics").text();
    for status in ["timeout", "503"] {
        let line =
            format!("flagpost_upstream_requests_total{{endpoint=\"flags\",status=\"{status}\"}}");
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
    pair.fake.set(Mode::Forward);
    let (edge, _) = ask_edge(&pair, "/flags/?v=2", &body);
    assert_eq!(edge, direct);
    assert!(pair
        .edge
        .get("/metrics")
        .text()
        .contains("flagpost_upstream_requests_total{endpoint=\"flags\",status=\"200\"}"));
}
