//! The commands of README.md and docs/ that run on a laptop, run as written against a
//! real server (127.0.0.1, port 0) on a copy of the repository's demo `data/`.
//!
//! The convention, which the docs follow:
//! - A fenced block opened with ```` ```sh tested ```` is run by `sh -e` in the
//!   server's directory (its `data/` and `db/` beside each other, as in a checkout, and
//!   `var/tour` naming the same `data/`, as the README's tour starts the server on a
//!   copy there), with
//!   `localhost:8000` replaced by the server's address and `cargo run --release --` by
//!   the built binary (also on `PATH` as `flagpost`). It must exit 0.
//! - Lines starting with `#> ` in such a block are the output the commands above them
//!   print (since the previous `#> ` lines): each line must match, in order; `...` in a
//!   line stands for any text, and a line of just `...` for any lines. Reads of what
//!   was just captured are stored within a second, so a block whose output differs is
//!   run again for up to [`RETRY_FOR`]; blocks that capture answer at once.
//! - A block opened with ```` ```json flag ```` is a flag the reader adds to
//!   `data/flags/1.json`: it is appended to that file's `flags` and the following
//!   blocks run once the server answers it.
//!
//! Each file gets a fresh server. Blocks not marked are not run here, for these reasons
//! and with these tests covering them instead: the deployment commands (sudo, systemd,
//! `/etc`, nginx, certbot, ufw) need root and a VM: `ops.rs` runs the unit through
//! `systemd/verify.sh` and the shipped nginx site in front of the real binary,
//! `package/` builds and installs the Debian package and runs the installed unit's
//! command (key commands, backups, the flags folder), and `nodes.rs` the several-nodes
//! nginx configuration; the ClickHouse commands need
//! `clickhouse-server`: `sink/end_to_end.rs` runs a server with the sink's flags, and
//! `sink/queries.rs` and `sink/current.rs` run docs/clickhouse.md's SQL; fetching
//! posthog-js (`npm pack`) and opening a page in a browser need the network and a
//! browser: `sdk/browser/` loads posthog-js's files from flagpost's `/static/`, and
//! the SDK snippets of docs/clients.md are what `tests/sdk/` runs; `cargo test`,
//! `cargo bench` and `cargo fuzz` are the development commands CI runs itself.
//!
//! Needs `sh` and `curl` (the tour's client), so it is `#[ignore]`d with that reason.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::*;

const REPO: &str = env!("CARGO_MANIFEST_DIR");
/// How long a block whose output differs is retried.
const RETRY_FOR: Duration = Duration::from_secs(5);
/// Where the README's tour copies the demo data and serves it from.
const TOUR_DATA: &str = "var/tour";
/// Printed between the parts of a block's output that `#> ` lines check.
const MARK: &str = "@@docs-part@@";

/// One runnable piece of a document, in order.
#[derive(Debug)]
enum Block {
    /// Shell text and, per part, the output lines expected of it.
    Sh { parts: Vec<(String, Vec<String>)> },
    /// A flag to append to `data/flags/1.json`.
    Flag(serde_json::Value),
}

/// The runnable blocks of a markdown text.
fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let kind = match line.trim_end() {
            "```sh tested" => "sh",
            "```json flag" => "flag",
            _ => continue,
        };
        let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
        if kind == "flag" {
            let flag = serde_json::from_str(&body.join("\n")).expect("a ```json flag block");
            out.push(Block::Flag(flag));
            continue;
        }
        let mut parts = vec![(String::new(), Vec::new())];
        for l in body {
            if let Some(expected) = l.strip_prefix("#> ") {
                parts.last_mut().unwrap().1.push(expected.to_string());
            } else {
                if !parts.last().unwrap().1.is_empty() {
                    parts.push((String::new(), Vec::new()));
                }
                let script = &mut parts.last_mut().unwrap().0;
                script.push_str(l);
                script.push('\n');
            }
        }
        out.push(Block::Sh { parts });
    }
    out
}

