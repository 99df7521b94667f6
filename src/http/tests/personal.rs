//! The one way in by key, over a real app: which header a key is read from, which
//! project and rights it names, another project's key and a secret key in the wrong
//! place refused, the definitions feed's two kinds of key, and only a bad key costing
//! a failed-authentication token.

use std::net::SocketAddr;

use arc_swap::ArcSwap;
use hyper::header::{HeaderValue, AUTHORIZATION};

use super::*;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::projects::{hash_key, Projects};

/// Project 1 holds a key with every right, one that may only read flags, one that may
/// only read persons, and a secret key; project 2 a key of its own.
fn projects() -> Projects {
    let json = serde_json::json!({"projects": [
        {"id": 1, "api_key": "phc_one", "secret_api_keys": ["phs_one_secret"],
         "personal_api_keys": [
            "phx_every_right",
            {"sha256": hash_key("phx_flags_only"), "scopes": ["feature_flag:read"]},
            {"sha256": hash_key("phx_persons_only"), "scopes": ["person:read"]},
         ]},
        {"id": 2, "api_key": "phc_two", "personal_api_keys": ["phx_of_two"]},
    ]});
    Projects::parse(json.to_string().as_bytes()).unwrap()
}

/// An app over a fresh pipeline serving [`projects`]; the pipeline is closed by the
/// caller.
fn open(dir: &std::path::Path) -> (App, crate::pipeline::Pipeline) {
    let config = Config::new(dir.join("data"), dir.join("db"));
    let projects = Arc::new(ArcSwap::from_pointee(projects()));
    let geoip = Arc::new(crate::geoip::Database::disabled());
    let pipeline =
        crate::pipeline::Pipeline::open(&config, projects.clone(), geoip.clone(), Box::new(|_| {}))
            .unwrap();
    let rules = crate::flags::Rules::new();
    let app = App::new(config, projects, rules, geoip, Metrics::new(), &pipeline);
    (app, pipeline)
}

fn with(authorization: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(AUTHORIZATION, HeaderValue::from_str(authorization).unwrap());
    headers
}

fn bearing(key: &str) -> HeaderMap {
    with(&format!("Bearer {key}"))
}

/// Each test its own address, so no test spends another's tokens.
fn peer(n: u8) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, n], 40_000))
}

/// The project a result names, or its error's words.
fn project_of(r: Result<(Arc<Project>, Caller), ApiError>) -> Result<u64, String> {
    r.map(|(p, _)| p.id).map_err(|e| format!("{e:?}"))
}

fn error_of<T: std::fmt::Debug>(r: Result<T, ApiError>) -> String {
    format!("{:?}", r.unwrap_err())
}

#[test]
fn a_personal_key_is_read_from_the_bearer_header_only() {
    assert_eq!(
        personal_key(&bearing("phx_every_right")).ok(),
        Some("phx_every_right")
    );
    assert_eq!(
        personal_key(&with("Bearer  phx_of_two \t")).ok(),
        Some("phx_of_two"),
        "trimmed"
    );
    for refused in [
        with("Bearer phs_one_secret"),
        with("Bearer phc_one"),
        with("Basic phx_every_right"),
        with("phx_every_right"),
        with("Bearer "),
        HeaderMap::new(),
    ] {
        let got = personal_key(&refused);
        assert!(
            matches!(got, Err(ApiError::NotAuthenticated)),
            "{refused:?}: {got:?}"
        );
    }
}

#[test]
fn a_personal_key_names_its_project_and_its_rights() {
    let dir = tempfile::tempdir().unwrap();
    let (app, pipeline) = open(dir.path());
    let at = peer(1);
    let (project, caller) = authenticate(&app, &bearing("phx_every_right"), at).unwrap();
    assert_eq!(project.id, 1);
    assert!(caller.allows("feature_flag:write") && caller.allows("person:read"));
    let (project, caller) = authenticate(&app, &bearing("phx_flags_only"), at).unwrap();
    assert_eq!(project.id, 1);
    assert!(caller.allows("feature_flag:read") && !caller.allows("feature_flag:write"));
    assert_eq!(
        project_of(authenticate(&app, &bearing("phx_of_two"), at)),
        Ok(2)
    );

    for (headers, error) in [
        (bearing("phx_unknown"), "NotAuthenticated"),
        (HeaderMap::new(), "NotAuthenticated"),
        // A project's public key is no personal key.
        (bearing("phc_one"), "NotAuthenticated"),
        (with("Token phx_every_right"), "NotAuthenticated"),
        (bearing("phs_one_secret"), "SecretKeyElsewhere"),
    ] {
        let got = project_of(authenticate(&app, &headers, at));
        assert_eq!(got, Err(error.to_string()), "{headers:?}");
    }
    drop(app);
    pipeline.close().unwrap();
}

