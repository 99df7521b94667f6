//! Starting and keeping a server current as an operator meets it: start-up errors
//! name the address or path and say what to do, a closed pipe ends a command quietly,
//! and `projects.json` is picked up on change like the flag files, without a signal.

use std::path::Path;
use std::process::{Command, Output, Stdio};
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

/// `flagpost serve` on `data` with these flags; it is expected to fail at start.
fn serve_failing(data: &Path, db: &Path, listen: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_flagpost"))
        .args(["serve", "--listen", listen, "--data-dir"])
        .arg(data)
        .arg("--db")
        .arg(db)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn flagpost");
    let deadline = Instant::now() + WAIT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("flagpost serve did not stop at start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_port_in_use_is_named() {
    let tmp = data_dir();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let db = tmp.path().join("db");
    let out = serve_failing(&tmp.path().join("data"), &db, &addr.to_string());
    assert_eq!(out.status.code(), Some(1));
    let expected = format!(
        "flagpost: cannot listen on {addr}: Address already in use (os error 98); another \
         process (another flagpost?) is listening there: stop it, or choose another address \
         with --listen\n"
    );
    assert!(stderr(&out).ends_with(&expected), "{}", stderr(&out));
}

#[test]
fn a_database_directory_that_cannot_be_made_is_named() {
    let tmp = data_dir();
    // Under a regular file: no user, root included, can create it.
    let file = tmp.path().join("not-a-dir");
    std::fs::write(&file, "").unwrap();
    let db = file.join("db");
    let out = serve_failing(&tmp.path().join("data"), &db, "127.0.0.1:0");
    assert_eq!(out.status.code(), Some(1));
    let expected = format!(
        "flagpost: database {}: cannot create it: Not a directory (os error 20); the \
         server's user must be able to create and write it: fix its permissions, or choose \
         another --db\n",
        db.display()
    );
    assert!(stderr(&out).ends_with(&expected), "{}", stderr(&out));
}

#[test]
fn a_database_in_use_by_another_server_is_named() {
    let server = Server::start();
    let db = server.dir.join("db");
    let out = serve_failing(&server.data(), &db, "127.0.0.1:0");
    assert_eq!(out.status.code(), Some(1));
    let expected = format!(
        "flagpost: database {}: already in use by another flagpost; stop that server first, \
         or give this one its own --db\n",
        db.display()
    );
    assert!(stderr(&out).ends_with(&expected), "{}", stderr(&out));
    assert!(!stderr(&out).contains("WouldBlock"));
    // The running server is untouched.
    let event = json!({"event": "e", "distinct_id": "d", "api_key": KEY_ONE});
    assert_eq!(server.post("/capture/", event.to_string()).status, 200);
}

/// A command whose standard output is a pipe nobody reads, as in `flagpost check | head`
/// once head has exited.
fn with_closed_stdout(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Command::new(env!("CARGO_BIN_EXE_flagpost"))
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn a_closed_pipe_ends_a_command_quietly() {
    let tmp = data_dir();
    let data = tmp.path().join("data");
    let dir = data.to_str().unwrap();
    let out = with_closed_stdout(&["check", "--data-dir", dir]);
    assert_eq!((out.status.code(), stderr(&out)), (Some(0), String::new()));
    let args = [
        "eval",
        "--data-dir",
        dir,
        "--project",
        "1",
        "--distinct-id",
        "u",
    ];
    let out = with_closed_stdout(&args);
    assert_eq!((out.status.code(), stderr(&out)), (Some(0), String::new()));
    let out = with_closed_stdout(&["key", "new"]);
    assert_eq!(
        (out.status.code(), stderr(&out).contains("panicked")),
        (Some(0), false)
    );
    // check still fails on errors, without a word about the pipe.
    std::fs::write(data.join("flags/1.json"), "{").unwrap();
    let out = with_closed_stdout(&["check", "--data-dir", dir]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out), format!("flagpost: {dir} has 1 error(s)\n"));
}
