//! A person's events and the events of a name through the read API: `distinct_id`,
//! `person_id` (every distinct id of the person, as PostHog answers it), `event`, and
//! those together and with `after`/`before`, page by page, the same whether the event
//! index answers or, on a database stored without it, the scan does while the index
//! is built in the background; SIGKILLs in the middle of that build and in the middle
//! of the index's folds and merges.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::*;

/// Anonymous and identified distinct ids: `anon-k` becomes `user-k` by `$identify`.
const PEOPLE: usize = 20;
const BATCH: usize = 500;
const HOUR_MS: i64 = 3_600_000;
/// Events are scattered over this many hours, so nearly every event of a chunk makes a
/// block of its own and the index's folds and build batches come soon.
const HOURS: i64 = 3_000;

/// `BATCH` events numbered from `first`, in sending order, scattered over `HOURS`.
fn batch(first: usize) -> String {
    let now = flagpost::support::clock::now_ms();
    let batch: Vec<Value> = (first..first + BATCH)
        .map(|n| {
            let who = match n % 2 {
                0 => format!("anon-{}", n / 2 % PEOPLE),
                _ => format!("user-{}", n / 2 % PEOPLE),
            };
            let ts = now - (n as i64 * 7_919 % HOURS) * HOUR_MS - n as i64;
            json!({"event": format!("e{}", n % 3), "distinct_id": who,
                   "timestamp": flagpost::support::clock::format_ms(ts),
                   "properties": {"n": n}})
        })
        .collect();
    json!({"api_key": KEY_ONE, "batch": batch}).to_string()
}

fn capture(server: &Server, batches: std::ops::Range<usize>) {
    for b in batches {
        let r = server.post("/batch/", batch(b * BATCH));
        assert_eq!(r.status, 200, "{}", r.text());
    }
}

fn identify(server: &Server) {
    let identify: Vec<Value> = (0..PEOPLE)
        .map(|k| {
            json!({"event": "$identify", "distinct_id": format!("user-{k}"),
                   "properties": {"$anon_distinct_id": format!("anon-{k}")}})
        })
        .collect();
    let body = json!({"api_key": KEY_ONE, "batch": identify}).to_string();
    assert_eq!(server.post("/batch/", body).status, 200);
}

/// Every page of `query`, 7 at a time, following `next`; the events' ids in order.
fn pages(server: &Server, query: &str) -> Vec<String> {
    let mut path = format!("/api/projects/1/events/?{query}&limit=7");
    let mut out = Vec::new();
    loop {
        let r = server.api(&path, PERSONAL_ONE);
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        let page = r.json();
        let results = page["results"].as_array().unwrap().clone();
        assert!(results.len() <= 7);
        out.extend(results.iter().map(|e| e["id"].as_str().unwrap().to_owned()));
        match page["next"].as_str() {
            Some(next) => path = next[next.find("/api/").unwrap()..].to_owned(),
            None => return out,
        }
    }
}

/// What each query must answer: whether a stored event is one of its events.
type Queries = Vec<(String, Box<dyn Fn(&Value) -> bool>)>;

/// Queries by a few distinct ids and persons, by names, by both and with a time range
/// (`after` and `before` from the stored events' times, so that it holds some).
fn queries(persons: &BTreeMap<usize, String>, stored: &[Value]) -> Queries {
    let field = |e: &Value, f: &str| e[f].as_str().unwrap_or_default().to_owned();
    let at = |i: usize| field(&stored[i], "timestamp");
    let (after, before) = (at(stored.len() * 2 / 3), at(stored.len() / 3));
    let mut out: Queries = Vec::new();
    for k in [0, 7, 19] {
        let (anon, user) = (format!("anon-{k}"), format!("user-{k}"));
        for id in [anon.clone(), user.clone()] {
            let d = id.clone();
            out.push((
                format!("distinct_id={id}"),
                Box::new(move |e: &Value| field(e, "distinct_id") == d),
            ));
        }
        let both = move |e: &Value| [&anon, &user].contains(&&field(e, "distinct_id"));
        let person = &persons[&k];
        out.push((format!("person_id={person}"), Box::new(both.clone())));
        out.push((
            format!("person_id={person}&event=e2"),
            Box::new(move |e: &Value| both(e) && field(e, "event") == "e2"),
        ));
    }
    for (query, name) in [("e1", "e1"), ("%24identify", "$identify"), ("none", "none")] {
        out.push((
            format!("event={query}"),
            Box::new(move |e: &Value| field(e, "event") == name),
        ));
    }
    out.push((
        "event=e0&distinct_id=anon-7".into(),
        Box::new(move |e: &Value| field(e, "event") == "e0" && field(e, "distinct_id") == "anon-7"),
    ));
    let (a, b) = (after.clone(), before.clone());
    out.push((
        format!("event=e2&after={after}&before={before}"),
        Box::new(move |e: &Value| {
            let t = field(e, "timestamp");
            field(e, "event") == "e2" && a <= t && t < b
        }),
    ));
    out
}

