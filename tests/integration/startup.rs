//! Starting and keeping a server current as an operator meets it: `projects.json` is
//! picked up on change like the flag files, without a signal.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::*;

/// How soon a change to `projects.json` must be served: the poller looks every 250 ms.
const RELOAD_WITHIN: Duration = Duration::from_secs(2);

#[test]
fn a_key_added_to_projects_json_works_without_a_signal() {
    let server = Server::start();
    let capture = |key: &str| {
        let event = json!({"event": "e", "distinct_id": "d", "api_key": key});
        server.post("/capture/", event.to_string()).status
    };
    assert_eq!(capture("phc_added_later"), 401);
    let projects = server.data().join("projects.json");
    let mut file: Value = serde_json::from_slice(&std::fs::read(&projects).unwrap()).unwrap();
    file["projects"]
        .as_array_mut()
        .unwrap()
        .push(json!({"id": 3, "api_key": "phc_added_later"}));
    // Written in place, as an editor does, not renamed over.
    std::fs::write(&projects, file.to_string()).unwrap();
    let written = Instant::now();
    wait_for("the new key to be accepted", || {
        (capture("phc_added_later") == 200).then_some(())
    });
    let took = written.elapsed();
    assert!(took < RELOAD_WITHIN, "took {took:?}");
    assert_eq!(server.log().matches("projects reloaded").count(), 1);

    // A broken file is reported once and the loaded projects stay.
    std::fs::write(&projects, "{ broken").unwrap();
    wait_for("the reload failure to be logged", || {
        server.log().contains("projects not reloaded").then_some(())
    });
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(server.log().matches("projects not reloaded").count(), 1);
    assert_eq!(capture("phc_added_later"), 200);
    assert_eq!(capture(KEY_ONE), 200);

    // The key removed again: refused once the file is fixed.
    file["projects"].as_array_mut().unwrap().pop();
    write_atomically(&projects, file.to_string());
    wait_for("the removed key to be refused", || {
        (capture("phc_added_later") == 401).then_some(())
    });
}
