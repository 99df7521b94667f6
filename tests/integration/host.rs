//! What a PostHog host answers besides capture and flags, over loopback: posthog-js's
//! files at `/static/`, its start-up config (`/array/<key>/config`, `config.js`,
//! `array.js`) with the project's switches, CORS on every browser-facing answer
//! (errors too), the definitions feed's ETag and dependency chains, remote config
//! payloads, and the deliberate answers for features flagpost does not keep.

use serde_json::{json, Value};

use crate::util::*;

const ORIGIN: &str = "https://shop.example";
const JS: &str = "application/javascript; charset=utf-8";

/// A server whose data dir has `static/` with a few posthog-js-like files.
fn with_static() -> Server {
    let tmp = data_dir();
    let root = tmp.path().join("data/static");
    std::fs::create_dir_all(root.join("1.2.3")).unwrap();
    std::fs::write(root.join("array.js"), "/* array */").unwrap();
    std::fs::write(root.join("surveys.js"), "/* surveys */").unwrap();
    std::fs::write(root.join("array.js.map"), "{}").unwrap();
    std::fs::write(root.join("1.2.3/surveys.js"), "/* surveys 1.2.3 */").unwrap();
    std::fs::write(tmp.path().join("data/secret.json"), "{}").unwrap();
    let dir = tmp.path().to_path_buf();
    let mut server = Server::spawn(&dir, &[]);
    server.keep(tmp);
    server
}

fn get_from(server: &Server, path: &str) -> Resp {
    server.request(Req::get(path).header("Origin", ORIGIN))
}

fn assert_cors(r: &Resp, what: &str) {
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some(ORIGIN),
        "{what}: {r:?}"
    );
    assert_eq!(
        r.header("access-control-allow-credentials"),
        Some("true"),
        "{what}"
    );
}

#[test]
fn static_files_with_types_caching_and_cors() {
    let server = with_static();
    let r = get_from(&server, "/static/array.js?v=1.2.3");
    assert_eq!((r.status, r.text().as_str()), (200, "/* array */"));
    assert_eq!(r.header("content-type"), Some(JS));
    assert_eq!(r.header("cache-control"), Some("public, max-age=3600"));
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    assert!(r
        .header("last-modified")
        .is_some_and(|d| d.ends_with(" GMT")));
    assert_cors(&r, "a static file");
    let map = get_from(&server, "/static/array.js.map");
    assert_eq!(
        map.header("content-type"),
        Some("application/json; charset=utf-8")
    );

    // Revalidation costs a 304 with the same validators.
    let etag = r.header("etag").expect("an ETag").to_string();
    let again = server.request(Req::get("/static/array.js").header("If-None-Match", &etag));
    assert_eq!((again.status, again.body.len()), (304, 0));
    assert_eq!(again.header("etag"), Some(etag.as_str()));

    // posthog-js asks for `/static/<version>/<name>.js` first: that version's own
    // directory answers, immutable; else the top-level file, like PostHog's own.
    let versioned = get_from(&server, "/static/1.2.3/surveys.js");
    assert_eq!(versioned.text(), "/* surveys 1.2.3 */");
    assert_eq!(
        versioned.header("cache-control"),
        Some("public, max-age=31536000, immutable")
    );
    let other = get_from(&server, "/static/9.9.9/surveys.js");
    assert_eq!(other.text(), "/* surveys */");
    assert_eq!(other.header("cache-control"), Some("public, max-age=3600"));

    // HEAD: the headers of a GET, no body (read raw: the helper expects one).
    let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
    write_request(
        &mut stream,
        &Req::get("/static/array.js").method("HEAD"),
        true,
    );
    let mut raw = String::new();
    std::io::Read::read_to_string(&mut stream, &mut raw).unwrap();
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    assert!(raw.contains("content-length: 11\r\n"), "{raw}");
    assert!(raw.ends_with("\r\n\r\n"), "no body: {raw}");
}

