//! The limits that stop abuse of the management API, and personal keys kept hashed.

use std::io::Write;
use std::net::TcpStream;

use serde_json::{json, Value};

use super::{call, FLAGS};
use crate::util::*;

#[test]
fn a_body_over_20_mb_is_refused_from_its_length() {
    let server = Server::start();
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    let head = format!(
        "POST {FLAGS} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {PERSONAL_ONE}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{{",
        20 * 1024 * 1024 + 1
    );
    stream.write_all(head.as_bytes()).unwrap();
    // Answered without the body being sent.
    let r = read_response(&mut stream).expect("a response");
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.json()["code"], "payload_too_large");
}

#[test]
fn failed_authentications_are_limited_per_address() {
    let server = Server::start();
    for i in 0..20 {
        let r = call(&server, "GET", FLAGS, &format!("phx_guess_{i}"), None);
        assert_eq!(r.status, 401, "attempt {i}");
    }
    // Out of tries: refused before the key is looked at, the right key included.
    let r = call(&server, "GET", FLAGS, PERSONAL_ONE, None);
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("3"));
    assert_eq!(
        r.json(),
        json!({"type": "throttled_error", "code": "throttled", "attr": null,
               "detail": "Request was throttled. Expected available in 3 seconds."})
    );
    // Another project's key is no failed authentication.
    let server = Server::start();
    for _ in 0..25 {
        assert_eq!(call(&server, "GET", FLAGS, PERSONAL_TWO, None).status, 403);
    }
    assert_eq!(call(&server, "GET", FLAGS, PERSONAL_ONE, None).status, 200);
}

#[test]
fn hashed_keys_authenticate_and_name_the_caller() {
    let tmp = data_dir();
    let key = "phx_kept_only_as_a_hash";
    let hash = flagpost::projects::hash_key(key);
    std::fs::write(
        tmp.path().join("data/projects.json"),
        json!({"projects": [
            {"id": 1, "api_key": KEY_ONE, "personal_api_keys": [{"sha256": hash, "label": "ci"}]},
            {"id": 2, "api_key": KEY_TWO, "personal_api_keys": [PERSONAL_TWO]}
        ]})
        .to_string(),
    )
    .unwrap();
    let mut server = Server::spawn(tmp.path(), &[]);
    server.keep(tmp);
    let r = call(&server, "POST", FLAGS, key, Some(json!({"key": "from-ci"})));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["created_by"]["first_name"], "ci");
    let activity = call(
        &server,
        "GET",
        "/api/projects/1/feature_flags/activity/",
        key,
        None,
    )
    .json();
    assert_eq!(activity["results"][0]["user"]["first_name"], "ci");
    // The read API and the definitions feed take it too; another project's key does not.
    assert_eq!(server.api("/api/projects/1/events/", key).status, 200);
    let feed = server
        .api("/api/feature_flag/local_evaluation/", key)
        .json();
    assert_eq!(feed["flags"][0]["key"], "from-ci");
    assert_eq!(call(&server, "GET", FLAGS, PERSONAL_TWO, None).status, 403);
    assert_eq!(
        call(&server, "GET", "/api/projects/2/feature_flags/", key, None).status,
        403
    );
    assert_eq!(
        call(&server, "GET", FLAGS, &hash, None).status,
        401,
        "the hash is no key"
    );
    let text = std::fs::read_to_string(server.data().join("projects.json")).unwrap();
    assert!(!text.contains(key));
    let flags: Value =
        serde_json::from_str(&std::fs::read_to_string(server.data().join("flags/1.json")).unwrap())
            .unwrap();
    assert_eq!(flags["flags"][0]["created_by"], "ci");
}

#[test]
fn one_failed_authentication_limit_covers_every_endpoint_of_personal_keys() {
    let server = Server::start();
    let paths = [
        "/api/projects/1/events/",
        "/api/feature_flag/local_evaluation/",
        "/flags/definitions",
        "/api/projects/@current/feature_flags/anything/remote_config",
        FLAGS,
    ];
    // Twenty guesses spread over all of them use up one address's tries...
    for i in 0..20 {
        let path = paths[i % paths.len()];
        let r = server.api(path, &format!("phx_guess_{i}"));
        assert_eq!(r.status, 401, "guess {i} on {path}: {}", r.text());
    }
    // ...so every one of them now refuses the address, even with the right key.
    for path in paths {
        let r = server.api(path, PERSONAL_ONE);
        assert_eq!(r.status, 429, "{path}: {}", r.text());
        assert_eq!(r.header("retry-after"), Some("3"), "{path}");
        assert_eq!(r.json()["code"], "throttled", "{path}");
    }
    // A request without any personal key is a failed attempt too, and the endpoints
    // of project keys are not limited by it.
    let fresh = Server::start();
    for i in 0..20 {
        let r = fresh.get("/api/projects/1/persons/");
        assert_eq!(r.status, 401, "attempt {i}");
    }
    assert_eq!(
        fresh
            .api("/api/feature_flag/local_evaluation/", PERSONAL_ONE)
            .status,
        429
    );
    let decide = json!({"api_key": KEY_ONE, "distinct_id": "ada"});
    assert_eq!(fresh.post("/decide/?v=3", decide.to_string()).status, 200);
}
