//! Exactly once after dedup: a batch sent twice (the sink crashed after ClickHouse
//! took it but before its checkpoint moved) leaves one row of each, a person's higher
//! version wins whatever order the rows arrive in, and the client carries on through a
//! server restart with nothing acknowledged lost.

use flagpost::sink::rowbinary::RowBinary;
use flagpost::sink::rows::PersonRow;
use flagpost::sink::{Shape, Table};
use uuid::Uuid;

use super::tables::{origin, sample};
use super::*;

fn count_final(ch: &ClickHouse, table: Table) -> String {
    ch.query(&format!("SELECT count() FROM {} FINAL", table.name()))
}

#[test]
#[ignore = "needs clickhouse-server: run by .ci/run, cargo test -- --include-ignored"]
fn a_resent_batch_collapses() {
    let ch = ClickHouse::start("sink_collapse");
    let mut dest = destination(&ch);
    for _ in 0..2 {
        block_on(async {
            for (table, rows) in sample(dest.shape(), "$pageview") {
                dest.insert(table, rows, "batch-1").await.expect("insert");
            }
        });
    }
    for table in Table::ALL {
        assert_eq!(count_final(&ch, table), "1\n", "{}", table.name());
        ch.merge(table.name());
        assert_eq!(
            ch.query(&format!("SELECT count() FROM {}", table.name())),
            "1\n",
            "{} after a merge",
            table.name()
        );
    }
}

fn person(shape: Shape, version: u64, deleted: bool) -> Vec<u8> {
    let mut out = RowBinary::default();
    PersonRow {
        id: Uuid::from_u128(42),
        created_at: 1_690_000_000_000,
        team_id: 7,
        properties: if deleted { b"{}" } else { br#"{"plan":"pro"}"# },
        is_identified: true,
        is_deleted: deleted,
        version,
        origin: origin(version),
    }
    .encode(shape, &mut out);
    out.into_bytes()
}

#[test]
#[ignore = "needs clickhouse-server: run by .ci/run, cargo test -- --include-ignored"]
fn the_highest_version_of_a_person_wins() {
    let ch = ClickHouse::start("sink_versions");
    let mut dest = destination(&ch);
    let shape = dest.shape();
    block_on(async {
        // Merged away at version 5, then version 3 re-sent after a crash.
        for (version, deleted) in [(3, false), (5, true), (3, false)] {
            let token = format!("person-{version}-{deleted}");
            let rows = person(shape, version, deleted);
            dest.insert(Table::Person, rows, &token)
                .await
                .expect("insert");
        }
    });
    assert_eq!(
        ch.query("SELECT version, is_deleted, properties FROM person FINAL"),
        "5\t1\t{}\n"
    );
}

#[test]
#[ignore = "needs clickhouse-server: run by .ci/run, cargo test -- --include-ignored"]
fn the_client_carries_on_through_a_server_restart() {
    let mut ch = ClickHouse::start("sink_restart");
    let mut dest = destination(&ch);
    let shape = dest.shape();
    let rows = || sample(shape, "$pageview");
    block_on(async {
        for (table, rows) in rows() {
            dest.insert(table, rows, "batch-1").await.expect("insert");
        }
    });
    ch.restart();
    // A kept-alive connection to the killed server may fail once; the client then
    // connects afresh, as the sink's retry would.
    block_on(async {
        for (table, rows) in rows() {
            if let Err(e) = dest.insert(table, rows.clone(), "batch-1").await {
                eprintln!("first insert after the restart: {e}");
                dest.insert(table, rows, "batch-1")
                    .await
                    .expect("retried insert");
            }
        }
    });
    assert_eq!(count_final(&ch, Table::Event), "1\n");
    assert_eq!(
        ch.try_query("SELECT nonsense").status,
        404,
        "the server's errors reach the client as errors"
    );
}