#[test]
fn static_paths_never_leave_the_directory() {
    let server = with_static();
    for path in [
        "/static/../secret.json",
        "/static/%2e%2e/secret.json",
        "/static/..%2fsecret.json",
        "/static/.hidden",
        "/static/1.2.3",
        "/static/",
        "/static/nope.js",
        "/static//array.js",
    ] {
        let r = get_from(&server, path);
        assert_eq!(r.status, 404, "{path}: {}", r.text());
        assert_eq!(r.json()["code"], "not_found", "{path}");
        assert_cors(&r, path);
    }
    let post = server.request(Req::post("/static/array.js", "x").header("Origin", ORIGIN));
    assert_eq!(post.status, 405);
    assert_cors(&post, "405 on a static file");
}

#[test]
fn without_a_static_dir_a_clear_404_and_one_hint() {
    let server = Server::start();
    for _ in 0..2 {
        let r = get_from(&server, "/static/array.js");
        assert_eq!(r.status, 404);
        assert_eq!(r.json()["detail"], "no such static file");
        assert_cors(&r, "missing static dir");
    }
    let log = wait_for("the hint", || {
        let log = server.log();
        log.contains("copy posthog-js's").then_some(log)
    });
    assert_eq!(log.matches("copy posthog-js's").count(), 1, "{log}");
}

#[test]
fn a_named_static_dir_must_exist() {
    let tmp = data_dir();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flagpost"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(tmp.path().join("data"))
        .arg("--db")
        .arg(tmp.path().join("db"))
        .args(["--static-dir", "/nonexistent/flagpost-static"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is not a directory"), "{stderr}");
}

#[test]
fn config_js_files_the_remote_config_under_the_key() {
    let server = with_static();
    let r = get_from(&server, &format!("/array/{KEY_ONE}/config.js"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some(JS));
    assert_eq!(r.header("cache-control"), Some("public, max-age=60"));
    assert_cors(&r, "config.js");
    let js = r.text();
    let prefix = format!(
        "(function() {{\n  window._POSTHOG_REMOTE_CONFIG = window._POSTHOG_REMOTE_CONFIG || {{}};\n  \
         window._POSTHOG_REMOTE_CONFIG[\"{KEY_ONE}\"] = {{\n    config: "
    );
    let suffix = ",\n    siteApps: []\n  }\n})();";
    assert!(js.starts_with(&prefix) && js.ends_with(suffix), "{js}");
    let config: Value = serde_json::from_str(&js[prefix.len()..js.len() - suffix.len()]).unwrap();
    let json = server.get(&format!("/array/{KEY_ONE}/config")).json();
    assert_eq!(config, json, "the script carries the JSON config");
    assert_eq!(config["token"], KEY_ONE);

    // The per-token bundle: the snippet's library, then that script.
    let bundle = get_from(&server, &format!("/array/{KEY_ONE}/array.js")).text();
    assert_eq!(bundle, format!("/* array */\n\n{js}"));

    let unknown = get_from(&server, "/array/phc_unknown/config.js");
    assert_eq!(unknown.status, 401);
    assert_cors(&unknown, "unknown key");
}

#[test]
fn remote_config_carries_every_field_posthog_js_reads() {
    let server = Server::start();
    let r = get_from(&server, &format!("/array/{KEY_ONE}/config"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        r.json(),
        json!({
            "token": KEY_ONE,
            "supportedCompression": ["gzip", "gzip-js", "lz64"],
            "hasFeatureFlags": true,
            "captureDeadClicks": false,
            "capturePerformance": false,
            "autocapture_opt_out": false,
            "autocaptureExceptions": false,
            "analytics": {"endpoint": "/e/"},
            "elementsChainAsString": true,
            "errorTracking": {"autocaptureExceptions": false, "suppressionRules": []},
            "logs": {"captureConsoleLogs": false},
            "sessionRecording": false,
            "heatmaps": false,
            "conversations": false,
            "surveys": false,
            "productTours": false,
            "defaultIdentifiedOnly": true,
            "siteApps": []
        })
    );
}

#[test]
fn project_switches_reach_config_and_decide() {
    let server = Server::start();
    let projects = format!(
        r#"{{"projects": [{{"id": 1, "api_key": "{KEY_ONE}", "personal_api_keys": ["{PERSONAL_ONE}"],
            "remote_config": {{"heatmaps": true, "autocapture_exceptions": true, "web_vitals": true,
                               "web_vitals_allowed_metrics": ["LCP", "CLS"], "capture_dead_clicks": true,
                               "autocapture_opt_out": true}}}}]}}"#
    );
    write_atomically(&server.data().join("projects.json"), projects);
    server.sighup();
    let config = wait_for("the switches", || {
        let c = server.get(&format!("/array/{KEY_ONE}/config")).json();
        (c["heatmaps"] == true).then_some(c)
    });
    let expected = json!({
        "heatmaps": true,
        "autocapture_opt_out": true,
        "captureDeadClicks": true,
        "autocaptureExceptions": {"endpoint": "/e/"},
        "errorTracking": {"autocaptureExceptions": true, "suppressionRules": []},
        "capturePerformance": {"network_timing": false, "web_vitals": true,
                               "web_vitals_allowed_metrics": ["LCP", "CLS"]},
        "sessionRecording": false,
        "surveys": false
    });
    let body = json!({"token": KEY_ONE, "distinct_id": "d"}).to_string();
    let decide = server.post("/decide/?v=3", body.clone()).json();
    let flags = server.post("/flags/?v=2", body).json();
    for (k, v) in expected.as_object().unwrap() {
        assert_eq!(&config[k], v, "config {k}");
        assert_eq!(&decide[k], v, "decide {k}");
        assert_eq!(&flags[k], v, "flags {k}");
    }

    // A typo is refused and the previous projects stay.
    let typo = format!(
        r#"{{"projects": [{{"id": 1, "api_key": "{KEY_ONE}", "remote_config": {{"heatmap": true}}}}]}}"#
    );
    write_atomically(&server.data().join("projects.json"), typo);
    server.sighup();
    wait_for("the refusal", || {
        server
            .log()
            .contains("unknown field `heatmap`")
            .then_some(())
    });
    assert_eq!(
        server.get(&format!("/array/{KEY_ONE}/config")).json()["heatmaps"],
        true
    );
}

