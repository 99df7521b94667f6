//! The official client libraries, unchanged, against the real binary on loopback:
//! posthog-python 3.x and 7.x, posthog-node 4.x and 5.x, and posthog-js in headless
//! Chromium, as `tests/sdk/install.sh` installs them. Each client script does what an
//! app does (capture, identify, alias, groups, flags remotely and locally) and prints
//! every request it made, with the events in it, and the flag values it got. The read
//! API must then show exactly those events, with the persons and groups they imply.
//!
//! Without the installed dependencies these tests say so and pass, unless `CI` is set:
//! then they fail.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::*;

/// A client script may run this long before it is killed and the test fails.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

fn sdk_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk")
}

/// Flags with exact answers for anyone: 0 and 100 % rollouts, one variant at 100 %.
fn rules() -> Value {
    json!({
        "flags": [
            {"id": 1, "key": "always-on", "active": true, "version": 1,
             "filters": {"groups": [{"properties": [], "rollout_percentage": 100}],
                         "payloads": {"true": "{\"tier\": 1}"}}},
            {"id": 2, "key": "never", "active": true,
             "filters": {"groups": [{"properties": [], "rollout_percentage": 0}]}},
            {"id": 3, "key": "pro-only", "active": true,
             "filters": {"groups": [{"properties": [{"key": "plan", "value": ["pro"], "operator": "exact", "type": "person"}],
                                     "rollout_percentage": 100}]}},
            {"id": 4, "key": "checkout", "active": true,
             "filters": {"groups": [{"properties": [], "rollout_percentage": 100}],
                         "multivariate": {"variants": [{"key": "control", "rollout_percentage": 0},
                                                       {"key": "test", "rollout_percentage": 100}]},
                         "payloads": {"test": "{\"color\": \"green\"}"}}},
            {"id": 5, "key": "big-orgs", "active": true,
             "filters": {"aggregation_group_type_index": 0,
                         "groups": [{"properties": [{"key": "seats", "value": 10, "operator": "gt", "type": "group", "group_type_index": 0}],
                                     "rollout_percentage": 100}]}}
        ],
        "group_type_mapping": {"0": "company"},
        "cohorts": {}
    })
}

/// Whether the installed dependencies are there. Without them a developer's plain
/// `cargo test` skips with a message; CI fails.
fn installed(what: &str, paths: &[&Path]) -> bool {
    let missing: Vec<&&Path> = paths.iter().filter(|p| !p.exists()).collect();
    if missing.is_empty() {
        return true;
    }
    let message = format!(
        "the {what} SDK test needs {missing:?}: run tests/sdk/install.sh (Debian's chromium, \
         Python venvs, npm packages)"
    );
    assert!(std::env::var_os("CI").is_none(), "{message}");
    eprintln!("skipped: {message}");
    false
}

fn start() -> Server {
    let server = Server::start();
    std::fs::write(server.data().join("flags/1.json"), rules().to_string()).unwrap();
    server.sighup();
    wait_for("the flags to load", || {
        let body = json!({"token": KEY_ONE, "distinct_id": "x"}).to_string();
        let r = server.post("/decide/?v=3", body);
        r.json()["featureFlags"].get("checkout").map(|_| ())
    });
    server
}

/// Run a client script under a deadline; the last line of its stdout is its summary.
fn run(program: &Path, args: &[&str]) -> Value {
    let mut command = Command::new(program);
    command
        .args(args)
        .current_dir(sdk_dir())
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Loopback only: no proxy may stand between a client and the server.
    for var in [
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
    ] {
        command.env_remove(var);
    }
    let started = Instant::now();
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > CLIENT_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{} {args:?} timed out:\n{}",
                program.display(),
                stderr.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (stdout.join().unwrap(), stderr.join().unwrap());
    assert!(
        status.success(),
        "{} {args:?} failed ({status}):\n{err}",
        program.display()
    );
    eprintln!(
        "{} {args:?}: {:.1}s",
        program.display(),
        started.elapsed().as_secs_f64()
    );
    let last = out.lines().last().unwrap_or("");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("no JSON summary ({e}):\n{out}\n{err}"))
}

fn array(v: &Value) -> &Vec<Value> {
    v.as_array().unwrap_or_else(|| panic!("not an array: {v}"))
}

