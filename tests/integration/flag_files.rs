//! A running server refuses a flag file exactly as `flagpost check` does (issue 38): a
//! mistyped field, an unknown operator or filter type is not published, the previous
//! rules keep answering `/decide`, and the log, `/metrics` (`flagpost_flags_refused`)
//! and the console's health page name the file, the flag and the field with what was
//! likely meant; fixing the file publishes it.

use serde_json::{json, Value};

use crate::console::sign_in;
use crate::util::*;

fn flag_file(group: Value) -> String {
    json!({"flags": [{"id": 1, "key": "beta", "active": true, "filters": {"groups": [group]}}]})
        .to_string()
}

fn beta(server: &Server, distinct_id: &str) -> Value {
    let body = json!({"api_key": KEY_ONE, "distinct_id": distinct_id});
    let r = server.post("/decide/?v=3", body.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["featureFlags"]["beta"].clone()
}

fn reload_failures(server: &Server) -> u64 {
    let text = server.get("/metrics").text();
    text.lines()
        .find(|l| l.starts_with("flagpost_flags_reload_failures"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no flags reload failures in /metrics:\n{text}"))
}

fn check(server: &Server) -> (bool, String) {
    let data = server.data();
    let out = flagpost(&["check", "--data-dir", data.to_str().unwrap()]);
    (out.status.success(), text(&out.stdout))
}

#[test]
fn a_refused_file_keeps_the_previous_rules_and_says_why_everywhere() {
    let server = Server::start();
    let path = server.data().join("flags/1.json");
    // Nobody: a typo that dropped the percentage would roll out to everyone instead.
    write_atomically(
        &path,
        flag_file(json!({"properties": [], "rollout_percentage": 0})),
    );
    wait_for("beta served off", || {
        (beta(&server, "u1") == json!(false)).then_some(())
    });
    let console = sign_in(&server, PERSONAL_ONE);
    let health = || {
        let r = server.request(Req::get("/console/api/health").header("Cookie", &console.cookie));
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["reload_errors"].clone()
    };
    assert_eq!(health(), json!([]));

    let cases = [
        (
            json!({"properties": [], "rollout_percentge": 0}),
            "filters.groups[0].rollout_percentge",
            r#"unknown field (did you mean "rollout_percentage"?)"#,
        ),
        (
            json!({"properties": [{"key": "email", "value": "@x.com", "operator": "ends_wth"}], "rollout_percentage": 0}),
            "filters.groups[0].properties[0].operator",
            r#"unknown operator "ends_wth""#,
        ),
        (
            json!({"properties": [{"key": "email", "value": "x", "type": "persn"}], "rollout_percentage": 0}),
            "filters.groups[0].properties[0].type",
            r#"unknown filter type "persn" (did you mean "person"?)"#,
        ),
    ];
    for (group, field, problem) in cases {
        let message = format!(r#"flag "beta": {field}: {problem}"#);
        let failures = reload_failures(&server);
        write_atomically(&path, flag_file(group));
        let expected = format!("{}: {message}", path.display());
        wait_for("the file refused", || {
            (reload_failures(&server) == failures + 1).then_some(())
        });
        // The refusal is counted while the file compiles, and the health page's list is
        // replaced once the whole reload is done: wait for that list, exactly.
        let listed = json!([{"of": "flags", "problem": expected}]);
        wait_for("the health page naming the file, flag and field", || {
            (health() == listed).then_some(())
        });
        // The server's stderr reaches the test through a pipe, and may trail the metric.
        wait_for("the log naming the file, flag and field", || {
            server.log().contains(&expected).then_some(())
        });
        let named = format!(
            r#"flagpost_flags_refused{{file="{}",flag="beta",field="{field}",problem="{}"}} 1"#,
            path.display(),
            problem.replace('"', r#"\""#)
        );
        let metrics = server.get("/metrics").text();
        assert!(metrics.lines().any(|l| l == named), "{named}\n{metrics}");
        for user in ["u1", "u2", "u3", "u4"] {
            assert_eq!(beta(&server, user), json!(false), "{message}");
        }
        // `check` refuses the same file with the same words.
        let (ok, stdout) = check(&server);
        assert!(
            !ok && stdout.contains(&format!("error: {expected}\n")),
            "{stdout}"
        );
    }

    write_atomically(
        &path,
        flag_file(json!({"properties": [], "rollout_percentage": 100})),
    );
    wait_for("the fixed file published", || {
        (beta(&server, "u1") == json!(true)).then_some(())
    });
    assert_eq!(health(), json!([]));
    let metrics = server.get("/metrics").text();
    assert!(!metrics.contains("flagpost_flags_refused{"), "{metrics}");
    assert!(check(&server).0);
}
