//! Which scope each endpoint takes, as PostHog's viewsets name them (`scope_object`
//! and `required_scopes` in PostHog's API): every endpoint a personal key reaches is
//! asked with a key holding only its scope (let in) and with a key holding an
//! unrelated one (refused, naming the scope in PostHog's words).

use serde_json::json;

use super::keys::{new_key, taken, with_key};
use crate::util::*;

/// A scope of PostHog's that no endpoint here takes.
const UNRELATED: &str = "survey:read";

/// Method, path, body and the scope PostHog requires there.
const ENDPOINTS: &[(&str, &str, Option<&str>, &str)] = &[
    (
        "GET",
        "/api/projects/1/feature_flags/",
        None,
        "feature_flag:read",
    ),
    (
        "GET",
        "/api/projects/@current/feature_flags/",
        None,
        "feature_flag:read",
    ),
    (
        "POST",
        "/api/projects/1/feature_flags/",
        Some(r#"{"key": "made-by-scope"}"#),
        "feature_flag:write",
    ),
    // PostHog's FeatureFlagViewSet: `activity` and `all_activity` take
    // required_scopes=["activity_log:read"], not the flag's own scope.
    (
        "GET",
        "/api/projects/1/feature_flags/activity/",
        None,
        "activity_log:read",
    ),
    (
        "GET",
        "/api/projects/1/feature_flags/1/activity/",
        None,
        "activity_log:read",
    ),
    ("GET", "/api/projects/1/cohorts/", None, "cohort:read"),
    (
        "POST",
        "/api/projects/1/cohorts/",
        Some(r#"{"name": "c", "filters": {"properties": {"type": "AND", "values": []}}}"#),
        "cohort:write",
    ),
    // PostHog's `query` scope "covers query and events endpoints".
    ("GET", "/api/projects/1/events/", None, "query:read"),
    ("GET", "/api/projects/1/persons/", None, "person:read"),
    (
        "GET",
        "/api/projects/1/groups/?group_type_index=0&group_key=acme",
        None,
        "group:read",
    ),
    // PostHog's UserViewSet: scope_object = "user".
    ("GET", "/api/users/@me/", None, "user:read"),
    (
        "GET",
        "/flags/definitions?token=phc_test_one&send_cohorts",
        None,
        "feature_flag:read",
    ),
    (
        "GET",
        "/api/feature_flag/local_evaluation/?token=phc_test_one",
        None,
        "feature_flag:read",
    ),
    (
        "GET",
        "/api/projects/1/feature_flags/beta/remote_config",
        None,
        "feature_flag:read",
    ),
];

#[test]
fn each_endpoint_takes_the_scope_posthog_names() {
    let server = Server::start();
    let mut scopes: Vec<&str> = ENDPOINTS.iter().map(|e| e.3).collect();
    scopes.push(UNRELATED);
    scopes.sort_unstable();
    scopes.dedup();
    // Every key made before the server is asked, so one wait covers them all and the
    // failed-key limit is spent at most once while the file is reread.
    let keys: Vec<(&str, String)> = scopes
        .iter()
        .map(|&scope| {
            let label = scope.replace([':', '_'], "-");
            (
                scope,
                new_key(&server, &["--label", &label, "--scope", scope]),
            )
        })
        .collect();
    let key_of = |scope: &str| &keys.iter().find(|(s, _)| *s == scope).unwrap().1;
    // The key made last is in the file the server read last, with all the others.
    let (_, last) = keys.last().unwrap();
    taken(&server, "/api/personal_api_keys/@current", last);

    for &(method, path, body, scope) in ENDPOINTS {
        let body = body.map(|b| serde_json::from_str(b).unwrap());
        let r = with_key(&server, method, path, key_of(UNRELATED), body.clone());
        assert_eq!(
            (r.status, r.json()),
            (
                403,
                json!({"type": "authentication_error", "code": "permission_denied",
                       "detail": format!("API key missing required scope '{scope}'"),
                       "attr": null})
            ),
            "{method} {path} with {UNRELATED}"
        );
        let r = with_key(&server, method, path, key_of(scope), body);
        assert!(
            matches!(r.status, 200 | 201 | 404),
            "{method} {path} with {scope}: {} {}",
            r.status,
            r.text()
        );
    }
    // The key's own description takes no scope, as in PostHog; it lists the key's.
    let r = with_key(
        &server,
        "GET",
        "/api/personal_api_keys/@current",
        key_of(UNRELATED),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["scopes"], json!([UNRELATED]));
    // A flag's reader does not read its history, nor the history's reader the flags.
    let r = with_key(
        &server,
        "GET",
        "/api/projects/1/feature_flags/activity/",
        key_of("feature_flag:read"),
        None,
    );
    assert_eq!(
        r.json()["detail"],
        "API key missing required scope 'activity_log:read'"
    );
    let r = with_key(
        &server,
        "GET",
        "/api/projects/1/feature_flags/",
        key_of("activity_log:read"),
        None,
    );
    assert_eq!(
        r.json()["detail"],
        "API key missing required scope 'feature_flag:read'"
    );
}

#[test]
fn a_key_without_scopes_is_let_in_everywhere() {
    let server = Server::start();
    for &(method, path, body, scope) in ENDPOINTS {
        let body = body.map(|b| serde_json::from_str(b).unwrap());
        let r = with_key(&server, method, path, PERSONAL_ONE, body);
        assert!(
            matches!(r.status, 200 | 201 | 404),
            "{method} {path} ({scope}): {} {}",
            r.status,
            r.text()
        );
    }
}