/// Whether `line` matches `pattern`, where `...` stands for any text.
fn line_matches(pattern: &str, line: &str) -> bool {
    let pieces: Vec<&str> = pattern.split("...").collect();
    let (first, last) = (pieces[0], pieces[pieces.len() - 1]);
    if pieces.len() == 1 {
        return line == pattern;
    }
    if !line.starts_with(first) || !line.ends_with(last) || line.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &line[first.len()..line.len() - last.len()];
    for piece in &pieces[1..pieces.len() - 1] {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    true
}

/// Whether the output lines match the expected ones; a `...` line takes any lines.
fn lines_match(expected: &[String], output: &[&str]) -> bool {
    match expected.split_first() {
        None => output.is_empty(),
        Some((e, rest)) if e == "..." => {
            (0..=output.len()).any(|i| lines_match(rest, &output[i..]))
        }
        Some((e, rest)) => {
            !output.is_empty() && line_matches(e, output[0]) && lines_match(rest, &output[1..])
        }
    }
}

/// A server on a copy of the demo data, with a `bin/flagpost` beside it.
fn demo_server() -> (Server, tempfile::TempDir) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    for sub in ["flags", "surveys", "early_access"] {
        std::fs::create_dir_all(data.join(sub)).unwrap();
        let from = Path::new(REPO).join("data").join(sub).join("1.json");
        std::fs::copy(&from, data.join(sub).join("1.json")).expect("demo file");
    }
    std::fs::copy(
        Path::new(REPO).join("data/projects.json"),
        data.join("projects.json"),
    )
    .unwrap();
    // The README's tour serves a copy of the demo data in var/tour.
    std::fs::create_dir(tmp.path().join("var")).unwrap();
    std::os::unix::fs::symlink("../data", tmp.path().join(TOUR_DATA)).unwrap();
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_flagpost"), bin.join("flagpost")).unwrap();
    let server = Server::spawn(tmp.path(), &[]);
    (server, tmp)
}