#[test]
fn flags_answers_say_when_they_were_evaluated() {
    let server = Server::start();
    let before = now_ms();
    let body = json!({"token": KEY_ONE, "distinct_id": "d"}).to_string();
    let flags = server.post("/flags/?v=2", body.clone()).json();
    let after = now_ms();
    let at = flags["evaluatedAt"].as_i64().expect("evaluatedAt in ms");
    assert!(
        (before..=after).contains(&at),
        "{before} <= {at} <= {after}"
    );
    // PostHog writes `quotaLimited` only when a quota was hit; posthog-rs cannot
    // parse the list, so it is never written here.
    assert!(flags.get("quotaLimited").is_none(), "{flags}");
    let mut ids = std::collections::HashSet::new();
    for path in [
        "/decide/",
        "/decide/?v=2",
        "/decide/?v=3",
        "/flags/",
        "/flags/?v=2",
    ] {
        let answer = server.post(path, body.clone()).json();
        assert!(answer["evaluatedAt"].as_i64().is_some(), "{path}");
        assert!(answer.get("quotaLimited").is_none(), "{path}");
        let id = answer["requestId"].as_str().expect("a requestId");
        assert_eq!(uuid_version(id), Some('7'), "{path}: {id}");
        assert!(ids.insert(id.to_owned()), "{path}: a fresh requestId");
    }
    // `/flags` without a version answers in the legacy shape, as PostHog's does.
    let legacy = server.post("/flags/", body).json();
    assert!(legacy["featureFlags"].is_object() && legacy.get("flags").is_none());
}

