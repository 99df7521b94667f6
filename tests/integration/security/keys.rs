//! Keys with only the rights they need: project secret keys (`phs_`, made by `flagpost
//! key new --secret`) read the definitions feeds and nothing else; scoped personal keys
//! are refused with PostHog's 403 where a scope is missing; posthog-python 7 and
//! posthog-node 5 configured with a `phs_` key evaluate locally.

use serde_json::{json, Value};

use crate::sdk::secret_key;
use crate::util::*;

const FEEDS: [&str; 2] = [
    "/flags/definitions?token=phc_test_one&send_cohorts",
    "/api/feature_flag/local_evaluation/?token=phc_test_one",
];

/// `flagpost key new` for project 1 of the server's data dir; the key it printed.
pub(super) fn new_key(server: &Server, args: &[&str]) -> String {
    let data = server.data();
    let mut all = vec!["key", "new", "--project", "1", "--data-dir"];
    all.push(data.to_str().unwrap());
    all.extend_from_slice(args);
    let out = flagpost(&all);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let key = text(&out.stdout).trim().to_owned();
    let stored = std::fs::read_to_string(data.join("projects.json")).unwrap();
    assert!(!stored.contains(&key), "only the hash is kept: {stored}");
    key
}

pub(super) fn with_key(
    server: &Server,
    method: &str,
    path: &str,
    key: &str,
    body: Option<Value>,
) -> Resp {
    let req = match body {
        Some(b) => Req::post(path, b.to_string()).method(method),
        None => Req::get(path).method(method),
    };
    server.request(
        req.header("Authorization", &format!("Bearer {key}"))
            .header("Content-Type", "application/json"),
    )
}

/// Waits until the running server has taken a new key from projects.json. Each try
/// before then is a failed attempt of this address, so the tries are spaced out: the
/// server rereads the file within a second, well inside the limit's burst.
pub(super) fn taken(server: &Server, path: &str, key: &str) {
    for _ in 0..10 {
        match with_key(server, "GET", path, key, None).status {
            401 => std::thread::sleep(std::time::Duration::from_millis(500)),
            429 => panic!("the failed-key limit ran out while waiting for the key"),
            _ => return,
        }
    }
    panic!("the server did not take the new key within 5 s");
}

