//! The differential test of issue 20: random but realistic definitions and requests,
//! evaluated by flagpost's `/flags?v=2` and by the local evaluators of posthog-python 7
//! and posthog-node 5 on the same input, with every clock (flagpost's and each SDK's)
//! pinned to the same instant, month ends and a leap day among them. Every flag an SDK
//! decides must have the same value and payload in flagpost, except where flagpost
//! follows PostHog's flags service against the SDKs (`differential/compare.py` lists
//! those choices; docs/flags.md explains them). The generator is seeded, so a run is
//! reproducible; a disagreement prints the flag, what it depends on, the request and
//! the clock. Cases that once disagreed are kept in `differential/regressions.json`
//! and checked on every run without the SDKs.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use flagpost::flags::Context;
use serde_json::{json, Map, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::{require, run, sdk_dir};
use crate::util::*;

/// Flags per generated file and requests per round: with the rounds below, some 11,000
/// evaluations per SDK, in well under a minute.
const FLAGS: usize = 50;
const CASES: usize = 60;

/// (seed, the instant every clock is pinned to). Month ends and a leap day, where
/// calendar arithmetic on relative dates differs most between implementations.
const ROUNDS: &[(u64, &str)] = &[
    (1, "2024-03-31T10:00:00Z"),
    (2, "2023-03-31T23:30:00Z"),
    (3, "2024-02-29T12:00:00Z"),
    (4, "2024-12-31T00:00:00Z"),
];

/// Requests sent to flagpost at once.
const CONCURRENCY: usize = 4;

fn python() -> PathBuf {
    sdk_dir().join(".deps/py7/bin/python")
}

fn node_sdk() -> PathBuf {
    sdk_dir().join("node/node_modules/posthog-node")
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn flagpost_agrees_with_the_sdks_local_evaluation() {
    let python = python();
    require("posthog-python 7.x", &[&python]);
    require("posthog-node 5.x", &[&node_sdk()]);
    let mut totals = json!({});
    let mut found = Vec::new();
    // Exploring beyond CI's fixed seeds: FLAGPOST_DIFF_SEED_BASE shifts every seed.
    let base: u64 = std::env::var("FLAGPOST_DIFF_SEED_BASE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    for &(seed, now) in ROUNDS {
        let seed = seed + base;
        let (summary, disagreements) = round(&python, seed, now);
        let _ = writeln!(
            std::io::stderr(),
            "differential round seed={seed} now={now}: {summary}"
        );
        found.extend(disagreements);
        for sdk in ["python", "node"] {
            for (name, count) in summary[sdk].as_object().into_iter().flatten() {
                let total = totals[sdk][name].as_u64().unwrap_or(0);
                totals[sdk][name] = json!(total + count.as_u64().unwrap_or(0));
            }
        }
    }
    // Written past the test harness's capture, so CI shows the counts of a green run.
    let _ = writeln!(std::io::stderr(), "differential totals: {totals}");
    assert!(
        found.is_empty(),
        "flagpost and an SDK disagree ({totals}); each with a reproducer:\n{}",
        serde_json::to_string_pretty(&found).unwrap_or_default()
    );
    for sdk in ["python", "node"] {
        assert_eq!(totals[sdk]["disagreements"], 0, "{totals}");
        let evaluations = totals[sdk]["evaluations"].as_u64().unwrap_or(0);
        assert!(
            evaluations >= 5_000,
            "{sdk}: only {evaluations} evaluations"
        );
    }
}

/// One seed at one instant: a fresh server, generated files, every answer compared.
/// Returns the counts and the disagreements.
fn round(python: &Path, seed: u64, now: &str) -> (Value, Vec<Value>) {
    let server = Server::start_env(&[], &[("FLAGPOST_TEST_NOW", now.as_ref())]);
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().to_str().expect("a UTF-8 temp path").to_owned();
    let out = out.as_str();
    let (flags, cases) = (FLAGS.to_string(), CASES.to_string());
    let generator = &[
        "differential/generate.py",
        &seed.to_string(),
        &flags,
        &cases,
        out,
    ];
    run(python, generator);
    let definitions = std::fs::read_to_string(dir.path().join("definitions.json")).unwrap();
    std::fs::write(server.data().join("flags/1.json"), &definitions).unwrap();
    server.sighup();
    let feed = format!("/flags/definitions?token={KEY_ONE}");
    wait_for("the generated flags to load", || {
        let body = server.api(&feed, PERSONAL_ONE).json();
        (body["flags"].as_array().map(Vec::len) == Some(FLAGS)).then_some(())
    });
    let requests: Vec<Value> =
        serde_json::from_slice(&std::fs::read(dir.path().join("cases.json")).unwrap()).unwrap();
    let answers = flagpost_answers(&server, &requests);
    std::fs::write(
        dir.path().join("flagpost.json"),
        serde_json::to_vec(&answers).unwrap(),
    )
    .unwrap();
    let host = format!("http://{}", server.addr);
    let cases_file = dir.path().join("cases.json");
    let cases_path = cases_file.to_str().unwrap();
    let python_out = dir.path().join("python.json");
    let node_out = dir.path().join("node.json");
    let evaluate = [
        "differential/evaluate.py",
        &host,
        KEY_ONE,
        PERSONAL_ONE,
        now,
        cases_path,
        python_out.to_str().unwrap(),
    ];
    assert_eq!(run(python, &evaluate)["sdk"], "posthog-python");
    let evaluate = [
        "differential/evaluate.mjs",
        &host,
        KEY_ONE,
        PERSONAL_ONE,
        now,
        cases_path,
        node_out.to_str().unwrap(),
    ];
    assert_eq!(run(Path::new("node"), &evaluate)["sdk"], "posthog-node");
    let summary = run(
        python,
        &["differential/compare.py", out, now, "python", "node"],
    );
    if std::env::var_os("FLAGPOST_DIFF_KEEP").is_some() {
        eprintln!("differential files kept in {}", dir.keep().display());
    }
    let found = std::fs::read(Path::new(out).join("disagreements.json")).unwrap();
    let found: Vec<Value> = serde_json::from_slice(&found).unwrap();
    (summary, found)
}

/// flagpost's `/flags?v=2` body for every request, in order, a few at a time.
fn flagpost_answers(server: &Server, requests: &[Value]) -> Vec<Value> {
    let answers = Mutex::new(vec![Value::Null; requests.len()]);
    let next = Mutex::new(0usize);
    std::thread::scope(|scope| {
        for _ in 0..CONCURRENCY {
            scope.spawn(|| loop {
                let i = {
                    let mut next = next.lock().unwrap();
                    *next += 1;
                    *next - 1
                };
                let Some(request) = requests.get(i) else {
                    break;
                };
                let mut body = request.clone();
                body["token"] = json!(KEY_ONE);
                let r = server.post("/flags/?v=2", body.to_string());
                assert_eq!(r.status, 200, "{}", r.text());
                answers.lock().unwrap()[i] = r.json();
            });
        }
    });
    answers.into_inner().unwrap()
}

/// Every case that once disagreed, with the answer its source gave (posthog-python's
/// local evaluation, or PostHog's flags service where no SDK decides), evaluated by the
/// library at the vector's clock. Needs no SDK, so it runs everywhere.
#[test]
fn regression_vectors_keep_their_answers() {
    let path = sdk_dir().join("differential/regressions.json");
    let vectors: Vec<Value> = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert!(vectors.len() >= 20, "{} vectors", vectors.len());
    for vector in &vectors {
        let name = vector["name"].as_str().unwrap();
        let rules = flagpost::flags::ProjectRules::from_value(vector["definitions"].clone())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let request = &vector["request"];
        let object = |v: &Value| v.as_object().cloned().unwrap_or_default();
        let person = object(&request["person_properties"]);
        let groups = object(&request["groups"]);
        let group_properties: HashMap<String, Option<Map<String, Value>>> =
            object(&request["group_properties"])
                .into_iter()
                .map(|(name, props)| (name, Some(object(&props))))
                .collect();
        let now = OffsetDateTime::parse(vector["now"].as_str().unwrap(), &Rfc3339).unwrap();
        let ctx = Context {
            distinct_id: request["distinct_id"].as_str().unwrap(),
            anon_distinct_id: None,
            hash_key_override: None,
            person_properties: Some(&person),
            groups: &groups,
            group_properties: &group_properties,
            now,
        };
        let eval = rules.evaluate(&ctx);
        let key = vector["flag"].as_str().unwrap();
        let flag = eval
            .flags
            .iter()
            .find(|f| f.key == key)
            .unwrap_or_else(|| panic!("{name}: {key} left out: {eval:?}"));
        assert_eq!(
            flag.value(),
            vector["value"],
            "{name} ({})",
            vector["cause"]
        );
        if let Some([code, index]) = vector["reason"].as_array().map(Vec::as_slice) {
            assert_eq!(flag.reason.code.as_str(), code, "{name}");
            assert_eq!(
                flag.reason.condition_index.map(|i| i as u64),
                index.as_u64(),
                "{name}"
            );
        }
    }
}