/// The version digit of a UUID's text.
fn uuid_version(id: &str) -> Option<char> {
    (id.len() == 36).then(|| id.as_bytes()[14] as char)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
fn every_browser_facing_answer_carries_cors_errors_included() {
    let server = Server::start();
    let cases: Vec<(Req, u16)> = vec![
        (Req::post("/e/", "not json"), 400),
        (Req::post("/e/", r#"{"event":"x","distinct_id":"d"}"#), 401),
        (
            Req::post(
                "/e/",
                r#"{"api_key":"phc_nope","event":"x","distinct_id":"d"}"#,
            ),
            401,
        ),
        (Req::get("/e/").method("PUT"), 405),
        (Req::post("/flags/?v=2", r#"{"distinct_id":"d"}"#), 401),
        (
            Req::post("/flags/?v=2", format!(r#"{{"token":"{KEY_ONE}"}}"#)),
            400,
        ),
        (Req::get("/decide/").method("DELETE"), 405),
        (Req::get("/array/phc_nope/config"), 401),
        (Req::post(&format!("/array/{KEY_ONE}/config.js"), ""), 405),
        (Req::get("/static/array.js"), 404),
        (Req::get("/no/such/path"), 404),
        (Req::post("/s/", "{}"), 404),
        (Req::get("/api/web_experiments/?token=phc_nope"), 401),
    ];
    for (req, status) in cases {
        let what = format!("{} {}", req.method, req.path);
        let r = server.request(req.header("Origin", ORIGIN));
        assert_eq!(r.status, status, "{what}: {}", r.text());
        assert_cors(&r, &what);
        assert!(r.json()["code"].is_string(), "{what}: a JSON error");
    }
    // A preflight to any of them is answered, so the browser sends the request.
    let preflight = server.request(
        Req::get("/s/")
            .method("OPTIONS")
            .header("Origin", ORIGIN)
            .header("Access-Control-Request-Headers", "content-type"),
    );
    assert_eq!(preflight.status, 200);
    assert_cors(&preflight, "preflight");
    // Personal-key endpoints are not for browsers.
    let api = server.request(Req::get("/api/projects/1/events/").header("Origin", ORIGIN));
    assert_eq!(api.status, 401);
    assert_eq!(api.header("access-control-allow-origin"), None);
}

#[test]
fn features_not_kept_get_deliberate_answers() {
    let server = Server::start();
    for (path, feature) in [
        ("/s/?compression=gzip-js", "session replay"),
        ("/i/v1/logs", "logs"),
        ("/i/v1/metrics", "SDK metrics"),
        ("/api/conversations/v1/widget/message", "conversations"),
    ] {
        let r = server.post(path, "{}");
        assert_eq!(r.status, 404, "{path}");
        assert_eq!(
            r.json(),
            json!({"type": "validation_error", "code": "not_kept", "attr": null,
                   "detail": format!("flagpost does not keep {feature}; its remote config tells clients it is off")}),
            "{path}"
        );
    }
    let experiments = server.get(&format!("/api/web_experiments/?token={KEY_ONE}"));
    assert_eq!(
        (experiments.status, experiments.json()),
        (200, json!({"experiments": []}))
    );
    let tours = server.get(&format!("/api/product_tours/?token={KEY_ONE}"));
    assert_eq!(
        (tours.status, tours.json()),
        (200, json!({"product_tours": []}))
    );
    assert_eq!(server.get("/api/product_tours/").status, 401);

    // posthog-node's LLM analytics batches are ordinary events.
    let batch = json!({"api_key": KEY_ONE, "batch": [
        {"event": "$ai_generation", "distinct_id": "llm", "properties": {"$ai_model": "m"}}]});
    assert_eq!(
        server.post("/i/v0/ai/batch/", batch.to_string()).status,
        200
    );
    let stored = server.wait_for_events(1, 1);
    assert_eq!(stored[0]["event"], "$ai_generation");
}