#[test]
fn a_secret_key_reads_the_definitions_feeds_and_nothing_else() {
    let server = Server::start();
    let first = new_key(&server, &["--secret", "--label", "sdk"]);
    assert!(first.starts_with("phs_") && first.len() == 52, "{first}");
    taken(&server, FEEDS[0], &first);
    // The next key, for rotation, works beside the first; a third is refused.
    let next = new_key(&server, &["--secret", "--label", "sdk-next"]);
    taken(&server, FEEDS[0], &next);
    let data = server.data();
    let out = flagpost(&[
        "key",
        "new",
        "--project",
        "1",
        "--secret",
        "--label",
        "third",
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("already has 2 secret keys"),
        "{}",
        text(&out.stderr)
    );

    for key in [&first, &next] {
        for feed in FEEDS {
            let r = with_key(&server, "GET", feed, key, None);
            assert_eq!(r.status, 200, "{feed}: {}", r.text());
            assert!(r.json()["flags"].is_array(), "{feed}");
        }
    }
    // Nothing else takes it: not the read API, the management API, remote config,
    // whoami or the console.
    let denied = json!({"type": "authentication_error", "code": "permission_denied",
        "detail": "a project secret key (phs_) only reads flag definitions: /flags/definitions and /api/feature_flag/local_evaluation",
        "attr": null});
    for (method, path, body) in [
        ("GET", "/api/projects/1/events/", None),
        ("GET", "/api/projects/1/persons/", None),
        ("GET", "/api/projects/1/feature_flags/", None),
        (
            "POST",
            "/api/projects/1/feature_flags/",
            Some(json!({"key": "x"})),
        ),
        (
            "GET",
            "/api/projects/@current/feature_flags/x/remote_config",
            None,
        ),
        ("GET", "/api/users/@me/", None),
    ] {
        let r = with_key(&server, method, path, &first, body);
        assert_eq!(
            (r.status, r.json()),
            (403, denied.clone()),
            "{method} {path}"
        );
    }
    let r = server.request(
        Req::post("/console/api/session", json!({"key": first}).to_string())
            .header("Content-Type", "application/json")
            .header("Origin", "http://localhost"),
    );
    assert_eq!(r.status, 401, "{}", r.text());
    // Another project's feed is not this key's; a made-up secret key is no key.
    let r = with_key(
        &server,
        "GET",
        "/flags/definitions?token=phc_test_two",
        &first,
        None,
    );
    assert_eq!(r.status, 403, "{}", r.text());
    let r = with_key(&server, "GET", FEEDS[0], "phs_made_up", None);
    assert_eq!(r.status, 401, "{}", r.text());
}

#[test]
fn a_scoped_personal_key_is_refused_in_posthogs_words_where_a_scope_is_missing() {
    let server = Server::start();
    let reader = new_key(&server, &["--label", "ro", "--scope", "feature_flag:read"]);
    let flags = "/api/projects/1/feature_flags/";
    taken(&server, flags, &reader);
    assert_eq!(with_key(&server, "GET", flags, &reader, None).status, 200);
    for feed in FEEDS {
        assert_eq!(
            with_key(&server, "GET", feed, &reader, None).status,
            200,
            "{feed}"
        );
    }
    let r = with_key(&server, "POST", flags, &reader, Some(json!({"key": "x"})));
    assert_eq!(
        (r.status, r.json()),
        (
            403,
            json!({"type": "authentication_error", "code": "permission_denied",
                   "detail": "API key missing required scope 'feature_flag:write'", "attr": null})
        )
    );
    let r = with_key(&server, "GET", "/api/projects/1/events/", &reader, None);
    assert_eq!(r.status, 403);
    assert_eq!(
        r.json()["detail"],
        "API key missing required scope 'query:read'"
    );
    let r = with_key(&server, "GET", "/api/projects/1/cohorts/", &reader, None);
    assert_eq!(
        r.json()["detail"],
        "API key missing required scope 'cohort:read'"
    );
    // Write includes read, as PostHog has it; only what is named is granted.
    let writer = new_key(&server, &["--label", "rw", "--scope", "feature_flag:write"]);
    taken(&server, flags, &writer);
    let r = with_key(
        &server,
        "POST",
        flags,
        &writer,
        Some(json!({"key": "made"})),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(with_key(&server, "GET", flags, &writer, None).status, 200);
    let r = with_key(&server, "GET", "/api/projects/1/persons/", &writer, None);
    assert_eq!(
        r.json()["detail"],
        "API key missing required scope 'person:read'"
    );
    // The console holds a session to its key's scopes too.
    let r = server.request(
        Req::post("/console/api/session", json!({"key": reader}).to_string())
            .header("Content-Type", "application/json")
            .header("Origin", "http://localhost"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let cookie = r
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let events = server.request(Req::get("/console/api/events").header("Cookie", &cookie));
    assert_eq!(events.status, 403, "{}", events.text());
    let listed = server.request(Req::get("/console/api/feature_flags/").header("Cookie", &cookie));
    assert_eq!(listed.status, 200, "{}", listed.text());
    // A key without scopes keeps every right; a bad scope is refused before anything
    // is written.
    let r = with_key(
        &server,
        "POST",
        flags,
        PERSONAL_ONE,
        Some(json!({"key": "any"})),
    );
    assert_eq!(r.status, 201);
    let data = server.data();
    let out = flagpost(&[
        "key",
        "new",
        "--project",
        "1",
        "--label",
        "bad",
        "--scope",
        "flags",
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("is not one"),
        "{}",
        text(&out.stderr)
    );
}

/// A server with the rules and a secret key for project 1.
fn with_secret() -> (Server, String) {
    let server = Server::start();
    write_atomically(
        &server.data().join("flags/1.json"),
        secret_key::rules().to_string(),
    );
    server.sighup();
    let secret = new_key(&server, &["--secret", "--label", "sdk"]);
    taken(&server, FEEDS[0], &secret);
    wait_for("the rules", || {
        let r = with_key(&server, "GET", FEEDS[0], &secret, None);
        (r.status == 200 && r.json()["flags"].as_array()?.len() == 4).then_some(())
    });
    (server, secret)
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_python_7_evaluates_locally_with_a_secret_key() {
    let (server, secret) = with_secret();
    let host = format!("http://{}", server.addr);
    secret_key::python_evaluates_locally(&host, KEY_ONE, &secret);
}

#[test]
#[ignore = "needs tests/sdk/install.sh (the SDKs, Chromium): run by .ci/run, cargo test -- --include-ignored"]
fn posthog_node_evaluates_locally_with_a_secret_key() {
    let (server, secret) = with_secret();
    let host = format!("http://{}", server.addr);
    secret_key::node_evaluates_locally(&host, KEY_ONE, &secret);
}