/// Every request went to the test server and was answered 200; returns each as
/// "METHOD /path?query".
fn requests_made(server: &Server, requests: &[Value]) -> Vec<String> {
    let base = format!("http://{}", server.addr);
    requests
        .iter()
        .map(|r| {
            let url = r["url"].as_str().unwrap();
            let local = url
                .strip_prefix(&base)
                .unwrap_or_else(|| panic!("a request off the test server: {url}"));
            assert_eq!(r["status"], 200, "{r}");
            format!("{} {local}", r["method"].as_str().unwrap())
        })
        .collect()
}

/// What the server stores is exactly what went over the wire: every event sent is
/// stored once (by its uuid when the client set one), and nothing else is.
fn stored_exactly_what_was_sent(server: &Server, requests: &[Value]) -> Vec<Value> {
    let sent: Vec<&Value> = requests.iter().flat_map(|r| array(&r["events"])).collect();
    assert!(!sent.is_empty());
    // Every request was answered, so a marker captured now is compacted after them.
    let stored = server.settle(1);
    let names = |events: &mut dyn Iterator<Item = &Value>| {
        let mut v: Vec<(String, String)> = events
            .map(|e| (e["event"].to_string(), e["distinct_id"].to_string()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        names(&mut stored.iter()),
        names(&mut sent.iter().copied()),
        "stored events (name, distinct id) differ from those sent"
    );
    for uuid in sent.iter().filter_map(|e| e["uuid"].as_str()) {
        let n = stored.iter().filter(|e| e["id"] == uuid).count();
        assert_eq!(n, 1, "event {uuid} stored {n} times");
    }
    // Each client's timestamps (and sent_at) were read: every event happened just now.
    let now = time::OffsetDateTime::now_utc();
    for e in &stored {
        let at = e["timestamp"].as_str().unwrap();
        let at = time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
            .unwrap_or_else(|err| panic!("{at}: {err}"));
        assert!((now - at).abs() < time::Duration::minutes(5), "{e}");
    }
    stored
}

fn event<'a>(stored: &'a [Value], id: &Value) -> &'a Value {
    stored
        .iter()
        .find(|e| e["id"] == *id)
        .unwrap_or_else(|| panic!("no stored event {id}"))
}

/// Names of the events besides `$feature_flag_called`, sorted; those must each name
/// one of the flags, with a value the rules can give.
fn app_events(stored: &[Value]) -> Vec<&str> {
    let mut names = Vec::new();
    let mut flag_calls = 0;
    for e in stored {
        let name = e["event"].as_str().unwrap();
        if name != "$feature_flag_called" {
            names.push(name);
            continue;
        }
        flag_calls += 1;
        let (flag, value) = (
            &e["properties"]["$feature_flag"],
            &e["properties"]["$feature_flag_response"],
        );
        let possible = match flag.as_str() {
            Some("always-on") => *value == true,
            Some("never") => *value == false,
            Some("checkout") => *value == "test",
            Some("pro-only" | "big-orgs") => value.is_boolean(),
            _ => panic!("a flag that does not exist: {e}"),
        };
        // Payload lookups of posthog-python 3 and posthog-node 4 report the flag
        // without a value (null or absent) when they did not evaluate it themselves.
        let possible = possible || value.is_null();
        assert!(possible, "{flag} = {value} in {e}");
    }
    assert!(flag_calls > 0, "no $feature_flag_called events");
    names.sort();
    names
}

/// The person the anonymous id was merged into: both ids, and the properties set.
fn merged_person(server: &Server, anon: &str, user: &str) -> Value {
    let r = server.api(
        &format!("/api/projects/1/persons/?distinct_id={}", urlencode(anon)),
        PERSONAL_ONE,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let person = r.json()["results"][0].clone();
    let mut ids: Vec<&str> = array(&person["distinct_ids"])
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    ids.sort();
    let mut want = [anon, user];
    want.sort();
    assert_eq!(ids, want, "{person}");
    let props = &person["properties"];
    assert_eq!(
        (&props["plan"], &props["email"]),
        (&json!("pro"), &json!(format!("{user}@example.com"))),
        "{person}"
    );
    person
}

fn group_properties(server: &Server, key: &str) -> Value {
    let r = server.api(
        &format!("/api/projects/1/groups/?group_type_index=0&group_key={key}"),
        PERSONAL_ONE,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["group_properties"].clone()
}

/// What a server-side client is expected to do.
struct Expect {
    /// Every request it makes, as "METHOD /path?query".
    requests: &'static [&'static str],
    /// The `Content-Encoding` of its batches.
    encodings: &'static [Option<&'static str>],
    /// Its events besides `$feature_flag_called`, sorted by name.
    events: &'static [&'static str],
    /// Payloads as this version returns them: parsed, or the JSON text as stored.
    parses_payloads: bool,
}

