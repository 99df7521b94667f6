//! The console's Origin check against origins that only look like its own: a longer
//! host that starts with it, another port, another scheme, `null` (a sandboxed frame
//! or a file), the origin with a path or user part, a list of two. Each is refused on
//! every state-changing request (sign-in, create, edit, delete, sign-out) with
//! nothing changed, while the exact origin is taken, so an Origin matched by prefix,
//! suffix, substring or without its port fails here.

use serde_json::{json, Value};

use crate::util::*;

/// The util client sends `Host: localhost`, so this is the console's own origin.
const OWN: &str = "http://localhost";

/// Origins a browser on another site (or no site) sends, each close to [`OWN`].
const LOOK_ALIKES: &[&str] = &[
    "http://localhost.evil.example",
    "http://localhostevil.example",
    "http://evil.localhost",
    "http://localhost:8000",
    "http://localhost:80.evil.example",
    "https://localhost",
    "ws://localhost",
    "null",
    "http://localhost/",
    "http://localhost@evil.example",
    "http://evil.example/http://localhost",
    "http://localhost http://evil.example",
    "http://localhost, http://evil.example",
    "",
];

struct Session {
    cookie: String,
    token: String,
}

fn sign_in_from(server: &Server, origin: &str) -> Resp {
    server.request(
        Req::post(
            "/console/api/session",
            json!({"key": PERSONAL_ONE}).to_string(),
        )
        .header("Content-Type", "application/json")
        .header("Origin", origin),
    )
}

fn sign_in(server: &Server) -> Session {
    let r = sign_in_from(server, OWN);
    assert_eq!(r.status, 200, "{}", r.text());
    let cookie = r.header("set-cookie").unwrap().split(';').next().unwrap();
    Session {
        cookie: cookie.to_owned(),
        token: r.json()["token"].as_str().unwrap().to_owned(),
    }
}

fn call(server: &Server, s: &Session, method: &str, path: &str, body: Value, origin: &str) -> Resp {
    server.request(
        Req::post(path, body.to_string())
            .method(method)
            .header("Cookie", &s.cookie)
            .header("Content-Type", "application/json")
            .header("X-Flagpost-Token", &s.token)
            .header("Origin", origin),
    )
}

/// The console's flags as the list shows them: key, active.
fn flags(server: &Server, s: &Session) -> Vec<(String, bool)> {
    let r = server.request(Req::get("/console/api/feature_flags/").header("Cookie", &s.cookie));
    assert_eq!(r.status, 200, "{}", r.text());
    let mut out: Vec<(String, bool)> = r.json()["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let key = f["key"].as_str().unwrap().to_owned();
            (key, f["active"].as_bool().unwrap())
        })
        .collect();
    out.sort();
    out
}

fn assert_cross_site(r: &Resp, what: &str, origin: &str) {
    assert_eq!(r.status, 403, "{what} from {origin:?}: {}", r.text());
    assert_eq!(r.json()["code"], "cross_site", "{what} from {origin:?}");
    assert_eq!(r.header("set-cookie"), None, "{what} from {origin:?}");
}

#[test]
fn sign_in_is_refused_from_every_look_alike_origin() {
    let server = Server::start();
    for origin in LOOK_ALIKES {
        assert_cross_site(&sign_in_from(&server, origin), "sign-in", origin);
    }
    // The exact origin signs in: the refusals above were for the origin alone.
    sign_in(&server);
}

#[test]
fn state_changes_are_refused_from_every_look_alike_origin() {
    let server = Server::start();
    let s = sign_in(&server);
    let created = call(
        &server,
        &s,
        "POST",
        "/console/api/feature_flags/",
        json!({"key": "kept", "active": true}),
        OWN,
    );
    assert_eq!(created.status, 201, "{}", created.text());
    let id = created.json()["id"].as_u64().unwrap();
    let one = format!("/console/api/feature_flags/{id}/");
    let before = flags(&server, &s);
    assert!(before.contains(&("kept".to_owned(), true)), "{before:?}");

    let create = json!({"key": "planted", "active": true});
    for origin in LOOK_ALIKES {
        let attempts: [(&str, &str, Value, &str); 4] = [
            (
                "POST",
                "/console/api/feature_flags/",
                create.clone(),
                "create",
            ),
            ("PATCH", &one, json!({"active": false}), "edit"),
            ("PATCH", &one, json!({"deleted": true}), "delete"),
            ("DELETE", "/console/api/session", json!({}), "sign-out"),
        ];
        for (method, path, body, what) in attempts {
            let r = call(&server, &s, method, path, body, origin);
            assert_cross_site(&r, what, origin);
        }
    }
    assert_eq!(flags(&server, &s), before, "nothing was written");

    // The same requests from the exact origin go through, and the session was still
    // there (the sign-outs above did not end it).
    let r = call(&server, &s, "PATCH", &one, json!({"active": false}), OWN);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(flags(&server, &s).contains(&("kept".to_owned(), false)));
    let r = call(
        &server,
        &s,
        "DELETE",
        "/console/api/session",
        json!({}),
        OWN,
    );
    assert_eq!(r.status, 204, "{}", r.text());
}
