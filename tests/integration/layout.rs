//! The flag files in a folder of their own (`--flags-dir`), as the deployed unit keeps
//! them in its state directory while the data dir stays read-only: the management API
//! writes there, `/decide` and `check` and `eval` read from there, and flag files left
//! in `<data dir>/flags` are named at start and by `check` rather than silently dropped.
//! The read-only case itself (a write refused, the warning at start) runs under the
//! unit's sandbox in `package/`.

use serde_json::json;

use crate::util::*;

#[test]
fn flags_dir_moves_the_flag_files_out_of_the_data_dir() {
    let tmp = data_dir();
    let data = tmp.path().join("data");
    let state = tmp.path().join("state/flags");
    let state_arg = state.to_str().unwrap();
    let server = Server::spawn(tmp.path(), &["--flags-dir", state_arg]);
    let said = server.log();
    let left = format!(
        "{} holds flag files that are not served (1.json, 2.json): flags are read from {state_arg}",
        data.join("flags").display()
    );
    assert!(said.contains(&left), "{said}");
    assert!(!said.contains("cannot be written"), "{said}");

    let flag = json!({"key": "moved", "filters": {"groups": [{"rollout_percentage": 100}]}});
    let r = server.request(
        Req::post("/api/projects/1/feature_flags/", flag.to_string())
            .header("Authorization", &format!("Bearer {PERSONAL_ONE}"))
            .header("Content-Type", "application/json"),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let written = std::fs::read_to_string(state.join("1.json")).unwrap();
    assert!(written.contains("\"moved\""), "{written}");
    let untouched = std::fs::read_to_string(data.join("flags/1.json")).unwrap();
    assert!(!untouched.contains("moved"), "{untouched}");
    let decide = json!({"token": KEY_ONE, "distinct_id": "ada"}).to_string();
    let r = server.post("/decide/?v=3", decide);
    assert_eq!(r.json()["featureFlags"], json!({"moved": true}));

    // check names the files left behind, and passes once they are gone.
    let (data_arg, flags) = (data.to_str().unwrap(), ["--flags-dir", state_arg]);
    let out = flagpost(&[&["check", "--data-dir", data_arg][..], &flags].concat());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains(&format!("error: {left}")),
        "{}",
        text(&out.stdout)
    );
    for id in [1, 2] {
        std::fs::remove_file(data.join(format!("flags/{id}.json"))).unwrap();
    }
    let out = flagpost(&[&["check", "--data-dir", data_arg][..], &flags].concat());
    assert!(out.status.success(), "{}", text(&out.stdout));
    let note = format!("ok: {state_arg}/1.json: 1 flags");
    assert!(text(&out.stdout).contains(&note), "{}", text(&out.stdout));

    let eval = [
        "eval",
        "--project",
        "1",
        "--distinct-id",
        "ada",
        "--data-dir",
        data_arg,
    ];
    let out = flagpost(&[&eval[..], &flags].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = text(&out.stdout);
    assert!(
        line.starts_with("moved ") && line.contains(" true "),
        "{line}"
    );
}