fn server_side(summary: &Value, server: &Server, prefix: &str, expect: Expect) {
    let (user, anon) = (format!("{prefix}-user"), format!("{prefix}-anon"));
    let requests = array(&summary["requests"]);
    let made: BTreeSet<String> = requests_made(server, requests).into_iter().collect();
    assert_eq!(
        made,
        expect.requests.iter().map(|s| s.to_string()).collect(),
        "requests"
    );
    let encodings: BTreeSet<Option<&str>> = requests
        .iter()
        .filter(|r| r["path"] == "/batch/")
        .map(|r| r["content_encoding"].as_str())
        .collect();
    assert_eq!(encodings, expect.encodings.iter().copied().collect());

    // Flags: remotely with stored person and group properties, then locally.
    let payload = |text: &str| {
        if expect.parses_payloads {
            serde_json::from_str(text).unwrap()
        } else {
            json!(text)
        }
    };
    assert_eq!(
        summary["remote"],
        json!({
            "always-on": true, "never": false, "pro-only": true, "pro-only stranger": false,
            "checkout": "test", "checkout payload": payload("{\"color\": \"green\"}"),
            "always-on payload": payload("{\"tier\": 1}"), "big-orgs": true,
            "all": {"always-on": true, "never": false, "pro-only": true, "checkout": "test", "big-orgs": false}
        }),
        "remote evaluation"
    );
    assert_eq!(
        summary["local"],
        json!({
            "always-on": true, "never": false, "pro-only": true, "pro-only free": false,
            "checkout": "test", "checkout payload": payload("{\"color\": \"green\"}"),
            "big-orgs": true,
            "all": {"always-on": true, "never": false, "pro-only": true, "checkout": "test", "big-orgs": true}
        }),
        "local evaluation"
    );
    let remote_paths = array(&summary["remote_paths"]);
    assert_eq!(
        remote_paths.len(),
        1,
        "one flags endpoint: {remote_paths:?}"
    );
    assert!(
        array(&summary["local_paths"])
            .iter()
            .all(|p| p == "/batch/"),
        "local evaluation asked the server: {}",
        summary["local_paths"]
    );

    // Events, persons, groups.
    let stored = stored_exactly_what_was_sent(server, requests);
    assert_eq!(app_events(&stored), expect.events);
    let ids = &summary["ids"];
    let signed_up = event(&stored, &ids["signed up"]);
    assert_eq!(
        (&signed_up["event"], &signed_up["distinct_id"]),
        (&json!("signed up"), &json!(anon))
    );
    assert_eq!(signed_up["properties"]["step"], 1);
    let company = format!("{prefix}-acme");
    let order = event(&stored, &ids["order placed"]);
    assert_eq!(order["properties"]["$groups"], json!({"company": company}));
    assert_eq!(order["properties"]["amount"], 30);
    assert_eq!(event(&stored, &ids["gzipped"])["properties"]["n"], 2);
    let person = merged_person(server, &anon, &user);
    let props = person["properties"].as_object().unwrap();
    assert_eq!(props.len(), 2, "only what the client set: {person}");
    for e in stored
        .iter()
        .filter(|e| e["distinct_id"] == user.as_str() || e["distinct_id"] == anon.as_str())
    {
        assert_eq!(e["person_id"], person["id"], "{e}");
    }
    assert_eq!(
        group_properties(server, &company),
        json!({"seats": 50, "name": "Acme"})
    );
}

fn python(line: u8, expect: Expect) {
    let python = sdk_dir().join(format!(".deps/py{line}/bin/python"));
    if !installed(&format!("posthog-python {line}.x"), &[&python]) {
        return;
    }
    let server = start();
    let host = format!("http://{}", server.addr);
    let prefix = format!("py{line}");
    let summary = run(
        &python,
        &["python/client.py", &host, KEY_ONE, PERSONAL_ONE, &prefix],
    );
    assert_eq!(summary["sdk"], "posthog-python");
    eprintln!("posthog-python {}", summary["version"]);
    server_side(&summary, &server, &prefix, expect);
}

