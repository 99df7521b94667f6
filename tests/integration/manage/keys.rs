//! `flagpost key new --label`: a personal key stored only as its hash, taken by a
//! running server by itself.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{call, FLAGS};
use crate::util::*;

#[test]
fn a_labelled_key_is_stored_hashed_and_taken_by_the_running_server() {
    let server = Server::start();
    let path = server.data().join("projects.json");
    let before = std::fs::read_to_string(&path).unwrap();
    let data = server.data();
    let dir = data.to_str().unwrap();

    let out = flagpost(&[
        "key",
        "new",
        "--project",
        "1",
        "--label",
        "ci",
        "--data-dir",
        dir,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let key = text(&out.stdout).trim_end().to_owned();
    assert!(key.starts_with("phx_") && key.len() == 52, "{key}");
    assert_eq!(
        text(&out.stderr),
        format!(
            "stored its SHA-256 as \"ci\" in project 1 of {}; a running server takes it \
             within seconds. Keep the key now: it is not kept anywhere.\n",
            path.display()
        )
    );

    // The file: the hash and label added to project 1's list, every other byte kept.
    let after = std::fs::read_to_string(&path).unwrap();
    let hash = flagpost::projects::hash_key(&key);
    assert_eq!(
        after,
        before.replace(
            &format!("[\"{PERSONAL_ONE}\"]"),
            &format!("[\"{PERSONAL_ONE}\", {{\"sha256\": \"{hash}\", \"label\": \"ci\"}}]"),
        )
    );
    assert!(!after.contains(&key), "no plaintext of the key: {after}");

    // Taken without a signal. Few tries, well apart: each refused one counts against
    // this address's failed-authentication limit.
    let started = Instant::now();
    loop {
        let r = call(&server, "GET", FLAGS, &key, None);
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 401, "{}", r.text());
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "the new key was not taken within 4 s"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let created = call(&server, "POST", FLAGS, &key, Some(json!({"key": "by-ci"})));
    assert_eq!(created.status, 201, "{}", created.text());
    assert_eq!(created.json()["created_by"]["first_name"], "ci");
    assert_eq!(server.api("/api/projects/1/events/", &key).status, 200);
    let feed: Value = server
        .api("/api/feature_flag/local_evaluation/", &key)
        .json();
    assert_eq!(feed["flags"][0]["key"], "by-ci");
    assert_eq!(server.api("/api/projects/2/events/", &key).status, 403);
    assert_eq!(
        call(&server, "GET", FLAGS, PERSONAL_ONE, None).status,
        200,
        "the plain key still works"
    );

    // The same label again is refused, and the file is left as it was.
    let again = flagpost(&[
        "key",
        "new",
        "--project",
        "1",
        "--label",
        "ci",
        "--data-dir",
        dir,
    ]);
    assert_eq!(again.status.code(), Some(1));
    assert_eq!(again.stdout, b"", "no key printed when none was stored");
    assert_eq!(
        text(&again.stderr),
        format!(
            "flagpost: {}: project 1 already has a personal key labelled \"ci\"; choose \
             another label, or remove that key from the file first\n",
            path.display()
        )
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), after);

    // Another project may use the label; a project that does not exist may not.
    let two = flagpost(&[
        "key",
        "new",
        "--project",
        "2",
        "--label",
        "ci",
        "--data-dir",
        dir,
    ]);
    assert!(two.status.success(), "{}", text(&two.stderr));
    let nine = flagpost(&[
        "key",
        "new",
        "--project",
        "9",
        "--label",
        "x",
        "--data-dir",
        dir,
    ]);
    assert_eq!(
        text(&nine.stderr),
        format!("flagpost: {}: no project with id 9\n", path.display())
    );
    let unnamed = flagpost(&["key", "new", "--label", "x", "--data-dir", dir]);
    assert_eq!(
        text(&unnamed.stderr),
        "flagpost: --label needs --project: the project the key is for\n"
    );
}

#[test]
fn a_key_says_who_it_is_as_posthog_answers() {
    let server = Server::start();
    let key = server.api("/api/personal_api_keys/@current", PERSONAL_ONE);
    assert_eq!(key.status, 200, "{}", key.text());
    let key = key.json();
    let id = key["id"].as_str().unwrap().to_owned();
    assert_eq!(id.len(), 36, "a UUID: {id}");
    assert_eq!(
        key,
        json!({"id": id, "label": "phx_..._one", "value": null, "mask_value": "phx_..._one",
               "created_at": null, "last_used_at": null, "user_id": null,
               "scopes": ["feature_flag:write", "cohort:write", "activity_log:read",
                          "person:read", "group:read"],
               "scoped_teams": [1], "scoped_organizations": []})
    );
    let me = server.api("/api/users/@me/", PERSONAL_ONE).json();
    let org = me["organization"]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        me,
        json!({"uuid": id, "distinct_id": id, "first_name": "phx_..._one", "last_name": "",
               "email": null, "is_staff": false,
               "team": {"id": 1, "project_id": 1, "organization": org, "api_token": KEY_ONE,
                        "name": "one"},
               "organization": {"id": org, "name": "flagpost"},
               "organizations": [{"id": org, "name": "flagpost"}]})
    );
    let two = server.api("/api/users/@me", PERSONAL_TWO).json();
    assert_eq!(two["team"]["id"], 2);
    assert_eq!(two["organization"]["id"], org.as_str(), "one organization");
    assert_ne!(two["uuid"], id.as_str(), "one user per key");
    assert_eq!(server.get("/api/users/@me/").status, 401);
    assert_eq!(server.api("/api/users/@me/", "phx_unknown").status, 401);
    let post = Req::post("/api/personal_api_keys/@current", "{}")
        .header("Authorization", &format!("Bearer {PERSONAL_ONE}"));
    assert_eq!(server.request(post).status, 405);
}
