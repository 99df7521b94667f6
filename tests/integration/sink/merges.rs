//! Merges through the real binary (issue 19): after `$identify` and `$create_alias`
//! merge persons, PostHog's way of finding an event's person in ClickHouse (the latest
//! version of each distinct id's link, not deleted) counts each real person once.

use serde_json::{json, Value};

use super::end_to_end::{capture, start, wait_for_events};
use super::*;

/// Events by person, through the links of `person_distinct_id2` as PostHog's queries
/// read them.
const PERSONS_OF_EVENTS: &str = "\
    SELECT uniqExact(person), uniq(person), count() FROM events FINAL ALL INNER JOIN (
        SELECT distinct_id, argMax(person_id, version) AS person
        FROM person_distinct_id2 WHERE team_id = 1 GROUP BY distinct_id
        HAVING argMax(is_deleted, version) = 0) USING distinct_id
    WHERE team_id = 1";

fn pageview(distinct_id: &str) -> Value {
    json!({"event": "$pageview", "properties": {"distinct_id": distinct_id}})
}

#[test]
#[ignore = "needs clickhouse-server: run by .ci/run, cargo test -- --include-ignored"]
fn merged_persons_are_counted_once() {
    let ch = ClickHouse::start("sink_merges");
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), server::PASSWORD).unwrap();
    let server = start(&ch, secret.path());
    // Six persons at first, one per distinct id, all sent before any merge.
    let ids = ["anon-a", "anon-b", "user-b", "anon-c", "user-c", "solo"];
    capture(&server, ids.iter().map(|id| pageview(id)).collect());
    wait_for_events(&ch, ids.len());
    assert_eq!(ch.query(PERSONS_OF_EVENTS), "6\t6\t6\n");

    capture(
        &server,
        json!([
            // A new identified id linked to an anonymous person: no merge.
            {"event": "$identify", "properties": {"distinct_id": "user-a", "$anon_distinct_id": "anon-a"}},
            // Two existing persons merged each way PostHog merges them.
            {"event": "$create_alias", "properties": {"distinct_id": "user-b", "alias": "anon-b"}},
            {"event": "$identify", "properties": {"distinct_id": "user-c", "$anon_distinct_id": "anon-c"}},
            pageview("anon-a"),
            pageview("anon-b"),
            pageview("anon-c"),
        ]),
    );
    wait_for_events(&ch, ids.len() + 6);
    let stored = server.wait_for_events(1, ids.len() + 6);
    let person_of = |id: &str| {
        let e = stored.iter().find(|e| e["distinct_id"] == id).unwrap();
        e["person_id"].as_str().unwrap().to_string()
    };
    // Four real persons: a, b, c and solo; every event counted, none twice.
    assert_eq!(ch.query(PERSONS_OF_EVENTS), "4\t4\t12\n");
    let linked = [
        "anon-a", "anon-b", "anon-c", "solo", "user-a", "user-b", "user-c",
    ];
    let want: Vec<String> = linked
        .iter()
        .map(|id| format!("{id}\t{}\n", person_of(id)))
        .collect();
    assert_eq!(
        ch.query(
            "SELECT distinct_id, toString(argMax(person_id, version)) FROM person_distinct_id2 \
             GROUP BY distinct_id HAVING argMax(is_deleted, version) = 0 ORDER BY distinct_id"
        ),
        want.concat()
    );
    for (a, b) in [
        ("anon-a", "user-a"),
        ("anon-b", "user-b"),
        ("anon-c", "user-c"),
    ] {
        assert_eq!(person_of(a), person_of(b), "{a} and {b} merged");
    }
    // The two persons merged away are deleted; the four left are not.
    assert_eq!(
        ch.query(
            "SELECT is_deleted, count() FROM person FINAL GROUP BY is_deleted ORDER BY is_deleted"
        ),
        "0\t4\n1\t2\n"
    );
    assert_eq!(
        ch.query(
            "SELECT count() FROM person FINAL WHERE is_deleted = 0 AND toString(id) IN (SELECT \
             toString(argMax(person_id, version)) FROM person_distinct_id2 GROUP BY distinct_id)"
        ),
        "4\n"
    );
}
