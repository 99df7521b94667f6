//! Two nodes into one ClickHouse database (issue 19): each with its own database and
//! the same data dir, as in docs/clickhouse.md's "Several nodes". Every event arrives once, a
//! distinct id both nodes saw (and no merge touched) has one person id, and when both
//! nodes write that person, the change committed last is the one queries see.

use serde_json::{json, Value};

use super::end_to_end::wait_for_events;
use super::*;
use crate::util::*;

/// Rounds of captures on node A, each compacted before the next, so A's outbox has
/// gone further than B's when B writes the shared person.
const ROUNDS_ON_A: usize = 6;

/// A node with its own database, `shared`'s data dir, sinking into `ch`.
fn node(shared: &std::path::Path, ch: &ClickHouse, password: &std::path::Path) -> Server {
    let own = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(shared.join("data"), own.path().join("data")).unwrap();
    let args = super::end_to_end::sink_args(ch, password);
    let mut server = Server::spawn(
        own.path(),
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    server.keep(own);
    server
}

fn capture(node: &Server, batch: Value) {
    super::end_to_end::capture(node, batch);
}

fn pageview(distinct_id: &str, set: Value) -> Value {
    json!({"event": "$pageview", "properties": {"distinct_id": distinct_id, "$set": set}})
}

/// The person id both nodes derive for `distinct_id` of project 1, as PostHog does.
fn derived(distinct_id: &str) -> String {
    let namespace = uuid::uuid!("932979b4-65c3-4424-8467-0b66ec27bc22");
    uuid::Uuid::new_v5(&namespace, format!("1:{distinct_id}").as_bytes()).to_string()
}

#[test]
#[ignore = "needs clickhouse-server: run by .ci/run, cargo test -- --include-ignored"]
fn two_nodes_into_one_database() {
    let ch = ClickHouse::start("sink_two_nodes");
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), server::PASSWORD).unwrap();
    let shared = data_dir();
    let a = node(shared.path(), &ch, secret.path());
    let b = node(shared.path(), &ch, secret.path());

    for round in 0..ROUNDS_ON_A {
        capture(
            &a,
            json!([
                pageview(
                    "shared",
                    json!({"plan": "pro", "seen_on": "a", "round": round})
                ),
                pageview("a-only", json!({"round": round})),
            ]),
        );
        a.settle(1);
    }
    let on_a = a.stored_events(1).len();
    wait_for_events(&ch, on_a);
    // Later than every change on A, by the clock, though B's outbox is younger.
    std::thread::sleep(std::time::Duration::from_millis(50));
    capture(
        &b,
        json!([
            pageview("shared", json!({"plan": "free", "seen_on": "b"})),
            pageview("b-only", json!({})),
        ]),
    );
    b.settle(1);
    let on_b = b.stored_events(1).len();
    let total = on_a + on_b;
    wait_for_events(&ch, total);

    // Every event once.
    assert_eq!(
        ch.query("SELECT count(), uniqExact(uuid) FROM events FINAL"),
        format!("{total}\t{total}\n")
    );
    ch.merge("events");
    assert_eq!(ch.query("SELECT count() FROM events"), format!("{total}\n"));

    // One person id per distinct id, whichever node linked it.
    let want: String = ["a-only", "b-only", "settle", "shared"]
        .iter()
        .map(|id| format!("{id}\t1\t{}\n", derived(id)))
        .collect();
    assert_eq!(
        ch.query(
            "SELECT distinct_id, uniqExact(person_id), toString(any(person_id)) \
             FROM person_distinct_id2 GROUP BY distinct_id ORDER BY distinct_id"
        ),
        want
    );
    let stored = |node: &Server| {
        node.stored_events(1)
            .iter()
            .find(|e| e["distinct_id"] == "shared")
            .map(|e| e["person_id"].as_str().unwrap().to_string())
            .unwrap()
    };
    assert_eq!(stored(&a), derived("shared"));
    assert_eq!(stored(&b), derived("shared"));

    // Both nodes wrote the shared person, each with what it knows; the change
    // committed last (on B) is the row that FINAL keeps, and argMax by version finds.
    let shared_person = derived("shared");
    let rows = ch.query(&format!(
        "SELECT count() FROM person WHERE toString(id) = '{shared_person}'"
    ));
    eprintln!("rows of the shared person before merging: {}", rows.trim());
    assert_eq!(
        ch.query(&format!(
            "SELECT visitParamExtractString(properties, 'plan'), \
             visitParamExtractString(properties, 'seen_on') \
             FROM person FINAL WHERE toString(id) = '{shared_person}'"
        )),
        "free\tb\n"
    );
    assert_eq!(
        ch.query(&format!(
            "SELECT visitParamExtractString(argMax(properties, version), 'seen_on') \
             FROM person WHERE toString(id) = '{shared_person}'"
        )),
        "b\n"
    );
    ch.merge("person");
    assert_eq!(
        ch.query(&format!(
            "SELECT count(), visitParamExtractString(any(properties), 'seen_on') \
             FROM person WHERE toString(id) = '{shared_person}'"
        )),
        "1\tb\n"
    );
}
