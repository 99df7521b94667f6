//! The console's finders over loopback, against what was captured: persons listed
//! newest first a page at a time and searched with PostHog's operators, events
//! filtered by a property (paging on past the examined ones), the property names and
//! values offered, a flag's reach over the stored persons and its exposures by value
//! per day; a filter the flags would refuse is a 400 that says why.

use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::console::{sign_in, Signed};
use crate::util::*;

fn get(server: &Server, s: &Signed, path: &str) -> Resp {
    server.request(Req::get(path).header("Cookie", &s.cookie))
}

fn ok(server: &Server, s: &Signed, path: &str) -> Value {
    let r = get(server, s, path);
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r.json()
}

fn ids(page: &Value) -> Vec<String> {
    page["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["distinct_ids"][0].as_str().unwrap().to_owned())
        .collect()
}

/// Persons p0 (oldest) to p11 (newest), one event each an hour apart, with a plan, an
/// age and an app version; p3 has no plan.
fn capture(server: &Server) -> usize {
    let now = OffsetDateTime::now_utc();
    let batch: Vec<Value> = (0..12i64)
        .map(|i| {
            let at = (now - time::Duration::hours(12 - i)).format(&Rfc3339).unwrap();
            let mut set = json!({"age": 20 + i, "app": format!("1.{i}.0"),
                                 "email": format!("p{i}@{}.com", if i % 2 == 0 { "even" } else { "odd" })});
            if i != 3 {
                set["plan"] = json!(if i < 6 { "free" } else { "pro" });
            }
            json!({"event": "visit", "distinct_id": format!("p{i}"), "timestamp": at,
                   "properties": {"$set": set, "n": i}})
        })
        .collect();
    let body = json!({"api_key": KEY_ONE, "batch": batch});
    assert_eq!(server.post("/batch/", body.to_string()).status, 200);
    batch.len()
}

#[test]
fn persons_and_events_are_found_by_what_was_captured() {
    let server = Server::start();
    let sent = capture(&server);
    server.wait_for_events(1, sent);
    let s = sign_in(&server, PERSONAL_ONE);
    let all = wait_for("the persons stored", || {
        let page = ok(&server, &s, "/console/api/persons?limit=200");
        (page["results"].as_array().unwrap().len() == 12).then_some(page)
    });
    let newest: Vec<String> = (0..12).rev().map(|i| format!("p{i}")).collect();
    assert_eq!(ids(&all), newest);
    assert_eq!(
        (&all["complete"], &all["scanned"]),
        (&json!(true), &json!(12))
    );

    assert_eq!(all["indexed"], true);

    // Pages of five, newest first through the first-seen index, then the short last
    // one; by offset too.
    let first = ok(&server, &s, "/console/api/persons?limit=5");
    assert_eq!(ids(&first), newest[..5]);
    assert_eq!(first["next_offset"], 5);
    let cursor = first["next_cursor"].as_str().unwrap();
    let second = ok(
        &server,
        &s,
        &format!("/console/api/persons?limit=5&cursor={cursor}"),
    );
    assert_eq!(ids(&second), newest[5..10]);
    assert_eq!(second["next_offset"], Value::Null);
    let cursor = second["next_cursor"].as_str().unwrap();
    let third = ok(
        &server,
        &s,
        &format!("/console/api/persons?limit=5&cursor={cursor}"),
    );
    assert_eq!(ids(&third), newest[10..]);
    assert_eq!(
        (&third["next_cursor"], &third["complete"]),
        (&Value::Null, &json!(true))
    );
    let last = ok(&server, &s, "/console/api/persons?limit=5&offset=10");
    assert_eq!(ids(&last), newest[10..]);
    assert_eq!(last["next_offset"], Value::Null);
    let bad = get(&server, &s, "/console/api/persons?cursor=zz");
    assert_eq!(
        (bad.status, bad.json()["detail"].clone()),
        (400, json!("cursor is not valid"))
    );

    // A distinct id prefix, through the distinct-id table, in distinct id order.
    let prefix = ok(
        &server,
        &s,
        "/console/api/persons?distinct_id_prefix=p1&limit=2",
    );
    assert_eq!(ids(&prefix), ["p1", "p10"]);
    let cursor = prefix["next_cursor"].as_str().unwrap();
    let rest = ok(
        &server,
        &s,
        &format!("/console/api/persons?distinct_id_prefix=p1&limit=2&cursor={cursor}"),
    );
    assert_eq!(ids(&rest), ["p11"]);
    assert_eq!(rest["next_cursor"], Value::Null);

    let search = |q: &str| ids(&ok(&server, &s, &format!("/console/api/persons?{q}")));
    assert_eq!(
        search("property=plan&value=pro&limit=3"),
        ["p11", "p10", "p9"]
    );
    assert_eq!(search("property=plan&operator=is_not_set"), ["p3"]);
    assert_eq!(search("property=age&operator=lt&value=22"), ["p1", "p0"]);
    assert_eq!(
        search("property=email&operator=icontains&value=ODD.&limit=2"),
        ["p11", "p9"]
    );
    assert_eq!(
        search("property=app&operator=semver_gte&value=1.10.0"),
        ["p11", "p10"]
    );
    assert_eq!(
        search("property=email&operator=regex&value=^p1[01]@"),
        ["p11", "p10"]
    );
    for bad in [
        "property=email&operator=regex&value=(",
        "property=email&operator=ends_wth&value=x",
    ] {
        let r = get(&server, &s, &format!("/console/api/persons?{bad}"));
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert!(
            r.text().contains("the property filter is not valid"),
            "{}",
            r.text()
        );
    }

    // Events by a property: the answer pages on from the last event it examined.
    let events = ok(
        &server,
        &s,
        "/console/api/events?property=n&operator=gte&value=9&limit=2",
    );
    let names: Vec<&str> = events["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["distinct_id"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["p11", "p10"]);
    let next = events["next"].as_str().unwrap();
    let cursor = next.split("cursor=").nth(1).unwrap();
    let more = ok(
        &server,
        &s,
        &format!("/console/api/events?property=n&operator=gte&value=9&limit=2&cursor={cursor}"),
    );
    assert_eq!(more["results"][0]["distinct_id"], "p9");
    assert_eq!(more["results"].as_array().unwrap().len(), 1);
    assert_eq!(more["next"], Value::Null);

    // What the forms offer.
    let names = ok(&server, &s, "/console/api/properties?of=persons");
    for name in ["age", "app", "email", "plan"] {
        assert!(
            names["names"].as_array().unwrap().contains(&json!(name)),
            "{names}"
        );
    }
    let plans = ok(&server, &s, "/console/api/properties?of=persons&key=plan");
    assert_eq!(plans["values"], json!(["pro", "free"]));
    let event_names = ok(&server, &s, "/console/api/properties?of=events");
    assert!(event_names["names"]
        .as_array()
        .unwrap()
        .contains(&json!("n")));
}

/// A database written before the first-seen index: the next start builds it in the
/// background, saying so in the log, and the list answers from it once built.
#[test]
fn an_older_database_gets_its_persons_indexed_in_the_background() {
    let tmp = data_dir();
    let mut server = Server::spawn(tmp.path(), &[]);
    let sent = capture(&server);
    server.wait_for_events(1, sent);
    let s = sign_in(&server, PERSONAL_ONE);
    let newest: Vec<String> = (0..12).rev().map(|i| format!("p{i}")).collect();
    wait_for("the persons stored", || {
        let page = ok(&server, &s, "/console/api/persons?limit=200");
        (ids(&page) == newest).then_some(())
    });
    assert_eq!(server.stop(), Some(0));

    // As an older version left it: no index, no index version. A clean stop folds
    // the index's recent changes into its runs, so its files in the tables' directory
    // (runs and manifest) are all of it.
    {
        let tables = tmp
            .path()
            .join("db")
            .join(flagpost::store::layered::DIR_NAME);
        let mut removed = 0;
        for entry in std::fs::read_dir(&tables).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if name.starts_with("persons_first_seen.") {
                std::fs::remove_file(&path).unwrap();
                removed += 1;
            }
        }
        assert!(
            removed >= 2,
            "the index's run and manifest: {removed} files"
        );
        let db = flagpost::store::check::open(&tmp.path().join("db"), 1 << 24).unwrap();
        let meta = db.open_tree("meta").unwrap();
        assert!(meta.remove("persons_first_seen.version").unwrap().is_some());
        db.flush().unwrap();
    }
    let mut server = Server::spawn(tmp.path(), &[]);
    let s = sign_in(&server, PERSONAL_ONE);
    let page = wait_for("the index built", || {
        let page = ok(&server, &s, "/console/api/persons?limit=200");
        (page["indexed"] == true).then_some(page)
    });
    assert_eq!(ids(&page), newest);
    let log = server.log();
    assert!(
        log.contains("persons are indexed by first seen in the background"),
        "{log}"
    );
    assert!(log.contains("persons indexed by first seen"), "{log}");
    assert_eq!(server.stop(), Some(0));
}

/// A database written before the index of persons by property: the next start builds
/// it in the background, and SIGKILLs while it is built lose nothing. Once built, a
/// search for a value one person has is answered from the index (one person examined,
/// not the thousands the walk would) and finds that person whichever batch of the
/// build it was in.
#[test]
fn an_index_by_property_built_across_kills_finds_every_person() {
    const PERSONS: usize = 5_000;
    let tmp = data_dir();
    let mut server = Server::spawn(tmp.path(), &[]);
    for first in (0..PERSONS).step_by(500) {
        let batch: Vec<Value> = (first..first + 500)
            .map(|i| {
                json!({"event": "visit", "distinct_id": format!("u{i}"),
                       "properties": {"$set": {"email": format!("u{i}@example.com"), "plan": i % 3}}})
            })
            .collect();
        let body = json!({"api_key": KEY_ONE, "batch": batch});
        assert_eq!(server.post("/batch/", body.to_string()).status, 200);
    }
    server.settle(1);
    assert_eq!(server.stop(), Some(0));
    // As an older version left it: no index, no index version (see above).
    {
        let tables = tmp
            .path()
            .join("db")
            .join(flagpost::store::layered::DIR_NAME);
        for entry in std::fs::read_dir(&tables).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if name.starts_with("persons_by_property.") {
                std::fs::remove_file(&path).unwrap();
            }
        }
        let db = flagpost::store::check::open(&tmp.path().join("db"), 1 << 24).unwrap();
        let meta = db.open_tree("meta").unwrap();
        assert!(meta
            .remove("persons_by_property.version")
            .unwrap()
            .is_some());
        db.flush().unwrap();
    }
    // Killed a moment after each start, a moment that grows with each start, until
    // one start finishes the build; some kills come after the build logged progress.
    let (going, built) = (
        "indexing persons by property",
        "persons indexed by property",
    );
    let (mut killed_midway, mut finished_before) = (0, false);
    for kill in 0..20u64 {
        let mut server = Server::spawn(tmp.path(), &[]);
        std::thread::sleep(std::time::Duration::from_millis(kill * 25));
        let log = server.log();
        server.kill();
        if log.contains(built) {
            finished_before = true;
            break;
        }
        killed_midway += usize::from(log.contains(going));
    }
    // The build ends in this start, or ended in the last one killed: then, if that
    // start's end was durable, this one has nothing left to build or to log. Either
    // way the console answers from the index once it is whole.
    let server = Server::spawn(tmp.path(), &[]);
    let s = sign_in(&server, PERSONAL_ONE);
    let probe = "/console/api/persons?property=email&operator=icontains&value=U0%40";
    wait_for("the index built", || {
        (ok(&server, &s, probe)["indexed"] == json!(true)).then_some(())
    });
    assert!(
        finished_before || server.log().contains(built),
        "the index answers, but no start said it was built"
    );
    for i in (0..PERSONS).step_by(97) {
        let page = ok(
            &server,
            &s,
            &format!("/console/api/persons?property=email&operator=icontains&value=U{i}%40"),
        );
        assert_eq!(ids(&page), [format!("u{i}")], "u{i}");
        assert_eq!(
            (&page["complete"], &page["scanned"]),
            (&json!(true), &json!(1))
        );
    }
    eprintln!("{killed_midway} kills after the build's progress was logged");
    assert!(killed_midway > 0, "{}", server.log());
}

