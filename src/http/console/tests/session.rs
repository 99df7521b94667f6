//! A console session against `projects.json` as it is now: every request reads the
//! key's rights again, so a narrowed or removed key takes effect at once, while the
//! name the session's changes are credited to (the activity log's `who`) stays the one
//! the console shows it signed in as.

use arc_swap::ArcSwap;

use super::*;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::projects::{hash_key, Projects};

const KEY: &str = "phx_console_key";

/// Project 1 with [`KEY`] listed hashed, under `label`, with `scopes`.
fn listing(label: &str, scopes: &[&str]) -> Projects {
    let json = json!({"projects": [{"id": 1, "api_key": "phc_one", "personal_api_keys": [
        {"sha256": hash_key(KEY), "label": label, "scopes": scopes},
    ]}]});
    Projects::parse(json.to_string().as_bytes()).unwrap()
}

#[test]
fn a_session_keeps_the_name_it_signed_in_as_and_takes_the_keys_rights_of_now() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::new(dir.path().join("data"), dir.path().join("db"));
    let projects = Arc::new(ArcSwap::from_pointee(listing(
        "ops",
        &["feature_flag:write"],
    )));
    let geoip = Arc::new(crate::geoip::Database::disabled());
    let pipeline =
        crate::pipeline::Pipeline::open(&config, projects.clone(), geoip.clone(), Box::new(|_| {}))
            .unwrap();
    let rules = crate::flags::Rules::new();
    let app = App::new(config, projects, rules, geoip, Metrics::new(), &pipeline);

    let (id, _) = app.sessions.create(1, KEY, "ops").unwrap();
    let mut headers = HeaderMap::new();
    let cookie = format!("{COOKIE}={id}");
    headers.insert(header::COOKIE, HeaderValue::from_str(&cookie).unwrap());
    let (_, s, caller) = signed_in(&app, &headers).unwrap();
    assert_eq!((s.label.as_str(), caller.label.as_str()), ("ops", "ops"));
    assert!(caller.allows("feature_flag:write"));

    // The key relabelled and narrowed to reading while the session lives.
    app.projects
        .store(Arc::new(listing("ops (read only)", &["feature_flag:read"])));
    let (_, _, caller) = signed_in(&app, &headers).unwrap();
    assert_eq!(caller.label, "ops", "credited as the console shows");
    assert!(caller.allows("feature_flag:read") && !caller.allows("feature_flag:write"));

    // The key removed: the session ends with it.
    let none = json!({"projects": [{"id": 1, "api_key": "phc_one"}]});
    app.projects.store(Arc::new(
        Projects::parse(none.to_string().as_bytes()).unwrap(),
    ));
    assert!(matches!(
        signed_in(&app, &headers),
        Err(ApiError::SignedOut(_))
    ));
    assert!(app.sessions.touch(&id).is_none(), "the session is gone");
    drop(app);
    pipeline.close().unwrap();
}
