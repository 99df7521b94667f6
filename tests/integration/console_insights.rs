//! The console's insights read from rollups: the JSON endpoints its page calls
//! (counts, unique persons per bucket and over the whole range, top events, exposures,
//! survey responses) equal exact counts of the stored events, a range given by its
//! start and end buckets from the hour it starts in, and a database without rollups
//! (as an older version left it) is backfilled on start to the same answers.

use std::collections::{BTreeMap, HashSet};

use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::console::{sign_in, Signed};
use crate::util::*;

fn get(server: &Server, s: &Signed, path: &str) -> Value {
    let r = server.request(Req::get(path).header("Cookie", &s.cookie));
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r.json()
}

fn ms(text: &str) -> i64 {
    let t = OffsetDateTime::parse(text, &Rfc3339).unwrap();
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

/// Events over the last five days: pageviews and signups of a few persons, flag
/// calls and survey responses.
fn capture(server: &Server) -> usize {
    let now = OffsetDateTime::now_utc();
    let mut batch = Vec::new();
    for i in 0..60i64 {
        let at = now - time::Duration::minutes(i * 97 % (5 * 24 * 60));
        let ts = at.format(&Rfc3339).unwrap();
        let response = [json!("test"), json!("control"), json!(true)][(i % 3) as usize].clone();
        let answer = ["yes", "no"][(i / 4 % 2) as usize];
        let (event, properties) = match i % 4 {
            0 => ("$pageview", json!({})),
            1 => ("signup", json!({})),
            2 => (
                "$feature_flag_called",
                json!({"$feature_flag": "f", "$feature_flag_response": response}),
            ),
            _ => (
                "survey sent",
                json!({"$survey_id": "s1", "$survey_name": "Survey one", "$survey_response": answer}),
            ),
        };
        batch.push(json!({"event": event, "distinct_id": format!("u{}", i % 7),
                          "timestamp": ts, "properties": properties}));
    }
    let body = json!({"api_key": KEY_ONE, "batch": batch});
    assert_eq!(server.post("/batch/", body.to_string()).status, 200);
    batch.len()
}

/// Everything the insights page asks for, over the last 7 days.
fn insights(server: &Server, s: &Signed) -> Value {
    let q = "hours=168&interval=day&event=signup&event=%24pageview&event=none";
    json!({
        "counts": get(server, s, &format!("/console/api/insights/counts?{q}")),
        "hours": get(server, s, "/console/api/insights/counts?hours=168&interval=hour&event=signup"),
        "range": get(server, s, &format!("/console/api/insights/counts?interval=day&event=signup&from={}&to={}",
            range().0, range().1)),
        "top": get(server, s, "/console/api/insights/top?hours=168"),
        "exposures": get(server, s, "/console/api/exposures?hours=168"),
        "surveys": get(server, s, "/console/api/insights/surveys?hours=168"),
    })
}

/// Three days up to now, starting at 05:00 UTC as a viewer's local midnight might.
fn range() -> (i64, i64) {
    let now = OffsetDateTime::now_utc();
    let day = (now.unix_timestamp() / 86_400 - 3) * 86_400_000;
    (
        day + 5 * 3_600_000,
        (now.unix_timestamp_nanos() / 1_000_000) as i64,
    )
}

/// The distinct persons of an event over the buckets' whole span, as the read API
/// stores them: the whole range's unique count is theirs, not the buckets' sum.
fn expected_range(stored: &[Value], counts: &Value, event: &str) -> (u64, u64) {
    let buckets = counts["buckets"].as_array().unwrap();
    let step = counts["interval_seconds"].as_i64().unwrap() * 1000;
    let first = ms(buckets[0].as_str().unwrap());
    let end = first + step * buckets.len() as i64;
    let mut total = 0;
    let mut who = HashSet::new();
    for e in stored.iter().filter(|e| e["event"] == event) {
        let t = ms(e["timestamp"].as_str().unwrap());
        if t >= first && t < end {
            total += 1;
            who.insert(
                e["person_id"]
                    .as_str()
                    .or(e["distinct_id"].as_str())
                    .unwrap()
                    .to_owned(),
            );
        }
    }
    (total, who.len() as u64)
}

/// The chart's numbers counted from the stored events: per bucket, each event's
/// total and its distinct persons.
fn expected_series(stored: &[Value], counts: &Value, event: &str) -> (Vec<u64>, Vec<u64>) {
    let buckets: Vec<i64> = counts["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| ms(b.as_str().unwrap()))
        .collect();
    let step = counts["interval_seconds"].as_i64().unwrap() * 1000;
    let mut totals = vec![0u64; buckets.len()];
    let mut who = vec![HashSet::new(); buckets.len()];
    for e in stored.iter().filter(|e| e["event"] == event) {
        let t = ms(e["timestamp"].as_str().unwrap());
        let i = ((t - buckets[0]) / step) as usize;
        if t < buckets[0] || i >= totals.len() {
            continue;
        }
        totals[i] += 1;
        let person = e["person_id"].as_str().or(e["distinct_id"].as_str());
        who[i].insert(person.unwrap().to_owned());
    }
    (totals, who.iter().map(|w| w.len() as u64).collect())
}

fn check(answers: &Value, stored: &[Value]) {
    let counts = &answers["counts"];
    assert_eq!(counts["rollups"], json!({"ready": true}));
    assert_eq!(counts["interval_seconds"], 86_400);
    assert_eq!(counts["buckets"].as_array().unwrap().len(), 8);
    for (i, event) in ["signup", "$pageview", "none"].iter().enumerate() {
        let (total, unique) = expected_series(stored, counts, event);
        let series = &counts["series"][i];
        assert_eq!(series["event"], *event);
        assert_eq!(series["total"], json!(total), "{event}");
        assert_eq!(series["unique"], json!(unique), "{event}");
        let (total, unique) = expected_range(stored, counts, event);
        assert_eq!(series["range_total"], total, "{event}");
        assert_eq!(series["range_unique"], unique, "{event}");
    }
    // Seven persons over five days: summing the days would count most of them twice.
    let signup = &counts["series"][0];
    let summed: u64 = signup["unique"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert!(
        signup["range_unique"].as_u64().unwrap() < summed,
        "{signup}"
    );

    let ranged = &answers["range"];
    let (from, to) = range();
    assert_eq!(ms(ranged["buckets"][0].as_str().unwrap()), from);
    let days = ranged["buckets"].as_array().unwrap().len() as i64;
    assert_eq!(days, (to - from + 86_400_000 - 1) / 86_400_000);
    let (total, unique) = expected_series(stored, ranged, "signup");
    assert_eq!(ranged["series"][0]["total"], json!(total));
    assert_eq!(ranged["series"][0]["unique"], json!(unique));
    let (total, unique) = expected_range(stored, ranged, "signup");
    assert_eq!(ranged["series"][0]["range_total"], total);
    assert_eq!(ranged["series"][0]["range_unique"], unique);
    let hours = &answers["hours"];
    let (total, unique) = expected_series(stored, hours, "signup");
    assert_eq!(hours["series"][0]["total"], json!(total));
    assert_eq!(hours["series"][0]["unique"], json!(unique));
    assert_eq!(total.iter().sum::<u64>(), 15);

    assert_eq!(
        answers["top"]["events"],
        json!([{"event": "$feature_flag_called", "count": 15}, {"event": "$pageview", "count": 15},
               {"event": "signup", "count": 15}, {"event": "survey sent", "count": 15}])
    );
    let mut flags: BTreeMap<String, u64> = BTreeMap::new();
    let mut survey: BTreeMap<String, u64> = BTreeMap::new();
    for e in stored {
        let p = &e["properties"];
        match e["event"].as_str().unwrap() {
            "$feature_flag_called" => {
                let v = &p["$feature_flag_response"];
                let label = v.as_str().map_or(v.to_string(), str::to_owned);
                *flags.entry(label).or_default() += 1;
            }
            "survey sent" => {
                let a = p["$survey_response"].as_str().unwrap().to_owned();
                *survey.entry(a).or_default() += 1;
            }
            _ => {}
        }
    }
    assert_eq!(
        flags,
        BTreeMap::from([
            ("control".into(), 5),
            ("test".into(), 5),
            ("true".into(), 5)
        ])
    );
    assert_eq!(answers["exposures"]["flags"], json!({"f": flags}));
    assert_eq!(
        answers["surveys"]["surveys"],
        json!([{"id": "s1", "name": "Survey one", "responses": 15, "answers": survey}])
    );
}

#[test]
fn insights_equal_exact_counts_and_an_old_database_is_backfilled() {
    let tmp = data_dir();
    let mut server = Server::spawn(tmp.path(), &[]);
    let sent = capture(&server);
    let stored = server.wait_for_events(1, sent);
    assert_eq!(stored.len(), sent);
    let s = sign_in(&server, PERSONAL_ONE);
    let before = insights(&server, &s);
    check(&before, &stored);
    assert_eq!(server.stop(), Some(0));

    // As an older version left it: no rollups tree, no rollups version.
    {
        let db = flagpost::store::check::open(&tmp.path().join("db"), 1 << 24).unwrap();
        assert!(db.drop_tree("rollups").unwrap());
        let meta = db.open_tree("meta").unwrap();
        assert!(meta.remove("rollups.version").unwrap().is_some());
        db.flush().unwrap();
    }
    let mut server = Server::spawn(tmp.path(), &[]);
    let s = sign_in(&server, PERSONAL_ONE);
    let after = wait_for("the rollups backfill", || {
        let a = insights(&server, &s);
        (a["counts"]["rollups"]["ready"] == true).then_some(a)
    });
    check(&after, &stored);
    // The same answers, but for the current hour's bucket label moving on.
    for part in ["top", "exposures", "surveys"] {
        assert_eq!(after[part], before[part], "{part}");
    }
    assert_eq!(
        after["counts"]["series"], before["counts"]["series"],
        "the same day buckets, unless the day turned during the test"
    );
    let log = server.log();
    assert!(
        log.contains("rollups are built from the stored events"),
        "{log}"
    );
    assert!(log.contains("rollups built"), "{log}");
    assert_eq!(server.stop(), Some(0));
}

/// The compactor holds a chunk's counts in memory for a while before writing them; a
/// SIGKILL right after the events are stored loses them, and the next start counts
/// those events' blocks again, so the insights still equal the stored events.
#[test]
fn insights_held_in_memory_are_counted_again_after_a_sigkill() {
    let server = Server::start();
    let sent = capture(&server);
    let stored = server.wait_for_events(1, sent);
    let s = sign_in(&server, PERSONAL_ONE);
    check(&insights(&server, &s), &stored);
    let server = server.restart_hard();
    // Events the compactor had not yet flushed come back from the log after the restart:
    // wait for the compactor to apply them again, then exactly those are stored.
    assert_eq!(server.wait_for_events(1, sent).len(), sent);
    let s = sign_in(&server, PERSONAL_ONE);
    check(&insights(&server, &s), &stored);
}
