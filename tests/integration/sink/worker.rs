//! The worker over a real store's outbox against the real server: every event,
//! person, link and group the outbox names arrives once; a batch ClickHouse took
//! but the outbox never heard back about (a crash between the two) is re-sent and
//! collapses; with the server down nothing leaves the outbox, and after it returns
//! everything arrives.

use flagpost::persons::Person;
use flagpost::sink::batch::{self, Sources};
use flagpost::sink::{Destination, Table, Worker};
use flagpost::store::outbox::{record, Committed, Outbox};
use flagpost::store::{block, keys, Group, Trees};
use serde_json::json;
use sled::transaction::ConflictableTransactionError;
use uuid::Uuid;

use super::*;

/// Chunks of events, each one outbox entry; the worker sends them in batches of
/// about [`BATCH_ROWS`].
pub(super) const CHUNKS: u64 = 5;
/// Batches smaller than the sink's, so these few events make several.
const BATCH_ROWS: u64 = 10_000;
pub(super) const EVENTS_PER_CHUNK: u64 = 4_000;
const PROJECT: u64 = 3;
/// Long enough ago that no batch waits for company.
const COMMITTED_AT: i64 = 1_700_000_000_000;

pub(super) struct Store {
    _dir: tempfile::TempDir,
    pub(super) trees: Trees,
    pub(super) outbox: Outbox,
}

/// The version of chunk `chunk`'s rows: its commit time's (no node id yet when the
/// store is written).
fn version(chunk: u64) -> u64 {
    (COMMITTED_AT as u64 + chunk) * flagpost::store::outbox::VERSION_STEP
}

fn person_id(n: u128) -> Uuid {
    Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0000 | n)
}

/// A store as the compactor would leave it: events in blocks, person 1 holding
/// `u1`..`u3` (`u3` moved from person 2 when they merged), group `acme`, and one
/// outbox entry per chunk naming them.
pub(super) fn store() -> Store {
    store_with(0)
}

