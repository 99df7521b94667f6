//! `next` and `previous` links: from `--public-url`, or from the Host only when it is
//! one of the listener's names.

use serde_json::{json, Value};

use super::get_as;
use crate::util::*;

const FLAGS: &str = "/api/projects/1/feature_flags/";

fn two_flags(server: &Server) {
    for key in ["one", "two"] {
        let r = server.request(
            Req::post(FLAGS, json!({"key": key}).to_string())
                .header("Authorization", &format!("Bearer {PERSONAL_ONE}"))
                .header("Content-Type", "application/json"),
        );
        assert_eq!(r.status, 201, "{}", r.text());
    }
}

fn page(server: &Server, host: &str, extra: &[(&str, &str)]) -> Value {
    let auth = format!("Bearer {PERSONAL_ONE}");
    let mut headers = vec![("Authorization", auth.as_str())];
    headers.extend_from_slice(extra);
    let r = get_as(
        "127.0.0.1",
        server.addr,
        &format!("{FLAGS}?limit=1&offset=1"),
        host,
        &headers,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

#[test]
fn a_foreign_host_cannot_point_the_links_elsewhere() {
    let server = Server::start();
    two_flags(&server);
    let own = format!("http://{}", server.addr);
    // A Host that is not the listener's gets links relative to whatever host the client
    // reached: never the forged name, nor the listening address (the client's own machine
    // when flagpost is behind nginx).
    let p = page(&server, "evil.example", &[("X-Forwarded-Proto", "https")]);
    assert_eq!(p["previous"], format!("{FLAGS}?limit=1"));
    let p = page(&server, "localhost.evil.example:8000", &[]);
    assert_eq!(p["previous"], format!("{FLAGS}?limit=1"));
    assert_eq!(p["next"], Value::Null);
    // Userinfo after a name of the listener's, or another port, is not taken either.
    for host in [
        "localhost:@evil.example",
        "localhost:1@evil.example",
        "localhost:1",
    ] {
        let p = page(&server, host, &[]);
        assert_eq!(p["previous"], format!("{FLAGS}?limit=1"), "{host}");
    }
    // The listener's own names are taken as sent, with the scheme nginx reports.
    let p = page(&server, "localhost", &[("X-Forwarded-Proto", "https")]);
    assert_eq!(p["previous"], format!("https://localhost{FLAGS}?limit=1"));
    let p = page(&server, &server.addr.to_string(), &[]);
    assert_eq!(p["previous"], format!("{own}{FLAGS}?limit=1"));
    let p = page(&server, &format!("LocalHost:{}", server.addr.port()), &[]);
    assert_eq!(
        p["previous"],
        format!("http://localhost:{}{FLAGS}?limit=1", server.addr.port())
    );
}

#[test]
fn the_public_url_is_the_base_of_every_link() {
    let server = Server::start_with(&["--public-url", "https://flags.example.com/"]);
    two_flags(&server);
    for host in ["evil.example", "localhost"] {
        let p = page(&server, host, &[]);
        assert_eq!(
            p["previous"],
            format!("https://flags.example.com{FLAGS}?limit=1"),
            "{host}"
        );
    }
    // The read API's cursor links too.
    let batch = json!({"api_key": KEY_ONE, "batch": [
        {"event": "a", "distinct_id": "x"}, {"event": "b", "distinct_id": "x"}]});
    assert_eq!(server.post("/batch/", batch.to_string()).status, 200);
    server.wait_for_events(1, 2);
    let r = get_as(
        "127.0.0.1",
        server.addr,
        "/api/projects/1/events/?limit=1",
        "evil.example",
        &[("Authorization", &format!("Bearer {PERSONAL_ONE}"))],
    );
    let next = r.json()["next"].as_str().unwrap().to_owned();
    assert!(
        next.starts_with("https://flags.example.com/api/projects/1/events/?limit=1&cursor="),
        "{next}"
    );
    let out = flagpost(&["serve", "--public-url", "flags.example.com"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--public-url"),
        "{}",
        text(&out.stderr)
    );
}
