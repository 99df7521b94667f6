//! posthog-rs 0.30, the official Rust client, unchanged, in its three builds: the
//! default async client, the blocking client (default features off) and the async
//! client with `capture-v1` (`/i/v1/analytics/events`). `tests/sdk/rust` is a small
//! app on it, built here with cargo into `target/sdk-rust` (its own target dir, so
//! the build never waits on the lock of the `cargo test` that runs it). The app
//! talks to the server through a recording pass-through and reports every request,
//! response and event; the server must then answer each flag exactly as the rules
//! say, locally as remotely, let the definitions poller revalidate with its ETag,
//! and store every event exactly once with what it was sent with.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::*;
use crate::util::*;

/// A first build fetches and compiles about 200 crates; on two cores that takes
/// minutes.
const BUILD_TIMEOUT: Duration = Duration::from_secs(20 * 60);

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Build the driver with the feature `build` selects; its path, or the test fails
/// with cargo's output. The three builds share one target dir (and so every
/// dependency but posthog-rs), one at a time: each copies its binary out before the
/// next overwrites it.
fn driver(build: &str) -> PathBuf {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let target = root().join("target/sdk-rust");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut child = Command::new(&cargo)
        .args(["build", "--locked", "--quiet", "--features", build])
        .arg("--manifest-path")
        .arg(sdk_dir().join("rust/Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("the posthog-rs SDK test needs cargo ({cargo:?}): {e}"));
    let mut stderr = child.stderr.take().unwrap();
    let output = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > BUILD_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "building tests/sdk/rust ({build}) timed out:\n{}",
                output.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = output.join().unwrap();
    assert!(
        status.success(),
        "building tests/sdk/rust ({build}) failed ({status}):\n{output}"
    );
    eprintln!(
        "tests/sdk/rust ({build}) built in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let copy = target.join(format!("posthog-rs-driver-{build}"));
    std::fs::copy(target.join("debug/posthog-rs-driver"), &copy).unwrap();
    copy
}

/// Flag values of a snapshot (`evaluate_flags`): payloads come back parsed.
fn snapshot(keys: &[&str]) -> Value {
    let all = json!({
        "always-on": true, "always-on payload": {"tier": 1}, "never": false,
        "pro-only": true, "checkout": "test", "checkout payload": {"color": "green"},
        "big-orgs": true,
    });
    keys.iter()
        .flat_map(|k| [k.to_string(), format!("{k} payload")])
        .filter_map(|k| all.get(&k).map(|v| (k, v.clone())))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

const ALL: &[&str] = &["always-on", "never", "pro-only", "checkout", "big-orgs"];

/// The definitions poller: a first answer with an ETag, then that ETag sent back
/// and answered 304, never a request off that path or with the token in the query.
fn revalidated(requests: &[Value]) {
    let polls: Vec<&Value> = requests
        .iter()
        .filter(|r| r["path"] == "/flags/definitions/")
        .collect();
    assert!(polls.len() >= 3, "initial load and two polls: {polls:?}");
    let first = polls[0];
    assert_eq!(first["status"], 200, "{first}");
    let etag = first["response_headers"]["etag"].clone();
    assert!(etag.is_string(), "no ETag: {first}");
    assert_eq!(first["response"]["flags"].as_array().map(Vec::len), Some(5));
    let revalidation = polls
        .iter()
        .find(|r| r["headers"]["if-none-match"] == etag)
        .unwrap_or_else(|| panic!("the ETag was never sent back: {polls:?}"));
    assert_eq!(revalidation["status"], 304, "{revalidation}");
    assert_eq!(revalidation["response"], Value::Null);
}

fn instant(v: &Value) -> time::OffsetDateTime {
    let s = v.as_str().unwrap_or_else(|| panic!("not a timestamp: {v}"));
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// The events of one request were stored at the times they were sent with, moved by
/// one clock-skew correction (`now + (timestamp - sent_at)`: what the request took to
/// arrive, as the server reads it); returns that shift.
fn shifted_alike(request: &Value, stored: &[Value]) -> time::Duration {
    let shifts: Vec<time::Duration> = array(&request["events"])
        .iter()
        .map(|sent| {
            instant(&event(stored, &sent["uuid"])["timestamp"]) - instant(&sent["timestamp"])
        })
        .collect();
    let (min, max) = (shifts.iter().min().unwrap(), shifts.iter().max().unwrap());
    // Stored timestamps keep milliseconds; the client sends nanoseconds.
    assert!(
        *max - *min < time::Duration::milliseconds(2),
        "events of one request shifted differently ({shifts:?}): {request}"
    );
    assert!(
        *min > -time::Duration::milliseconds(1) && *max < time::Duration::seconds(5),
        "shifted by {min}..{max}: {request}"
    );
    *min
}

/// Every event went in once, with each property it was sent with and the
/// timestamp it was sent with; the person, alias and group it implies are stored.
fn stored(summary: &Value, server: &Server, prefix: &str) {
    let requests = array(&summary["requests"]);
    let stored = stored_exactly_what_was_sent(server, requests);
    assert_eq!(
        app_events(&stored, &[]),
        [
            "$create_alias",
            "$exception",
            "$groupidentify",
            "$set",
            "batch one",
            "batch two",
            "gzipped",
            "order placed",
            "signed up",
        ]
    );
    for sent in requests.iter().flat_map(|r| array(&r["events"])) {
        let got = event(&stored, &sent["uuid"]);
        assert_eq!(
            (&got["event"], &got["distinct_id"]),
            (&sent["event"], &sent["distinct_id"])
        );
        for (k, v) in sent["properties"].as_object().unwrap() {
            assert_eq!(&got["properties"][k], v, "{k} of {sent}\nstored: {got}");
        }
    }
    // Each event names the library: V0 sends `$lib` as properties, V1 in its
    // `PostHog-Sdk-Info` header (`posthog-rs/0.30.0`), which the server reads back.
    for e in &stored {
        let lib = (&e["properties"]["$lib"], &e["properties"]["$lib_version"]);
        assert_eq!(lib, (&json!("posthog-rs"), &json!("0.30.0")), "{e}");
    }
    for request in requests.iter().filter(|r| !array(&r["events"]).is_empty()) {
        shifted_alike(request, &stored);
    }
    let ids = &summary["ids"];
    // The client sent the timestamp given to it, three minutes back.
    let sent = requests
        .iter()
        .flat_map(|r| array(&r["events"]))
        .find(|e| e["uuid"] == ids["signed up"])
        .unwrap();
    let given = instant(&sent["timestamp"]) - instant(&summary["signed_up_at"]);
    assert!(given.abs() < time::Duration::milliseconds(1), "{sent}");
    let (user, anon) = (format!("{prefix}-user"), format!("{prefix}-anon"));
    let person = merged_person(server, &anon, &user);
    let props = person["properties"].as_object().unwrap();
    assert_eq!(props.len(), 2, "only what the client set: {person}");
    for e in stored
        .iter()
        .filter(|e| e["distinct_id"] == user.as_str() || e["distinct_id"] == anon.as_str())
    {
        assert_eq!(e["person_id"], person["id"], "{e}");
    }
    let company = format!("{prefix}-acme");
    let order = event(&stored, &ids["order placed"]);
    assert_eq!(order["properties"]["$groups"], json!({"company": company}));
    // An event with a group is marked for person processing (V1: `options`).
    assert_eq!(
        order["properties"]["$process_person_profile"], true,
        "{order}"
    );
    assert_eq!(
        group_properties(server, &company),
        json!({"seats": 50, "name": "Acme"})
    );
    let exception = stored.iter().find(|e| e["event"] == "$exception").unwrap();
    assert_eq!(exception["distinct_id"], user.as_str());
    assert_eq!(exception["properties"]["route"], "/checkout");
    assert_eq!(
        exception["properties"]["$exception_list"][0]["value"], "checkout failed",
        "{exception}"
    );
}

/// `got` is `want`; else the test fails naming each member that differs.
fn same(got: &Value, want: &Value, what: &str) {
    let (Some(g), Some(w)) = (got.as_object(), want.as_object()) else {
        assert_eq!(got, want, "{what}");
        return;
    };
    let keys: BTreeSet<&String> = g.keys().chain(w.keys()).collect();
    let wrong: Vec<String> = keys
        .into_iter()
        .filter(|k| g.get(*k) != w.get(*k))
        .map(|k| format!("  {k:?}: got {:?}, want {:?}", g.get(k), w.get(k)))
        .collect();
    assert!(wrong.is_empty(), "{what}:\n{}", wrong.join("\n"));
}

fn posthog_rs(build: &str) {
    let driver = driver(build);
    let server = start();
    let host = format!("http://{}", server.addr);
    let prefix = format!("rs-{build}");
    let summary = run(&driver, &[&host, KEY_ONE, PERSONAL_ONE, &prefix]);
    assert_eq!(
        (&summary["sdk"], &summary["version"], &summary["build"]),
        (&json!("posthog-rs"), &json!("0.30.0"), &json!(build))
    );
    let requests = array(&summary["requests"]);

    // What went over the wire, and how the server answered it.
    let base = format!("http://{}", server.addr);
    let made: BTreeSet<String> = requests
        .iter()
        .map(|r| {
            let url = r["url"].as_str().unwrap_or_else(|| panic!("{r}"));
            let local = url.strip_prefix(&base).unwrap();
            let ok = if r["path"] == "/flags/definitions/" {
                r["status"] == 200 || r["status"] == 304
            } else {
                r["status"] == 200
            };
            assert!(
                ok,
                "{} {local} answered {}: {}",
                r["method"], r["status"], r["response"]
            );
            format!("{} {local}", r["method"].as_str().unwrap())
        })
        .collect();
    let capture: &[&str] = if build == "v1" {
        &["POST /i/v1/analytics/events"]
    } else {
        &["POST /batch/", "POST /batch/?compression=gzip"]
    };
    let mut want: BTreeSet<String> = capture.iter().map(|s| s.to_string()).collect();
    want.insert("GET /flags/definitions/?send_cohorts".into());
    want.insert("POST /flags/?v=2".into());
    assert_eq!(made, want, "requests");
    revalidated(requests);
    stored(&summary, &server, &prefix);
    assert_eq!(summary["exception"], Value::Null, "capture_exception_with");

    // Local evaluation: exact, and the same as the server's for the same input.
    same(
        &summary["local"],
        &json!({
            "always-on": true, "never": false, "pro-only": true, "pro-only free": false,
            "checkout": "test", "big-orgs": true, "big-orgs on 5 seats": false,
            "evaluate with properties": snapshot(ALL),
        }),
        "local evaluation",
    );

    // Remote evaluation. The deprecated calls hand back `metadata.payload` as sent:
    // the rules' JSON text; a snapshot parses it.
    let all = json!({"always-on": true, "never": false, "pro-only": true, "checkout": "test", "big-orgs": false});
    same(
        &summary["remote"],
        &json!({
            "pro-only poll": true, "big-orgs poll": true,
            "always-on": true, "never": false, "pro-only": true, "pro-only stranger": false,
            "pro-only stranger on pro": true, "checkout": "test",
            "checkout payload": "{\"color\": \"green\"}",
            "always-on payload": "{\"tier\": 1}", "never payload": null,
            "big-orgs": true, "big-orgs other on 20 seats": true, "big-orgs other on 5 seats": false,
            "all": all,
            "all payloads": {"always-on": "{\"tier\": 1}", "checkout": "{\"color\": \"green\"}"},
            "evaluate": snapshot(ALL),
            "evaluate with properties": snapshot(ALL),
            "evaluate two keys": snapshot(&["always-on", "checkout"]),
        }),
        "remote evaluation",
    );
    assert_eq!(
        summary["local"]["evaluate with properties"],
        summary["remote"]["evaluate with properties"]
    );
    assert_eq!(
        summary["errors"],
        json!([]),
        "the client's on_error reports"
    );
}

#[test]
#[ignore = "needs cargo to build tests/sdk/rust (posthog-rs 0.30 from crates.io): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_rs_0_30_async() {
    posthog_rs("async");
}

#[test]
#[ignore = "needs cargo to build tests/sdk/rust (posthog-rs 0.30 from crates.io): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_rs_0_30_blocking() {
    posthog_rs("blocking");
}

#[test]
#[ignore = "needs cargo to build tests/sdk/rust (posthog-rs 0.30 from crates.io): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_rs_0_30_capture_v1() {
    posthog_rs("v1");
}