/// The same, with the sink switched on only before chunk `sink_from`: earlier
/// chunks have no outbox entries.
fn store_with(sink_from: u64) -> Store {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let trees = Trees::open(&db, dir.path()).unwrap();
    let outbox = Outbox::open(&db).unwrap();
    let mut block_id = 0;
    for chunk in 0..CHUNKS {
        let entries: Vec<block::Entry> = (0..EVENTS_PER_CHUNK)
            .map(|i| {
                let n = chunk * EVENTS_PER_CHUNK + i;
                block::Entry {
                    timestamp: 1_699_000_000_000 + n as i64,
                    created_at: 1_699_000_000_500 + n as i64,
                    uuid: Uuid::from_u128(0x0180_0000_0000_7000_8000_0000_0000_0000 | n as u128),
                    person_id: Some(person_id(1)),
                    event: "$pageview".into(),
                    distinct_id: format!("u{}", n % 3 + 1),
                    properties: format!(r#"{{"n":{n},"$group_0":"acme"}}"#).into_bytes(),
                }
            })
            .collect();
        let mut committed = Committed {
            at: COMMITTED_AT + chunk as i64,
            events: EVENTS_PER_CHUNK,
            ..Committed::default()
        };
        for (newest, value) in block::build(entries) {
            let key = keys::block(PROJECT, newest, block_id);
            block_id += 1;
            trees.events.insert(key, value).unwrap();
            committed.blocks.push(key.to_vec());
        }
        if chunk == 0 {
            committed.persons = vec![(PROJECT, person_id(1)), (PROJECT, person_id(2))];
            committed.linked = vec![(PROJECT, "u1".into()), (PROJECT, "u3".into())];
            committed.groups = vec![(PROJECT, 0, "acme".into())];
        }
        if chunk == CHUNKS - 1 {
            // The merge: person 2 gone, its distinct id moved, at a later version.
            committed.persons = vec![(PROJECT, person_id(2)), (PROJECT, person_id(1))];
            committed.linked = vec![(PROJECT, "u2".into()), (PROJECT, "u3".into())];
        }
        if chunk >= sink_from {
            outbox
                .tree()
                .transaction(|tx| {
                    Ok::<_, ConflictableTransactionError<()>>(record(tx, &committed)?)
                })
                .unwrap();
        }
    }
    let next_block = block_id.to_be_bytes();
    trees
        .meta
        .insert(flagpost::store::keys::NEXT_BLOCK_KEY, &next_block[..])
        .unwrap();
    let person = Person {
        id: person_id(1),
        created_at: 1_699_000_000_000,
        properties: json!({"plan": "pro"}).as_object().unwrap().clone(),
        distinct_ids: vec!["u1".into(), "u2".into(), "u3".into()],
        is_identified: true,
        first_distinct_id: "u1".into(),
    };
    let key = keys::with_uuid(PROJECT, person.id);
    trees
        .persons
        .insert(key, serde_json::to_vec(&person).unwrap())
        .unwrap();
    for id in ["u1", "u2", "u3"] {
        let key = keys::with_str(PROJECT, id);
        trees
            .distinct_ids
            .insert(key, person_id(1).as_bytes())
            .unwrap();
    }
    let group = Group {
        group_type_index: 0,
        group_key: "acme".into(),
        properties: json!({"seats": 12}).as_object().unwrap().clone(),
        created_at: 1_698_000_000_000,
    };
    let key = keys::group(PROJECT, 0, "acme");
    trees
        .groups
        .insert(key, serde_json::to_vec(&group).unwrap())
        .unwrap();
    Store {
        _dir: dir,
        trees,
        outbox,
    }
}

pub(super) fn worker(ch: &ClickHouse, s: &Store) -> Worker {
    Worker::new(settings(ch), s.outbox.clone(), Sources::of(&s.trees))
        .expect("worker")
        .with_batch_rows(BATCH_ROWS)
}

/// Step until the outbox is empty; returns the rows sent per pass.
pub(super) fn drain(worker: &mut Worker) -> Vec<u64> {
    let mut passes = Vec::new();
    block_on(async {
        while let flagpost::sink::worker::Pass::Sent { rows } = worker.step().await.expect("step") {
            passes.push(rows);
        }
    });
    passes
}

pub(super) fn assert_all_there(ch: &ClickHouse, s: &Store) {
    let total = CHUNKS * EVENTS_PER_CHUNK;
    assert_eq!(
        ch.query("SELECT count(), uniqExact(uuid), sum(`$group_0` = 'acme') FROM events FINAL"),
        format!("{total}\t{total}\t{total}\n")
    );
    assert_eq!(
        ch.query(&format!(
            "SELECT count() FROM events FINAL WHERE team_id = {PROJECT}"
        )),
        format!("{total}\n")
    );
    // Person 2 merged away: deleted at the merge's version (the last entry's), above
    // its first row (the first entry's); person 1 written at both.
    let (first, merge) = (version(0), version(CHUNKS - 1));
    assert_eq!(
        ch.query(
            "SELECT toString(id), is_deleted, version, properties FROM person FINAL ORDER BY id"
        ),
        format!(
            "{}\t0\t{merge}\t{{\"plan\":\"pro\"}}\n{}\t1\t{merge}\t{{}}\n",
            person_id(1),
            person_id(2)
        )
    );
    assert_eq!(
        ch.query(
            "SELECT distinct_id, toString(person_id), version FROM person_distinct_id2 FINAL \
             ORDER BY distinct_id"
        ),
        format!(
            "u1\t{p}\t{first}\nu2\t{p}\t{merge}\nu3\t{p}\t{merge}\n",
            p = person_id(1)
        )
    );
    assert_eq!(
        ch.query("SELECT group_key, group_properties, _offset FROM groups FINAL"),
        "acme\t{\"seats\":12}\t1\n"
    );
    assert_eq!(s.outbox.entries(None).unwrap().count(), 0, "outbox emptied");
    assert_eq!(s.outbox.checkpoint().unwrap(), CHUNKS);
    assert_eq!(s.outbox.in_flight().unwrap(), None);
}

#[test]
#[ignore = "needs clickhouse-server: run by .ci/run, cargo test -- --include-ignored"]
fn the_worker_sends_everything_once_in_batches() {
    let ch = ClickHouse::start("sink_worker");
    let s = store();
    let mut w = worker(&ch, &s);
    let passes = drain(&mut w);
    // 4,000-event entries: three make the first batch pass 10k rows (with two
    // persons, two links and a group), two are left (the merge: two and two). The
    // backfill's runs take turns with them, first: a person, three links, a group,
    // and no events, as the outbox names every block.
    assert_eq!(passes, [1, 12_000 + 2 + 2 + 1, 3, 8_000 + 2 + 2, 1, 0]);
    assert_all_there(&ch, &s);
    assert_eq!(w.stats().rows_of(Table::Event), CHUNKS * EVENTS_PER_CHUNK);
    assert_eq!(w.stats().lag_seconds.get(), 0.0);
}

#[test]
#[ignore = "needs clickhouse-server: run by .ci/run, cargo test -- --include-ignored"]
fn a_batch_acknowledged_by_clickhouse_but_not_the_outbox_is_resent_and_collapses() {
    let ch = ClickHouse::start("sink_resend");
    let s = store();
    // A worker's pass up to the inserts, then a crash before the acknowledgement.
    block_on(async {
        let mut dest = Destination::open(settings(&ch)).await.expect("open");
        let now = COMMITTED_AT + 60_000;
        let entries = batch::choose(&s.outbox, now, BATCH_ROWS)
            .unwrap()
            .expect("a batch");
        let sources = Sources::of(&s.trees);
        let built = batch::build(&sources, &entries, dest.shape()).unwrap();
        let node = s.outbox.node().unwrap();
        for (table, rows, _) in &built.tables {
            let token = built.token(node, *table);
            dest.insert(*table, rows.clone(), &token)
                .await
                .expect("insert");
        }
    });
    assert_eq!(s.outbox.in_flight().unwrap(), Some((1, 3)));
    let mut w = worker(&ch, &s);
    let passes = drain(&mut w);
    assert!(
        passes.contains(&12_005),
        "the batch in flight, whole: {passes:?}"
    );
    assert_all_there(&ch, &s);
}

#[test]
#[ignore = "needs clickhouse-server: run by .ci/run, cargo test -- --include-ignored"]
fn nothing_leaves_the_outbox_while_clickhouse_is_down() {
    let mut ch = ClickHouse::start("sink_down");
    let s = store();
    let mut w = worker(&ch, &s);
    ch.stop();
    for _ in 0..3 {
        assert!(block_on(w.step()).is_err());
    }
    assert_eq!(w.stats().errors.get(), 3);
    assert!(w.stats().lag_seconds.get() > 0.0);
    assert_eq!(s.outbox.entries(None).unwrap().count(), CHUNKS as usize);
    assert_eq!(s.outbox.checkpoint().unwrap(), 0);
    ch.restart();
    drain(&mut w);
    assert_all_there(&ch, &s);
}

#[test]
#[ignore = "needs clickhouse-server: run by .ci/run, cargo test -- --include-ignored"]
fn switched_on_later_the_sink_backfills_what_was_stored_before() {
    let ch = ClickHouse::start("sink_backfill");
    // Four chunks stored before the sink, the merge's chunk after.
    let s = store_with(CHUNKS - 1);
    let mut w = worker(&ch, &s);
    drain(&mut w);
    let total = CHUNKS * EVENTS_PER_CHUNK;
    // Not one event sent twice, before any merge could collapse it.
    assert_eq!(
        ch.query("SELECT count(), uniqExact(uuid) FROM events"),
        format!("{total}\t{total}\n")
    );
    // The backfill's rows carry version 0; the outbox's one entry (the merge) wins.
    let merge = version(CHUNKS - 1);
    assert_eq!(
        ch.query("SELECT toString(id), is_deleted, version FROM person FINAL ORDER BY id"),
        format!(
            "{}\t0\t{merge}\n{}\t1\t{merge}\n",
            person_id(1),
            person_id(2)
        )
    );
    assert_eq!(
        ch.query(
            "SELECT distinct_id, toString(person_id), version FROM person_distinct_id2 FINAL \
             ORDER BY distinct_id"
        ),
        format!(
            "u1\t{p}\t0\nu2\t{p}\t{merge}\nu3\t{p}\t{merge}\n",
            p = person_id(1)
        )
    );
    assert_eq!(
        ch.query("SELECT group_key, group_properties FROM groups FINAL"),
        "acme\t{\"seats\":12}\n"
    );
    assert_eq!(s.outbox.entries(None).unwrap().count(), 0);
    // A restart finds the backfill done and sends nothing more.
    let mut again = worker(&ch, &s);
    assert_eq!(drain(&mut again), Vec::<u64>::new());
}

/// Chunks of events written after [`store`]'s, from event number `first`; recorded
/// in the outbox only if the sink is `on`, as the compactor does.
fn append(s: &Store, first: u64, chunks: u64, on: bool) {
    let key = flagpost::store::keys::NEXT_BLOCK_KEY;
    let next = s.trees.meta.get(key).unwrap().unwrap();
    let mut block_id = u64::from_be_bytes(next.as_ref().try_into().unwrap());
    for chunk in 0..chunks {
        let entries: Vec<block::Entry> = (0..EVENTS_PER_CHUNK)
            .map(|i| {
                let n = first + chunk * EVENTS_PER_CHUNK + i;
                block::Entry {
                    timestamp: 1_699_000_000_000 + n as i64,
                    created_at: 1_699_000_000_500 + n as i64,
                    uuid: Uuid::from_u128(0x0180_0000_0000_7000_8000_0000_0000_0000 | n as u128),
                    person_id: Some(person_id(1)),
                    event: "later".into(),
                    distinct_id: "u1".into(),
                    properties: format!(r#"{{"n":{n}}}"#).into_bytes(),
                }
            })
            .collect();
        let mut committed = Committed {
            at: COMMITTED_AT + 100,
            events: EVENTS_PER_CHUNK,
            ..Committed::default()
        };
        for (newest, value) in block::build(entries) {
            let key = keys::block(PROJECT, newest, block_id);
            block_id += 1;
            s.trees.events.insert(key, value).unwrap();
            committed.blocks.push(key.to_vec());
        }
        if on {
            s.outbox
                .tree()
                .transaction(|tx| {
                    Ok::<_, ConflictableTransactionError<()>>(record(tx, &committed)?)
                })
                .unwrap();
        }
    }
    s.trees
        .meta
        .insert(key, &block_id.to_be_bytes()[..])
        .unwrap();
}

#[test]
#[ignore = "needs clickhouse-server: run by .ci/run, cargo test -- --include-ignored"]
fn switched_off_and_on_again_the_sink_sends_what_was_written_meanwhile() {
    let ch = ClickHouse::start("sink_off_and_on");
    let s = store();
    drain(&mut worker(&ch, &s));
    let before = CHUNKS * EVENTS_PER_CHUNK;
    // Two chunks while the sink was off, one after it came back.
    append(&s, before, 2, false);
    append(&s, before + 2 * EVENTS_PER_CHUNK, 1, true);
    drain(&mut worker(&ch, &s));
    let total = before + 3 * EVENTS_PER_CHUNK;
    // Each exactly once: the gap's blocks and no others were backfilled.
    assert_eq!(
        ch.query("SELECT count(), uniqExact(uuid), countIf(event = 'later') FROM events"),
        format!("{total}\t{total}\t{}\n", 3 * EVENTS_PER_CHUNK)
    );
    assert_eq!(s.outbox.gap().unwrap(), None);
}