/// Run one shell block in `dir` against `server`; the output of each part, or a
/// failure message.
fn run_sh(server: &Server, dir: &Path, parts: &[(String, Vec<String>)]) -> Vec<String> {
    let mut script = String::new();
    for (text, _) in parts {
        let text = text
            .replace("localhost:8000", &server.addr.to_string())
            .replace("cargo run --release -- ", "flagpost ");
        script.push_str(&text);
        script.push_str(&format!("printf '\\n{MARK}\\n'\n"));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![dir.join("bin")];
    paths.extend(std::env::split_paths(&path));
    let mut child = Command::new(crate::ops::tool("sh"))
        .arg("-ec")
        .arg(&script)
        .current_dir(dir)
        .env("PATH", std::env::join_paths(paths).unwrap())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sh");
    let deadline = Instant::now() + WAIT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("timed out running:\n{script}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?} running:\n{script}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut pieces: Vec<String> = stdout
        .split(&format!("\n{MARK}\n"))
        .map(str::to_string)
        .collect();
    pieces.truncate(parts.len());
    pieces
}

/// Add a flag to the copy's `data/flags/1.json` and wait until `/decide` knows it.
fn add_flag(server: &Server, dir: &Path, flag: &serde_json::Value) {
    let path = dir.join("data/flags/1.json");
    let mut file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    file["flags"]
        .as_array_mut()
        .expect("flags")
        .push(flag.clone());
    write_atomically(&path, serde_json::to_vec_pretty(&file).unwrap());
    let key = flag["key"].as_str().expect("the flag's key");
    let body = r#"{"token":"phc_demo_project_key_change_me","distinct_id":"docs"}"#;
    wait_for("the new flag", || {
        let r = server.post("/decide/?v=3", body);
        r.json()["featureFlags"].get(key).map(|_| ())
    });
}

/// Run every block of one document; the number of blocks run.
fn run_document(name: &str) -> usize {
    let text = std::fs::read_to_string(Path::new(REPO).join(name)).expect(name);
    let blocks = blocks(&text);
    if blocks.is_empty() {
        return 0;
    }
    let (server, tmp) = demo_server();
    let dir = tmp.path();
    for block in &blocks {
        match block {
            Block::Flag(flag) => add_flag(&server, dir, flag),
            Block::Sh { parts } => {
                let started = Instant::now();
                loop {
                    let outputs = run_sh(&server, dir, parts);
                    let differs = parts.iter().zip(&outputs).find(|((_, want), got)| {
                        let got: Vec<&str> = got.lines().filter(|l| !l.is_empty()).collect();
                        !lines_match(want, &got)
                    });
                    let Some(((script, want), got)) = differs else {
                        break;
                    };
                    assert!(
                        started.elapsed() < RETRY_FOR,
                        "{name}: the output of\n{script}\nis\n{got}\nnot as the docs show:\n{}",
                        want.join("\n")
                    );
                    std::thread::sleep(Duration::from_millis(250));
                }
            }
        }
    }
    blocks.len()
}

/// The documents: README.md and every file in docs/.
fn documents() -> Vec<String> {
    let mut names = vec!["README.md".to_string()];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(Path::new(REPO).join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    names.extend(
        docs.iter()
            .map(|p| format!("docs/{}", p.file_name().unwrap().to_string_lossy())),
    );
    names
}

#[test]
#[ignore = "needs sh and curl: run by .ci/run, cargo test -- --include-ignored"]
fn every_laptop_command_in_the_docs_runs_as_written() {
    crate::ops::tool("curl");
    let mut ran = Vec::new();
    for name in documents() {
        ran.push((name.clone(), run_document(&name)));
    }
    // The tour is the point: it must never lose its marks and pass by running nothing.
    let readme = ran.iter().find(|(n, _)| n == "README.md").unwrap().1;
    assert!(
        readme >= 5,
        "README.md has only {readme} runnable blocks: {ran:?}"
    );
    eprintln!("runnable blocks run: {ran:?}");
}

#[test]
fn the_output_patterns_match_as_documented() {
    assert!(line_matches("a...c", "abbbc"));
    assert!(!line_matches("a...c", "abbb"));
    assert!(line_matches(
        r#"{"x":...,"y":1...}"#,
        r#"{"x":[1,2],"y":1,"z":2}"#
    ));
    assert!(!line_matches("abc", "abcd"));
    assert!(!line_matches("ab...ba", "aba"));
    let out = ["one", "two", "three"];
    assert!(lines_match(&["...".into(), "three".into()], &out));
    assert!(lines_match(&["one".into(), "...".into()], &out));
    assert!(!lines_match(&["one".into(), "three".into()], &out));
    let parsed = blocks("x\n```sh tested\necho a\n#> a\necho b\n```\n```sh\nnot run\n```\n");
    let [Block::Sh { parts }] = &parsed[..] else {
        panic!("{parsed:?}")
    };
    assert_eq!(
        parts,
        &[
            ("echo a\n".to_string(), vec!["a".to_string()]),
            ("echo b\n".to_string(), vec![]),
        ]
    );
}

/// The tour changes files (a flag added, the console's writes), so it works on its copy
/// in `var/tour`: every command of it that reads or serves a data dir names the copy,
/// and it never tells the reader to edit the repository's `data/`.
#[test]
fn the_readme_tour_works_on_a_copy_of_the_demo_data() {
    let text = std::fs::read_to_string(Path::new(REPO).join("README.md")).expect("README.md");
    let start = text.find("## Five minutes").expect("the tour");
    let end = start + text[start..].find("\n## ").expect("the section after it");
    let tour = &text[start..end];
    assert!(tour.contains(&format!("cp -r data {TOUR_DATA}")), "{tour}");
    for command in ["serve", "check", "eval"] {
        let run = format!("cargo run --release -- {command}");
        let uses: Vec<&str> = tour.lines().filter(|l| l.contains(&run)).collect();
        assert!(!uses.is_empty(), "the tour runs {command}");
        for line in uses {
            assert!(line.contains(&format!("--data-dir {TOUR_DATA}")), "{line}");
        }
    }
    for edited in ["`data/flags/", "data/static/*", "p data/static"] {
        assert!(
            !tour.contains(edited),
            "the tour edits the repository's {edited}"
        );
    }
    assert!(
        tour.contains("/console/"),
        "the tour signs into the console"
    );
}
