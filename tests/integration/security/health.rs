//! The console's health page shows a signed-in key the problems of its own project's
//! files only: another project's flag, survey and early access files, and files that
//! belong to no project, are not its business unless its project is the server's only
//! one.

use serde_json::{json, Value};

use crate::console::sign_in;
use crate::util::*;

/// The health page as the session of `cookie` sees it.
fn health(server: &Server, cookie: &str) -> Value {
    let r = server.request(Req::get("/console/api/health").header("Cookie", cookie));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// Its reload errors, each as (of, file name), sorted.
fn errors(health: &Value) -> Vec<(String, String)> {
    let mut seen: Vec<(String, String)> = health["reload_errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["of"].as_str().unwrap().to_owned(), file_of(e)))
        .collect();
    seen.sort();
    seen
}

/// The file an error line names, without its folder (the lines start `<path>: `).
fn file_of(error: &Value) -> String {
    let line = error["problem"].as_str().unwrap();
    let path = line.split(": ").next().unwrap();
    path.rsplit('/').next().unwrap().to_owned()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

/// Broken files: project 2's flags and surveys, project 1's early access features, and
/// a flag file named for no project (`02.json` is not how project 2 is written).
fn break_files(data: &std::path::Path) {
    for dir in ["surveys", "early_access"] {
        std::fs::create_dir_all(data.join(dir)).unwrap();
    }
    write_atomically(&data.join("flags/2.json"), r#"{"flags": ["#);
    write_atomically(&data.join("surveys/2.json"), "not json");
    write_atomically(
        &data.join("early_access/1.json"),
        r#"{"earlyAccessFeatures": 7}"#,
    );
    write_atomically(&data.join("flags/02.json"), r#"{"flags": []}"#);
}

#[test]
fn a_key_sees_its_own_projects_reload_errors_only() {
    let server = Server::start();
    let one = sign_in(&server, PERSONAL_ONE);
    let two = sign_in(&server, PERSONAL_TWO);
    let _another_of_two = sign_in(&server, PERSONAL_TWO);
    break_files(&server.data());
    let twos = pairs(&[("flags", "2.json"), ("surveys", "2.json")]);
    wait_for("project 2's errors on its health page", || {
        (errors(&health(&server, &two.cookie)) == twos).then_some(())
    });
    wait_for("project 1's error on its health page", || {
        let seen = errors(&health(&server, &one.cookie));
        (!seen.is_empty()).then_some(())
    });
    let page = health(&server, &one.cookie);
    assert_eq!(errors(&page), pairs(&[("early_access", "1.json")]));
    // Nothing of the other project's lines, whatever their wording, and only its own
    // sessions counted.
    assert!(!page.to_string().contains("2.json"), "{page}");
    assert_eq!(page["sessions"], 1);
    assert_eq!(health(&server, &two.cookie)["sessions"], 2);
}

#[test]
fn the_only_projects_key_sees_every_problem() {
    let tmp = data_dir();
    let data = tmp.path().join("data");
    write_atomically(
        &data.join("projects.json"),
        json!({"projects": [{"id": 1, "name": "one", "api_key": KEY_ONE,
                             "personal_api_keys": [PERSONAL_ONE]}]})
        .to_string(),
    );
    std::fs::remove_file(data.join("flags/2.json")).unwrap();
    let mut server = Server::spawn(tmp.path(), &[]);
    server.keep(tmp);
    break_files(&data);
    // With one project, every problem is the one project's to see, those of files of
    // no project and of project ids not listed too: nobody else could be shown them.
    let all = pairs(&[
        ("early_access", "1.json"),
        ("flags", "02.json"),
        ("flags", "2.json"),
        ("surveys", "2.json"),
    ]);
    let one = sign_in(&server, PERSONAL_ONE);
    wait_for("every error on the health page", || {
        (errors(&health(&server, &one.cookie)) == all).then_some(())
    });
}
