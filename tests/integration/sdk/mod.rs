//! The official client libraries, unchanged, against the real binary on loopback:
//! posthog-python 3.x and 7.x, posthog-node 4.x and 5.x (`server_side`), posthog-js
//! in headless Chromium (`browser`), posthog-js-lite in Chromium and Node (`lite`), as
//! `tests/sdk/install.sh` installs them, and posthog-rs in its three builds
//! (`posthog_rs`, built with cargo). Each client script does what an app does
//! (capture, identify, alias, groups, flags) and prints every request it made, with
//! the events in it, and the flag values it got. The read API must then show exactly
//! those events, with the persons and groups they imply. This module holds what they
//! share: the flags, running a client under a deadline, and the checks on what the
//! server stored.
//!
//! They need what `tests/sdk/install.sh` installs, so each is `#[ignore]`d with that
//! reason: a plain `cargo test` lists them as ignored, and `cargo test --
//! --include-ignored` (what `.ci/run` runs) runs them. Run without the dependencies,
//! they fail and say what is missing; they never pass by skipping.

mod agent_toolkit;
mod browser;
mod differential;
mod lite;
mod node_flags;
mod posthog_rs;
pub mod secret_key;
mod server_side;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::*;

/// A client script may run this long before it is killed and the test fails.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

pub fn sdk_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk")
}

/// Flags with exact answers for anyone: 0 and 100 % rollouts, one variant at 100 %.
pub fn rules() -> Value {
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

/// That the installed dependencies are there, or the test fails here saying what is
/// missing and how to install it: a test that cannot run fails rather than passes.
pub fn require(what: &str, paths: &[&Path]) {
    let missing: Vec<&&Path> = paths.iter().filter(|p| !p.exists()).collect();
    assert!(
        missing.is_empty(),
        "the {what} SDK test needs {missing:?}: run tests/sdk/install.sh (Debian's chromium, \
         Python venvs, npm packages)"
    );
}

pub fn start() -> Server {
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
pub fn run(program: &Path, args: &[&str]) -> Value {
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

pub fn array(v: &Value) -> &Vec<Value> {
    v.as_array().unwrap_or_else(|| panic!("not an array: {v}"))
}

/// Every request went to the test server and was answered 200; returns each as
/// "METHOD /path?query".
pub fn requests_made(server: &Server, requests: &[Value]) -> Vec<String> {
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
pub fn stored_exactly_what_was_sent(server: &Server, requests: &[Value]) -> Vec<Value> {
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

pub fn event<'a>(stored: &'a [Value], id: &Value) -> &'a Value {
    stored
        .iter()
        .find(|e| e["id"] == *id)
        .unwrap_or_else(|| panic!("no stored event {id}"))
}

/// Names of the events besides `$feature_flag_called`, sorted; those must each name
/// one of the flags, with a value the rules can give. `valueless` names the flags this
/// client reports without a value (null or absent): posthog-python 3 and posthog-node
/// 4 do so for the flags whose payload they looked up without evaluating them; every
/// other call must carry the flag's value.
pub fn app_events<'a>(stored: &'a [Value], valueless: &[&str]) -> Vec<&'a str> {
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
        let unvalued = flag.as_str().is_some_and(|f| valueless.contains(&f));
        let possible = possible || (unvalued && value.is_null());
        assert!(possible, "{flag} = {value} in {e}");
    }
    assert!(flag_calls > 0, "no $feature_flag_called events");
    names.sort();
    names
}

/// The person the anonymous id was merged into: both ids, and the properties set.
pub fn merged_person(server: &Server, anon: &str, user: &str) -> Value {
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

pub fn group_properties(server: &Server, key: &str) -> Value {
    let r = server.api(
        &format!("/api/projects/1/groups/?group_type_index=0&group_key={key}"),
        PERSONAL_ONE,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["group_properties"].clone()
}

/// The flags posthog-js ends each visit of `browser/run.mjs` with, once the visitor is
/// identified as a pro user of Acme (`rules()`).
pub fn js_flags_identified() -> Value {
    json!({"always-on": true, "never": false, "pro-only": true, "checkout": "test",
           "checkout payload": {"color": "green"}, "big-orgs": true})
}

/// The events `browser/run.mjs`'s two visits (gzip and base64) store, sorted by name.
pub fn js_events_stored() -> Vec<&'static str> {
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
    names
}