#[test]
fn a_flag_reaches_the_stored_persons_it_matches_and_its_exposures_are_by_day() {
    let server = Server::start();
    let sent = capture(&server);
    let flag = json!({"key": "pro-only", "name": "Pro", "active": true, "filters": {"groups": [
        {"properties": [{"key": "plan", "operator": "exact", "value": ["pro"], "type": "person"}],
         "rollout_percentage": 100}]}});
    let r = server.request(
        Req::post("/api/projects/1/feature_flags/", flag.to_string())
            .header("Authorization", &format!("Bearer {PERSONAL_ONE}"))
            .header("Content-Type", "application/json"),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let calls: Vec<Value> = [true, true, false]
        .iter()
        .map(|v| {
            json!({"event": "$feature_flag_called", "distinct_id": "p7",
                        "properties": {"$feature_flag": "pro-only", "$feature_flag_response": v}})
        })
        .collect();
    let body = json!({"api_key": KEY_ONE, "batch": calls});
    assert_eq!(server.post("/batch/", body.to_string()).status, 200);
    server.wait_for_events(1, sent + 3);
    let s = sign_in(&server, PERSONAL_ONE);
    let reach = wait_for("the flag and the persons", || {
        let r = get(&server, &s, "/console/api/flag_reach?key=pro-only");
        (r.status == 200 && r.json()["scanned"] == 12).then(|| r.json())
    });
    assert_eq!(reach["reached"], 6, "{reach}");
    assert_eq!(reach["values"], json!({"true": 6}));
    let mut reached = ids(&json!({"results": reach["examples"]}));
    reached.sort();
    assert_eq!(reached, ["p10", "p11", "p6", "p7", "p8", "p9"]);

    let x = ok(
        &server,
        &s,
        "/console/api/flag_exposures?key=pro-only&interval=day&hours=48",
    );
    let sum = |v: &str| -> u64 {
        x["values"][v]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .sum()
    };
    assert_eq!((sum("true"), sum("false")), (2, 1), "{x}");
    assert_eq!(
        x["values"]["true"].as_array().unwrap().len(),
        x["buckets"].as_array().unwrap().len()
    );
    let r = get(&server, &s, "/console/api/flag_exposures?interval=day");
    assert_eq!(r.status, 400);
}