fn node(package: &str, expect: Expect) {
    let dir = sdk_dir().join("node/node_modules").join(package);
    if !installed(package, &[&dir]) {
        return;
    }
    let server = start();
    let host = format!("http://{}", server.addr);
    let summary = run(
        Path::new("node"),
        &[
            "node/client.mjs",
            package,
            &host,
            KEY_ONE,
            PERSONAL_ONE,
            package,
        ],
    );
    assert_eq!(summary["sdk"], "posthog-node");
    eprintln!("{package} {}", summary["version"]);
    server_side(&summary, &server, package, expect);
}

#[test]
fn posthog_python_3_decide_v3() {
    python(
        3,
        Expect {
            requests: &[
                "GET /api/feature_flag/local_evaluation/?token=phc_test_one&send_cohorts",
                "POST /batch/",
                "POST /decide/?v=3",
            ],
            encodings: &[None, Some("gzip")],
            events: &[
                "$create_alias",
                "$groupidentify",
                "$identify",
                "$set",
                "gzipped",
                "order placed",
                "signed up",
            ],
            parses_payloads: false,
        },
    );
}

#[test]
fn posthog_python_7_flags_v4() {
    python(
        7,
        Expect {
            requests: &[
                "GET /flags/definitions?token=phc_test_one&send_cohorts",
                "POST /batch/",
                "POST /flags/?v=4",
            ],
            encodings: &[None, Some("gzip")],
            events: &[
                "$create_alias",
                "$groupidentify",
                "$set",
                "gzipped",
                "order placed",
                "signed up",
            ],
            parses_payloads: true,
        },
    );
}

#[test]
fn posthog_node_4_decide_v3() {
    node(
        "posthog-node-v4",
        Expect {
            requests: &[
                "GET /api/feature_flag/local_evaluation?token=phc_test_one&send_cohorts",
                "POST /batch/",
                "POST /decide/?v=3",
            ],
            // posthog-node 4 never compresses.
            encodings: &[None],
            events: &[
                "$create_alias",
                "$groupidentify",
                "$identify",
                "gzipped",
                "order placed",
                "signed up",
            ],
            parses_payloads: true,
        },
    );
}

#[test]
fn posthog_node_5_flags_v2() {
    node(
        "posthog-node",
        Expect {
            requests: &[
                "GET /flags/definitions?token=phc_test_one&send_cohorts",
                "POST /batch/",
                "POST /flags/?v=2",
            ],
            encodings: &[None, Some("gzip")],
            events: &[
                "$create_alias",
                "$groupidentify",
                "$identify",
                "gzipped",
                "order placed",
                "signed up",
            ],
            parses_payloads: true,
        },
    );
}

#[test]
fn posthog_js_in_chromium() {
    let modules = sdk_dir().join("node/node_modules");
    let deps = [
        Path::new("/usr/bin/chromium"),
        &modules.join("playwright-core"),
        &modules.join("posthog-js"),
    ];
    if !installed("posthog-js", &deps) {
        return;
    }
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
    // JSON, and base64 only where a beacon needs a CORS-simple body.
    let visits = [
        (
            "gzip",
            vec![config.as_str(), "POST /e/ gzip", "POST /flags/?v=2 gzip"],
        ),
        (
            "base64",
            vec![
                config.as_str(),
                "POST /e/ json",
                "POST /e/?compression=base64 base64",
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
            .map(|(made, r)| format!("{made} {}", r["body"].as_str().unwrap()))
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
        assert_eq!(
            visit["flags"],
            json!({"always-on": true, "never": false, "pro-only": true, "checkout": "test",
                   "checkout payload": {"color": "green"}, "big-orgs": true}),
            "{mode}"
        );
        all_requests.extend(requests.iter().cloned());
    }

    let stored = stored_exactly_what_was_sent(&server, &all_requests);
    let mut names = [
        "$groupidentify",
        "$identify",
        "$pageview",
        "beacon",
        "clicked buy",
        "done",
    ]
    .repeat(2);
    names.sort();
    assert_eq!(app_events(&stored), names);
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