#[test]
fn a_request_about_a_project_needs_that_projects_key() {
    let dir = tempfile::tempdir().unwrap();
    let (app, pipeline) = open(dir.path());
    let at = peer(2);
    let one = bearing("phx_every_right");
    assert_eq!(project_of(authorize(&app, &one, at, 1)), Ok(1));
    assert_eq!(
        project_of(authorize(&app, &bearing("phx_of_two"), at, 2)),
        Ok(2)
    );
    let forbidden = Err("Forbidden".to_string());
    assert_eq!(project_of(authorize(&app, &one, at, 2)), forbidden);
    assert_eq!(
        project_of(authorize(&app, &bearing("phx_of_two"), at, 1)),
        forbidden
    );
    // A project that does not exist answers as another project's does.
    assert_eq!(project_of(authorize(&app, &one, at, 3)), forbidden);
    assert_eq!(
        project_of(authorize(&app, &bearing("phx_unknown"), at, 1)),
        Err("NotAuthenticated".to_string())
    );
    drop(app);
    pipeline.close().unwrap();
}

#[test]
fn the_definitions_feed_takes_a_secret_key_or_a_key_that_may_read_flags() {
    let dir = tempfile::tempdir().unwrap();
    let (app, pipeline) = open(dir.path());
    let at = peer(3);
    let id = |key: &str| feed_reader(&app, &bearing(key), at).map(|p| p.id);
    assert_eq!(id("phs_one_secret").ok(), Some(1));
    assert_eq!(id("phx_flags_only").ok(), Some(1));
    assert_eq!(id("phx_every_right").ok(), Some(1));
    assert_eq!(id("phx_of_two").ok(), Some(2));
    assert_eq!(
        error_of(id("phx_persons_only")),
        format!("{:?}", ApiError::MissingScope(FEED_SCOPE))
    );
    assert_eq!(error_of(id("phs_unknown")), "NotAuthenticated");
    assert_eq!(error_of(id("phx_unknown")), "NotAuthenticated");
    drop(app);
    pipeline.close().unwrap();
}

#[test]
fn a_scope_is_required_as_the_key_states_it() {
    let dir = tempfile::tempdir().unwrap();
    let (app, pipeline) = open(dir.path());
    let at = peer(4);
    let (_, persons) = authenticate(&app, &bearing("phx_persons_only"), at).unwrap();
    assert!(require(&persons, "person:read").is_ok());
    assert_eq!(
        error_of(require(&persons, "feature_flag:read")),
        format!("{:?}", ApiError::MissingScope("feature_flag:read"))
    );
    let (_, every) = authenticate(&app, &bearing("phx_every_right"), at).unwrap();
    assert!(require(&every, "feature_flag:write").is_ok());
    drop(app);
    pipeline.close().unwrap();
}

/// Unknown keys `at` sends until it is refused for the failures; bounded far above
/// any burst the limit allows.
fn failures_allowed(app: &App, at: SocketAddr) -> usize {
    let bad = bearing("phx_unknown");
    for n in 0..1_000 {
        match error_of(authenticate(app, &bad, at)) {
            e if e == "NotAuthenticated" => continue,
            e if e.starts_with("Throttled") => return n,
            e => panic!("{e}"),
        }
    }
    panic!("a thousand unknown keys and never refused")
}

#[test]
fn only_a_missing_or_unknown_key_costs_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let (app, pipeline) = open(dir.path());
    // An address that only ever failed: how many failures a burst allows.
    let burst = failures_allowed(&app, peer(5));
    assert!(burst >= 3, "{burst}");
    let at = peer(6);
    let good = bearing("phx_every_right");
    // Good keys, and good keys short of a scope or of another project, cost nothing.
    for _ in 0..2 * burst {
        assert!(authenticate(&app, &good, at).is_ok());
        assert!(authorize(&app, &good, at, 2).is_err());
        assert!(feed_reader(&app, &bearing("phx_persons_only"), at).is_err());
    }
    // A missing key costs one as an unknown one does.
    assert_eq!(
        error_of(authenticate(&app, &HeaderMap::new(), at)),
        "NotAuthenticated"
    );
    assert_eq!(failures_allowed(&app, at), burst - 1);
    // Out of tokens: refused before the key is looked at, a good one too.
    assert!(error_of(authenticate(&app, &good, at)).starts_with("Throttled"));
    assert!(error_of(feed_reader(&app, &good, at)).starts_with("Throttled"));
    // Another address is not held back.
    assert!(authenticate(&app, &good, peer(7)).is_ok());
    drop(app);
    pipeline.close().unwrap();
}
