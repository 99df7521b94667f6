//! The console's sessions and its guard against cross-site requests, over loopback
//! without a browser: sign-in with plain and hashed personal keys, the cookie's
//! attributes, each session kept to its key's project, sign-out, removed keys, the
//! Origin and token checks on every state-changing request, failed sign-ins slowed and
//! limited, and `--console off`.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::*;

/// The util client sends `Host: localhost`, so this is the console's own origin.
const OWN: &str = "http://localhost";

pub(crate) struct Signed {
    pub(crate) cookie: String,
    token: String,
    set_cookie: String,
}

fn sign_in_with(server: &Server, key: &str, extra: &[(&str, &str)]) -> Resp {
    let mut req = Req::post("/console/api/session", json!({"key": key}).to_string())
        .header("Content-Type", "application/json")
        .header("Origin", OWN);
    for (k, v) in extra {
        req = req.header(k, v);
    }
    server.request(req)
}

pub(crate) fn sign_in(server: &Server, key: &str) -> Signed {
    let r = sign_in_with(server, key, &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    let set_cookie = r.header("set-cookie").unwrap().to_owned();
    let cookie = set_cookie.split(';').next().unwrap().to_owned();
    Signed {
        cookie,
        token: r.json()["token"].as_str().unwrap().to_owned(),
        set_cookie,
    }
}

/// A console request with the session's cookie, and the Origin and token when given.
fn call(
    server: &Server,
    s: &Signed,
    method: &str,
    path: &str,
    body: Option<Value>,
    origin: Option<&str>,
    token: Option<&str>,
) -> Resp {
    let mut req = match body {
        Some(b) => Req::post(path, b.to_string()).method(method),
        None => Req::get(path).method(method),
    }
    .header("Cookie", &s.cookie)
    .header("Content-Type", "application/json");
    if let Some(o) = origin {
        req = req.header("Origin", o);
    }
    if let Some(t) = token {
        req = req.header("X-Flagpost-Token", t);
    }
    server.request(req)
}

/// A console request as the console's own page sends it: the session's cookie, its
/// token and the console's origin.
pub(crate) fn signed_call(
    server: &Server,
    s: &Signed,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Resp {
    call(server, s, method, path, body, Some(OWN), Some(&s.token))
}

fn flag_keys(server: &Server, s: &Signed) -> Vec<String> {
    let r = call(
        server,
        s,
        "GET",
        "/console/api/feature_flags/",
        None,
        None,
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["key"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_session_is_a_strict_cookie_kept_to_its_project() {
    let server = Server::start();
    let r = server.get("/console/api/session");
    assert_eq!((r.status, r.json()), (200, json!({"signed_in": false})));
    let one = sign_in(&server, PERSONAL_ONE);
    assert_eq!(
        one.set_cookie,
        format!("{}; Path=/console/; HttpOnly; SameSite=Strict", one.cookie)
    );
    let r = call(
        &server,
        &one,
        "GET",
        "/console/api/session",
        None,
        None,
        None,
    );
    let s = r.json();
    assert_eq!(s["project"], json!({"id": 1, "name": "one"}));
    assert_eq!(
        (s["signed_in_as"].as_str(), s["token"].as_str()),
        (Some("phx_..._one"), Some(one.token.as_str()))
    );
    assert_eq!(s["idle_expiry_seconds"], 1800);
    // Behind nginx on https the cookie only travels encrypted.
    let r = sign_in_with(&server, PERSONAL_ONE, &[("X-Forwarded-Proto", "https")]);
    assert_eq!(
        r.status,
        403,
        "over https, http://localhost is another origin: {}",
        r.text()
    );
    let r = server.request(
        Req::post(
            "/console/api/session",
            json!({"key": PERSONAL_ONE}).to_string(),
        )
        .header("Content-Type", "application/json")
        .header("Origin", "https://localhost")
        .header("X-Forwarded-Proto", "https"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r
        .header("set-cookie")
        .unwrap()
        .ends_with("; HttpOnly; SameSite=Strict; Secure"));

    // A flag made through the console is the management API's: same file, same list.
    let made = call(
        &server,
        &one,
        "POST",
        "/console/api/feature_flags/",
        Some(
            json!({"key": "from-console", "filters": {"groups": [{"properties": [], "rollout_percentage": 100}]}}),
        ),
        Some(OWN),
        Some(&one.token),
    );
    assert_eq!(made.status, 201, "{}", made.text());
    assert_eq!(made.json()["created_by"]["first_name"], "phx_..._one");
    let api = server
        .api("/api/projects/1/feature_flags/", PERSONAL_ONE)
        .json();
    assert_eq!(api["results"][0]["key"], "from-console");
    let file = std::fs::read_to_string(server.data().join("flags/1.json")).unwrap();
    assert!(file.contains("\"from-console\""), "{file}");
    // The management API's validation errors come through as they are.
    let dup = call(
        &server,
        &one,
        "POST",
        "/console/api/feature_flags/",
        Some(json!({"key": "from-console"})),
        Some(OWN),
        Some(&one.token),
    );
    assert_eq!(dup.status, 400);
    assert_eq!(dup.json()["attr"], "key");

    // Project 2's session sees project 2 only.
    let two = sign_in(&server, PERSONAL_TWO);
    assert_eq!(flag_keys(&server, &one), vec!["from-console"]);
    assert_eq!(flag_keys(&server, &two), Vec::<String>::new());
    let id = made.json()["id"].as_i64().unwrap();
    let r = call(
        &server,
        &two,
        "PATCH",
        &format!("/console/api/feature_flags/{id}/"),
        Some(json!({"active": false})),
        Some(OWN),
        Some(&two.token),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(flag_keys(&server, &one), vec!["from-console"]);
    // Another session's token is not this session's.
    let r = call(
        &server,
        &one,
        "PATCH",
        &format!("/console/api/feature_flags/{id}/"),
        Some(json!({"active": false})),
        Some(OWN),
        Some(&two.token),
    );
    assert_eq!(r.status, 403);
}

#[test]
fn state_changes_need_the_own_origin_and_the_token() {
    let server = Server::start();
    let s = sign_in(&server, PERSONAL_ONE);
    let body = || Some(json!({"key": "x"}));
    let path = "/console/api/feature_flags/";
    for (origin, token, why) in [
        (None, Some(s.token.as_str()), "the request has no Origin"),
        (
            Some("http://evil.example"),
            Some(s.token.as_str()),
            "the request comes from another origin",
        ),
        (
            Some("https://localhost"),
            Some(s.token.as_str()),
            "the request comes from another origin",
        ),
        (Some(OWN), None, "the session token header is missing"),
        (Some(OWN), Some("0000"), "the session token does not match"),
    ] {
        let r = call(&server, &s, "POST", path, body(), origin, token);
        assert_eq!(r.status, 403, "{origin:?} {token:?}");
        assert_eq!(r.json()["detail"], why);
        assert_eq!(r.json()["code"], "cross_site");
    }
    let r = call(
        &server,
        &s,
        "DELETE",
        "/console/api/session",
        None,
        Some("http://evil.example"),
        Some(&s.token),
    );
    assert_eq!(r.status, 403, "sign-out is a state change too");
    assert!(flag_keys(&server, &s).is_empty(), "nothing was written");
    assert_eq!(
        call(&server, &s, "POST", path, body(), Some(OWN), Some(&s.token)).status,
        201
    );

    // Sign-in: from another origin, or not as JSON (a form another site could post),
    // is refused before the key is looked at.
    let r = server.request(
        Req::post(
            "/console/api/session",
            json!({"key": PERSONAL_ONE}).to_string(),
        )
        .header("Content-Type", "application/json")
        .header("Origin", "http://evil.example"),
    );
    assert_eq!(r.status, 403);
    let r = server.request(
        Req::post("/console/api/session", format!("key={PERSONAL_ONE}"))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .header("Origin", OWN),
    );
    assert_eq!(r.status, 403);
    // Without the cookie nothing is answered but "sign in".
    for path in [
        "/console/api/feature_flags/",
        "/console/api/events",
        "/console/api/health",
    ] {
        let r = server.get(path);
        assert_eq!(r.status, 401, "{path}");
    }
}

#[test]
fn sign_out_and_removed_keys_end_sessions() {
    let tmp = data_dir();
    let hashed = "phx_kept_only_as_a_hash";
    let projects = |with_hash: bool| {
        let mut keys = vec![json!(PERSONAL_ONE)];
        if with_hash {
            keys.push(
                json!({"sha256": flagpost::projects::hash_key(hashed), "label": "ops laptop"}),
            );
        }
        json!({"projects": [{"id": 1, "name": "one", "api_key": KEY_ONE, "personal_api_keys": keys}]}).to_string()
    };
    std::fs::write(tmp.path().join("data/projects.json"), projects(true)).unwrap();
    let mut server = Server::spawn(tmp.path(), &[]);
    server.keep(tmp);
    let a = sign_in(&server, PERSONAL_ONE);
    let r = call(
        &server,
        &a,
        "DELETE",
        "/console/api/session",
        None,
        Some(OWN),
        Some(&a.token),
    );
    assert_eq!(r.status, 204);
    assert!(r.header("set-cookie").unwrap().ends_with("Max-Age=0"));
    assert_eq!(
        call(
            &server,
            &a,
            "GET",
            "/console/api/feature_flags/",
            None,
            None,
            None
        )
        .status,
        401
    );

    let b = sign_in(&server, hashed);
    let me = call(&server, &b, "GET", "/console/api/session", None, None, None).json();
    assert_eq!(me["signed_in_as"], "ops laptop");
    assert_eq!(
        call(&server, &b, "GET", "/console/api/health", None, None, None).status,
        200
    );
    write_atomically(&server.data().join("projects.json"), projects(false));
    server.sighup();
    wait_for("the hashed key's session to end", || {
        let r = call(&server, &b, "GET", "/console/api/health", None, None, None);
        (r.status == 401).then_some(())
    });
}

#[test]
fn failed_sign_ins_are_slowed_then_refused() {
    let server = Server::start();
    let started = Instant::now();
    let r = sign_in_with(&server, "phx_wrong", &[]);
    assert_eq!(r.status, 401);
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    // A token comes back every 3 s, and the failures take 300 ms each: refused after
    // the burst of 20, plus the one or two earned back meanwhile.
    let mut failed = 1;
    loop {
        let r = sign_in_with(&server, "phx_wrong", &[]);
        if r.status == 429 {
            break;
        }
        assert_eq!(r.status, 401);
        failed += 1;
        assert!(failed <= 23, "never refused");
    }
    assert!((20..=23).contains(&failed), "{failed}");
    let r = sign_in_with(&server, PERSONAL_ONE, &[]);
    assert_eq!(r.status, 429, "even the right key waits: {}", r.text());
    // Seconds until the next token: 3 at most, less as time passes under a busy machine.
    let wait: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=3).contains(&wait), "{wait}");
}

#[test]
fn console_off_is_not_there() {
    let server = Server::start_with(&["--console", "off"]);
    for path in [
        "/console/",
        "/console/assets/console.js",
        "/console/api/session",
    ] {
        assert_eq!(server.get(path).status, 404, "{path}");
    }
    let on = Server::start();
    let page = on.get("/console/");
    assert_eq!(page.status, 200);
    assert!(page.text().contains("<title>flagpost console</title>"));
    assert_eq!(page.header("x-frame-options"), Some("DENY"));
    let r = on.get("/console");
    assert_eq!((r.status, r.header("location")), (308, Some("/console/")));
}
