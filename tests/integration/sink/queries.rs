//! The PostHog-style queries of docs/clickhouse.md, read from that file and run
//! against the real server over rows in the sink's tables: daily active users
//! (anonymous visitors, stored without a person, counted by distinct id), top events,
//! a three-step funnel by person, and flag exposures per variant. They are written for
//! both table shapes: persons come from `person_distinct_id2` (the latest version of
//! each link, as PostHog reads it), JSON through the `visitParam*` functions every
//! version has (the sink sends compact JSON, which they need), `ALL INNER JOIN`, the
//! spelling old servers require, and an alias on the joined subquery, which current
//! servers require. [`super::current`] runs them on ClickHouse 26.9 over the same rows
//! ([`rows`]) in the current shape.

use flagpost::sink::rowbinary::RowBinary;
use flagpost::sink::rows::{DistinctIdRow, EventRow, Origin};
use flagpost::sink::{Shape, Table};
use uuid::Uuid;

use super::*;

/// The SQL block of docs/clickhouse.md, one query per statement, in order: the
/// document's text is what runs.
pub fn documented_queries() -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/clickhouse.md"))
        .expect("docs/clickhouse.md");
    let sql = doc
        .split("```sql\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("its SQL block");
    sql.split(';')
        .map(|q| {
            q.lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .filter(|q| !q.trim().is_empty())
        .collect()
}

/// Day one 2024-05-01 10:00 UTC, in Unix milliseconds.
const DAY_ONE: i64 = 1_714_557_600_000;
const DAY: i64 = 86_400_000;

/// (distinct id, event, properties, milliseconds after day one's start)
fn events() -> Vec<(&'static str, &'static str, &'static str, i64)> {
    vec![
        ("a-anon", "$pageview", "{}", 0),
        // A visitor posthog-js keeps anonymous: no person, no link.
        ("visitor", "$pageview", "{}", 4_000),
        ("a-anon", "viewed product", "{}", 1_000),
        ("a@x", "added to cart", "{}", 2_000),
        ("a@x", "paid", "{}", 3_000),
        ("b", "$pageview", "{}", 0),
        ("b", "viewed product", "{}", 5_000),
        ("b", "added to cart", "{}", 6_000),
        ("c", "viewed product", "{}", 7_000),
        ("a@x", "$pageview", "{}", DAY),
        (
            "a@x",
            "$feature_flag_called",
            r#"{"$feature_flag":"checkout","$feature_flag_response":"test"}"#,
            DAY,
        ),
        (
            "b",
            "$feature_flag_called",
            r#"{"$feature_flag":"checkout","$feature_flag_response":"control"}"#,
            DAY,
        ),
        (
            "c",
            "$feature_flag_called",
            r#"{"$feature_flag":"checkout","$feature_flag_response":"test"}"#,
            DAY,
        ),
        (
            "b",
            "$feature_flag_called",
            r#"{"$feature_flag":"beta","$feature_flag_response":true}"#,
            DAY,
        ),
    ]
}

/// What each documented query answers over [`rows`] (TabSeparated), in order.
pub const ANSWERS: [&str; 4] = [
    // Daily active users: a, b and the anonymous visitor on the first day, a on the
    // second.
    "2024-05-01\t3\n2024-05-02\t1\n",
    "$feature_flag_called\t4\n$pageview\t4\nviewed product\t3\nadded to cart\t2\npaid\t1\n",
    // a (two distinct ids, one person) goes all the way; b adds to cart; c only views.
    "3\t2\t1\n",
    "beta\ttrue\t1\t1\ncheckout\tcontrol\t1\t1\ncheckout\ttest\t2\t2\n",
];

fn load(ch: &ClickHouse) {
    let mut dest = destination(ch);
    let tables = rows(dest.shape());
    block_on(async {
        for (table, encoded) in tables {
            dest.insert(table, encoded, table.name())
                .await
                .expect("insert");
        }
    });
}

/// The queries' events and the links of their distinct ids to persons, encoded for
/// `shape`: events first.
pub fn rows(shape: Shape) -> Vec<(Table, Vec<u8>)> {
    let person = |id: &str| match id {
        "a-anon" | "a@x" => Uuid::from_u128(0xa),
        "b" => Uuid::from_u128(0xb),
        "visitor" => Uuid::nil(),
        _ => Uuid::from_u128(0xc),
    };
    let origin = Origin {
        committed_ms: DAY_ONE,
        offset: 1,
    };
    let mut rows = RowBinary::default();
    for (i, (distinct_id, event, properties, at)) in events().into_iter().enumerate() {
        EventRow {
            uuid: Uuid::from_u128(0x1000 + i as u128),
            event,
            properties: properties.as_bytes(),
            timestamp: DAY_ONE + at,
            team_id: 1,
            distinct_id,
            elements_chain: "",
            created_at: DAY_ONE + at,
            person_id: person(distinct_id),
            groups: [""; 5],
            origin,
        }
        .encode(shape, &mut rows);
    }
    let mut links = RowBinary::default();
    for distinct_id in ["a-anon", "a@x", "b", "c"] {
        DistinctIdRow {
            team_id: 1,
            distinct_id,
            person_id: person(distinct_id),
            is_deleted: false,
            version: 1,
            origin,
        }
        .encode(shape, &mut links);
    }
    vec![
        (Table::Event, rows.into_bytes()),
        (Table::DistinctId, links.into_bytes()),
    ]
}

#[test]
#[ignore = "needs clickhouse-server: run by .ci/run, cargo test -- --include-ignored"]
fn the_documented_queries_answer_exactly() {
    let ch = ClickHouse::start("sink_queries");
    load(&ch);
    let queries = documented_queries();
    assert_eq!(queries.len(), ANSWERS.len(), "{queries:?}");
    for (query, answer) in queries.iter().zip(ANSWERS) {
        assert_eq!(ch.query(query), answer, "{query}");
    }
}