/// The answers of the queries, by query.
fn answers(server: &Server, queries: &Queries) -> BTreeMap<String, Vec<String>> {
    queries
        .iter()
        .map(|(q, _)| (q.clone(), pages(server, q)))
        .collect()
}

/// What the answers must be, from every stored event (newest first).
fn expected(stored: &[Value], queries: &Queries) -> BTreeMap<String, Vec<String>> {
    let ids = |keep: &dyn Fn(&Value) -> bool| -> Vec<String> {
        stored
            .iter()
            .filter(|e| keep(e))
            .map(|e| e["id"].as_str().unwrap().to_owned())
            .collect()
    };
    queries
        .iter()
        .map(|(q, keep)| (q.clone(), ids(keep)))
        .collect()
}

fn persons(server: &Server) -> BTreeMap<usize, String> {
    (0..PEOPLE)
        .map(|k| {
            let r = server.api(
                &format!("/api/projects/1/persons/?distinct_id=anon-{k}"),
                PERSONAL_ONE,
            );
            let p = &r.json()["results"][0];
            let mut ids: Vec<&str> = p["distinct_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_str().unwrap())
                .collect();
            ids.sort();
            assert_eq!(ids, [format!("anon-{k}"), format!("user-{k}")]);
            (k, p["id"].as_str().unwrap().to_owned())
        })
        .collect()
}

fn index_dir(dir: &Path) -> PathBuf {
    dir.join("db").join("event_index")
}

/// The index's files: its manifest and runs, those being made too.
fn index_files(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(index_dir(dir)) {
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Wait until the log is applied: after the kills it holds what the paced batches
/// left, which a busy machine may take longer than `settle`'s wait to apply.
fn applied(server: &Server) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !server
        .get("/metrics")
        .text()
        .lines()
        .any(|l| l == "flagpost_log_depth 0")
    {
        assert!(
            Instant::now() < deadline,
            "the log was not applied:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What `check --db` says of the index.
fn check_says(dir: &Path) -> String {
    let out = flagpost(&["check", "--db", dir.join("db").to_str().unwrap()]);
    let text = text(&out.stdout);
    assert!(out.status.success(), "{text}");
    text.lines()
        .find(|l| l.contains("event index:"))
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn a_persons_events_page_alike_through_the_index_and_a_killed_build() {
    let tmp = data_dir();
    let mut server = Server::spawn(tmp.path(), &[]);
    capture(&server, 0..24);
    identify(&server);
    let stored = server.settle(1);
    assert_eq!(stored.len(), 24 * BATCH + PEOPLE);
    let persons = persons(&server);
    let queries = queries(&persons, &stored);
    let want = expected(&stored, &queries);
    for (q, ids) in &want {
        let least = match q.as_str() {
            "event=none" => 0,
            q if q.contains("event=") => PEOPLE,
            _ => 200,
        };
        assert!(ids.len() >= least, "{q}: {}", ids.len());
    }
    assert_eq!(answers(&server, &queries), want, "through the index");
    let r = server.api("/api/projects/1/events/?person_id=nope", PERSONAL_ONE);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(server.stop(), Some(0));
    // A clean stop wrote the recent part out: everything is covered.
    let says = check_says(tmp.path());
    assert!(says.contains(" 0 blocks stored since"), "{says}");

    // As a database stored before the index: killed in the middle of the build, when
    // it has written a batch and not yet the last.
    std::fs::remove_dir_all(index_dir(tmp.path())).unwrap();
    let mut server = Server::spawn(tmp.path(), &[]);
    wait_for("a batch of the build", || {
        server
            .log()
            .contains("building the event index from stored blocks")
            .then_some(())
    });
    server.kill();
    let log = server.log();
    assert!(!log.contains("event index built"), "{log}");
    let says = check_says(tmp.path());
    assert!(!says.contains(" 0 blocks stored since"), "{says}");
    assert!(index_files(tmp.path()).iter().any(|f| f.ends_with(".run")));

    let server = Server::spawn(tmp.path(), &[]);
    // The scan answers while the build is under way, the index after: the same.
    assert_eq!(answers(&server, &queries), want, "while building");
    wait_for("the index build to end", || {
        server.log().contains("event index built").then_some(())
    });
    assert_eq!(answers(&server, &queries), want, "after the build");
    // New events go through the compactor's recent part beside the built runs.
    let r = server.post(
        "/capture/",
        json!({"api_key": KEY_ONE, "event": "late", "distinct_id": "anon-0"}).to_string(),
    );
    assert_eq!(r.status, 200);
    let all = server.settle(1);
    let newest = pages(&server, &format!("person_id={}", persons[&0]));
    assert_eq!(
        newest.len(),
        want[&format!("person_id={}", persons[&0])].len() + 1
    );
    assert_eq!(newest[0], all[0]["id"].as_str().unwrap());
    let mut server = server;
    assert_eq!(server.stop(), Some(0));
    let says = check_says(tmp.path());
    assert!(says.contains(" 0 blocks stored since"), "{says}");
}

#[test]
fn a_persons_events_survive_kills_during_folds_and_merges_of_the_index() {
    /// Cycles killed while a run of the index is being written.
    const KILLS: usize = 3;
    let tmp = data_dir();
    let mut server = Server::spawn(tmp.path(), &[]);
    capture(&server, 0..2);
    identify(&server);
    server.settle(1);
    let persons = persons(&server);
    let mut next = 2;
    let mut killed_mid_write = 0;
    for _cycle in 0..40 {
        if killed_mid_write >= KILLS {
            break;
        }
        // Batches go in while the index folds; a watcher kills the server the moment
        // it sees a run being made (a `.run.new`).
        let (addr, pid) = (server.addr, server.pid().to_string());
        let stop = AtomicBool::new(false);
        let mid_write = std::thread::scope(|s| {
            let watcher = s.spawn(|| {
                let deadline = Instant::now() + WAIT;
                let seen = loop {
                    let making = index_files(tmp.path())
                        .into_iter()
                        .find(|f| f.ends_with(".run.new"));
                    if making.is_some() || Instant::now() > deadline {
                        break making;
                    }
                };
                let killed = std::process::Command::new("kill")
                    .args(["-9", &pid])
                    .status()
                    .unwrap();
                assert!(killed.success());
                stop.store(true, Ordering::SeqCst);
                // Killed before the run was renamed into place.
                seen.is_some_and(|f| index_dir(tmp.path()).join(f).exists())
            });
            while !stop.load(Ordering::SeqCst) {
                let _ = try_send(addr, Req::post("/batch/", batch(next * BATCH)));
                next += 1;
                // Paced, so the log stays short enough to be applied soon after a kill.
                std::thread::sleep(Duration::from_millis(50));
            }
            watcher.join().unwrap()
        });
        server.kill();
        killed_mid_write += usize::from(mid_write);
        server = Server::spawn(tmp.path(), &[]);
    }
    assert!(
        killed_mid_write >= KILLS,
        "{killed_mid_write} kills while a run was written"
    );
    applied(&server);
    let stored = server.settle(1);
    let queries = queries(&persons, &stored);
    assert_eq!(answers(&server, &queries), expected(&stored, &queries));
    // No run left half made, and merges kept the runs few: at most the limit, one
    // more the worker had yet to merge, and the recent part a clean stop writes out.
    assert_eq!(server.stop(), Some(0));
    let files = index_files(tmp.path());
    assert!(files.iter().all(|f| !f.ends_with(".new")), "{files:?}");
    let runs = files.iter().filter(|f| f.ends_with(".run")).count();
    assert!(
        (1..=flagpost::store::event_index::MAX_RUNS + 2).contains(&runs),
        "{files:?}"
    );
    let says = check_says(tmp.path());
    assert!(says.contains(" 0 blocks stored since"), "{says}");
}
