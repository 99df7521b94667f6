//! The current table shape ([`Shape::Current`], what the sink creates on ClickHouse
//! 22.3 and later) against a current ClickHouse: 26.9, the engine of PyPI's
//! `chdb-core` run in-process (`tests/sdk/install.sh` puts it in a venv, and
//! `tests/sink/chdb_run.py` runs a test's statements in one session on disk). The
//! statements and the RowBinary rows are the sink's own: its CREATE DATABASE, each
//! table's `create_sql`, its queries for the tables and shape already there, its
//! encoders, its deduplication tokens and insert settings. Checked here: ClickHouse
//! 26.9 creates the tables, takes the rows and gives every value back exactly, drops
//! a re-sent batch by its token and collapses re-sent rows under `FINAL`, and answers
//! docs/clickhouse.md's queries over them.
//!
//! Not checked here: the HTTP client. The embedded engine has no HTTP server, so an
//! insert the sink sends as `INSERT ... FORMAT RowBinary` with the rows as the body and
//! its settings as URL parameters runs here as one statement, the rows read `FROM
//! INFILE` and the same settings in a `SETTINGS` clause. The HTTP path (requests,
//! authentication, errors, restarts) is covered against 18.16 only, in the narrow
//! shape, by the other tests of this directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use flagpost::sink::batch::Batch;
use flagpost::sink::destination::{create_database_sql, shape_of, SHAPE_SQL, TABLES_SQL};
use flagpost::sink::rowbinary::RowBinary;
use flagpost::sink::rows::EventRow;
use flagpost::sink::{Shape, Table, Version};
use uuid::Uuid;

use super::queries;
use super::tables::{long_name, origin, sample, EVENT_ID, PERSON_ID};

/// The database the tests create, as `--clickhouse-database posthog` would.
const DATABASE: &str = "posthog";
/// A test's session takes under a second; this bounds a hung one.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// One engine at a time: each is some 250 MB resident, on a shared machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The venv's interpreter, or the test fails saying how to install it.
fn python() -> PathBuf {
    let python = root().join("tests/sdk/.deps/chdb/bin/python");
    assert!(
        python.exists(),
        "the sink's current-shape tests need chdb-core (ClickHouse 26.9 in-process) in \
         {}: run tests/sdk/install.sh (.ci/run does)",
        python.display()
    );
    python
}

/// The statements of one embedded session, run together by [`Session::run`], and
/// the files its inserts read.
struct Session {
    dir: tempfile::TempDir,
    statements: Vec<String>,
}

impl Session {
    /// A session in which the sink's database exists and is the current one.
    fn new() -> Session {
        let mut session = Session {
            dir: tempfile::tempdir().expect("temp dir"),
            statements: Vec::new(),
        };
        // As `Destination::open`: the database first, outside any database; every
        // later statement runs in it (the HTTP client's `database` parameter).
        session.push(create_database_sql(DATABASE));
        session.push(format!("USE {DATABASE}"));
        session
    }

    /// One with the sink's four tables, created in the current shape.
    fn with_tables() -> Session {
        let mut session = Session::new();
        for table in Table::ALL {
            session.push(table.create_sql(Shape::Current));
        }
        session
    }

    /// Add a statement; its answer will be at the index returned.
    fn push(&mut self, sql: impl Into<String>) -> usize {
        self.statements.push(sql.into());
        self.statements.len() - 1
    }

    /// Insert `rows` (RowBinary for the current shape) into `table` as the sink does,
    /// with the settings it sends for a batch whose token is `token`.
    fn insert(&mut self, table: Table, rows: &[u8], token: &str) -> usize {
        let file = self
            .dir
            .path()
            .join(format!("rows-{}.bin", self.statements.len()));
        std::fs::write(&file, rows).expect("write rows");
        let settings = Shape::Current.insert_settings(token);
        self.push(from_file(
            &table.insert_sql(Shape::Current),
            &file,
            &settings,
        ))
    }

    /// Insert each table's rows with the tokens of `batch`, as the worker sends it.
    fn send(&mut self, batch: &Batch, node: Uuid, tables: &[(Table, Vec<u8>)]) {
        for (table, rows) in tables {
            self.insert(*table, rows, &batch.token(node, *table));
        }
    }

    /// Run every statement in order in one fresh session; the answers, by index.
    fn run(self) -> Vec<Vec<u8>> {
        let python = python();
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let job = self.dir.path().join("job.json");
        let body = serde_json::json!({
            "path": self.dir.path().join("session"),
            "statements": self.statements,
        });
        std::fs::write(&job, body.to_string()).expect("write job");
        let (out, err) = (self.dir.path().join("out"), self.dir.path().join("err"));
        let file = |p: &Path| std::fs::File::create(p).expect("output file");
        let mut child = Command::new(&python)
            .arg(root().join("tests/sink/chdb_run.py"))
            .arg(&job)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null())
            .stdout(file(&out))
            .stderr(file(&err))
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
        let started = Instant::now();
        while child.try_wait().expect("wait").is_none() {
            if started.elapsed() > RUN_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                panic!("chdb_run.py still running after {RUN_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let stdout = std::fs::read_to_string(&out).unwrap_or_default();
        let stderr = std::fs::read_to_string(&err).unwrap_or_default();
        let answer: serde_json::Value = serde_json::from_str(&stdout)
            .unwrap_or_else(|_| panic!("chdb_run.py printed {stdout:?}; stderr:\n{stderr}"));
        if let Some(i) = answer["failed"].as_u64() {
            panic!(
                "ClickHouse 26.9 refused statement {i}:\n{}\n{}",
                self.statements[i as usize], answer["error"]
            );
        }
        let results = answer["results"].as_array().expect("results");
        assert_eq!(results.len(), self.statements.len());
        results
            .iter()
            .map(|r| {
                let text = r.as_str().expect("base64 text");
                base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .expect("base64")
            })
            .collect()
    }
}

/// The sink's HTTP insert, `INSERT INTO t (...) FORMAT RowBinary` with the rows as the
/// body and `settings` as URL parameters, as one statement of the embedded engine.
fn from_file(insert: &str, file: &Path, settings: &[(&str, &str)]) -> String {
    let head = insert
        .strip_suffix(" FORMAT RowBinary")
        .expect("a RowBinary insert");
    let file = file.to_str().expect("a UTF-8 temp path");
    let mut sql = format!("{head} FROM INFILE {}", quote(file));
    let pairs: Vec<String> = settings
        .iter()
        .map(|(name, value)| format!("{name} = {}", quote(value)))
        .collect();
    if !pairs.is_empty() {
        sql.push_str(&format!(" SETTINGS {}", pairs.join(", ")));
    }
    sql + " FORMAT RowBinary"
}

/// A ClickHouse string literal.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

fn text(answer: &[u8]) -> &str {
    std::str::from_utf8(answer).expect("a UTF-8 answer")
}

/// Every column of `table` in insert order, as a SELECT list.
fn column_list(table: Table) -> String {
    let names: Vec<&str> = table
        .columns(Shape::Current)
        .iter()
        .map(|(n, _)| *n)
        .collect();
    names.join(", ")
}

/// Plain `count()` of each table (no FINAL), in [`Table::ALL`]'s order.
fn counts_sql(modifier: &str) -> String {
    let counts: Vec<String> = Table::ALL
        .iter()
        .map(|t| format!("(SELECT count() FROM {} {modifier})", t.name()))
        .collect();
    format!("SELECT {}", counts.join(", "))
}

#[test]
#[ignore = "needs chdb-core (current ClickHouse): run by .ci/run, cargo test -- --include-ignored"]
fn tables_are_created_by_current_clickhouse() {
    let mut s = Session::new();
    let version = s.push("SELECT version()");
    let (no_shape, no_tables) = (s.push(SHAPE_SQL), s.push(TABLES_SQL));
    for table in Table::ALL {
        s.push(table.create_sql(Shape::Current));
    }
    // IF NOT EXISTS over the tables now there (18.16 would check the types anyway).
    s.push(Table::Event.create_sql(Shape::Current));
    let (shape, tables) = (s.push(SHAPE_SQL), s.push(TABLES_SQL));
    let engines = s.push(
        "SELECT name, engine, partition_key, sorting_key FROM system.tables \
         WHERE database = currentDatabase() ORDER BY name",
    );
    let settings = s.push(
        "SELECT name, extract(engine_full, 'SETTINGS .*') FROM system.tables \
         WHERE database = currentDatabase() ORDER BY name",
    );
    let columns = s.push(
        "SELECT table, name, type FROM system.columns WHERE database = currentDatabase() \
         ORDER BY table, position FORMAT TabSeparatedRaw",
    );
    let a = s.run();
    eprintln!("embedded ClickHouse {}", text(&a[version]).trim());
    let version = Version::parse(text(&a[version])).expect("a version");
    assert!(version.major >= 26, "{version}");
    assert_eq!(version.shape(), Shape::Current);
    assert_eq!(shape_of(&a[no_shape]), None);
    assert_eq!(text(&a[no_tables]), "");
    assert_eq!(shape_of(&a[shape]), Some(Shape::Current));
    let mut names: Vec<&str> = text(&a[tables]).lines().collect();
    names.sort_unstable();
    assert_eq!(names, ["events", "groups", "person", "person_distinct_id2"]);
    assert_eq!(
        text(&a[engines]),
        "events\tReplacingMergeTree\ttoYYYYMM(timestamp)\tteam_id, toDate(timestamp), event, \
         cityHash64(distinct_id), cityHash64(uuid)\n\
         groups\tReplacingMergeTree\t\tteam_id, group_type_index, group_key\n\
         person\tReplacingMergeTree\t\tteam_id, id\n\
         person_distinct_id2\tReplacingMergeTree\t\tteam_id, distinct_id\n"
    );
    assert_eq!(
        text(&a[settings]),
        "events\tSETTINGS non_replicated_deduplication_window = 1000, index_granularity = 8192\n\
         groups\tSETTINGS non_replicated_deduplication_window = 1000, index_granularity = 8192\n\
         person\tSETTINGS non_replicated_deduplication_window = 1000, index_granularity = 8192\n\
         person_distinct_id2\tSETTINGS index_granularity = 512, \
         non_replicated_deduplication_window = 1000\n"
    );
    // Every column with the type the sink declares and encodes for, in insert order.
    let mut want = Vec::new();
    let mut by_name = Table::ALL;
    by_name.sort_by_key(|t| t.name());
    for table in by_name {
        for (name, ty) in table.columns(Shape::Current) {
            want.push(format!(
                "{}\t{}\t{ty}\n",
                table.name(),
                name.trim_matches('`')
            ));
        }
    }
    assert_eq!(text(&a[columns]), want.concat());
}

#[test]
#[ignore = "needs chdb-core (current ClickHouse): run by .ci/run, cargo test -- --include-ignored"]
fn rows_of_every_table_round_trip_exactly() {
    let name = long_name();
    let rows = sample(Shape::Current, &name);
    let node = Uuid::from_u128(0x5eed);
    let batch = Batch {
        first: 3,
        last: 3,
        ..Batch::default()
    };
    let mut s = Session::with_tables();
    s.send(&batch, node, &rows);
    let binary: Vec<usize> = rows
        .iter()
        .map(|(t, _)| {
            s.push(format!(
                "SELECT {} FROM {} FINAL FORMAT RowBinary",
                column_list(*t),
                t.name()
            ))
        })
        .collect();
    let readable: Vec<usize> = rows
        .iter()
        .map(|(t, _)| s.push(format!("SELECT * FROM {} FINAL", t.name())))
        .collect();
    let exact = s.push(
        "SELECT toUnixTimestamp64Micro(timestamp), toUnixTimestamp64Micro(created_at), \
         toUInt128(uuid), toUInt128(person_id), length(event), \
         JSONExtractString(properties, '$group_0'), JSONExtractFloat(properties, 'n') \
         FROM events",
    );
    let a = s.run();
    // Byte for byte: what the server writes back is what the sink encoded.
    for ((table, encoded), i) in rows.iter().zip(&binary) {
        assert_eq!(&a[*i], encoded, "{} read back", table.name());
    }
    let committed = "2023-11-14 22:15:00\t3";
    let want = [
        format!(
            "{EVENT_ID}\t{name}\t{{\"$groups\":{{\"company\":\"acme\"}},\"$group_0\":\"acme\",\
             \"n\":1.5}}\t2023-11-14 22:13:20.123000\t7\tuser-1\ta:href=\"/x\"\t\
             2023-11-14 22:13:20.456000\t{PERSON_ID}\tacme\t\téquipe\t\tg4\t{committed}\n"
        ),
        format!(
            "{PERSON_ID}\t2023-07-22 04:26:40.000\t7\t{{\"plan\":\"pro\"}}\t1\t0\t3\t{committed}\n"
        ),
        format!("7\tuser-1\t{PERSON_ID}\t0\t3\t{committed}\n"),
        format!("0\tacme\t2023-09-18 01:20:00.000\t7\t{{\"seats\":12}}\t{committed}\n"),
    ];
    for (((table, _), i), want) in rows.iter().zip(&readable).zip(want) {
        assert_eq!(text(&a[*i]), want, "{}", table.name());
    }
    assert_eq!(
        text(&a[exact]),
        format!(
            "1700000000123000\t1700000000456000\t{}\t{}\t{}\tacme\t1.5\n",
            Uuid::parse_str(EVENT_ID).unwrap().as_u128(),
            Uuid::parse_str(PERSON_ID).unwrap().as_u128(),
            name.len()
        )
    );
}

/// An event of the sample's batch in the next month, so the batch writes two
/// partitions of `events`.
fn december_event() -> Vec<u8> {
    let mut out = RowBinary::default();
    EventRow {
        uuid: Uuid::from_u128(0xdec),
        event: "paid",
        properties: b"{}",
        timestamp: 1_701_993_600_000,
        team_id: 7,
        distinct_id: "user-1",
        elements_chain: "",
        created_at: 1_701_993_600_001,
        person_id: Uuid::parse_str(PERSON_ID).unwrap(),
        groups: [""; 5],
        origin: origin(3),
    }
    .encode(Shape::Current, &mut out);
    out.into_bytes()
}

#[test]
#[ignore = "needs chdb-core (current ClickHouse): run by .ci/run, cargo test -- --include-ignored"]
fn a_resent_batch_is_dropped_by_its_token() {
    let mut rows = sample(Shape::Current, "resent");
    let events = rows
        .iter_mut()
        .find(|(t, _)| *t == Table::Event)
        .expect("events");
    let december = december_event();
    events.1.extend_from_slice(&december);
    let node = Uuid::from_u128(0x5eed);
    let batch = |first, last| Batch {
        first,
        last,
        ..Batch::default()
    };
    let mut s = Session::with_tables();
    // Merges would collapse copies on their own: a plain count() must show what the
    // inserts left.
    for table in Table::ALL {
        s.push(format!("SYSTEM STOP MERGES {}", table.name()));
    }
    let parts = "SELECT count() FROM system.parts WHERE database = currentDatabase() \
                 AND table = 'events' AND active";
    s.send(&batch(1, 2), node, &rows);
    let first = (s.push(counts_sql("")), s.push(parts));
    // Re-sent after a crash: the same batch, the same tokens.
    s.send(&batch(1, 2), node, &rows);
    let again = (s.push(counts_sql("")), s.push(parts));
    // The same rows in another batch (another token) are inserted again...
    s.send(&batch(3, 4), node, &rows);
    let other = (s.push(counts_sql("")), s.push(parts));
    // ...and collapse under FINAL, and in the merge that comes.
    let last = s.push(counts_sql("FINAL"));
    let read_back = s.push(format!(
        "SELECT {} FROM events FINAL ORDER BY timestamp FORMAT RowBinary",
        column_list(Table::Event)
    ));
    for table in Table::ALL {
        s.push(format!("SYSTEM START MERGES {}", table.name()));
        s.push(format!("OPTIMIZE TABLE {} FINAL", table.name()));
    }
    let merged = s.push(counts_sql(""));
    let a = s.run();
    let answer = |(counts, parts): (usize, usize)| {
        format!("{}/{}", text(&a[counts]).trim(), text(&a[parts]).trim())
    };
    // One part per month for a batch's events.
    // person, person_distinct_id2, groups, events / parts of events
    assert_eq!(answer(first), "1\t1\t1\t2/2");
    assert_eq!(answer(again), "1\t1\t1\t2/2", "a repeated token is dropped");
    assert_eq!(answer(other), "2\t2\t2\t4/4", "another token is not");
    assert_eq!(text(&a[last]), "1\t1\t1\t2\n");
    assert_eq!(&a[read_back], &rows[0].1);
    assert_eq!(text(&a[merged]), "1\t1\t1\t2\n");
}

#[test]
#[ignore = "needs chdb-core (current ClickHouse): run by .ci/run, cargo test -- --include-ignored"]
fn the_documented_queries_answer_exactly_on_the_current_shape() {
    let queries = queries::documented_queries();
    assert_eq!(queries.len(), queries::ANSWERS.len(), "{queries:?}");
    let mut s = Session::with_tables();
    for (table, rows) in queries::rows(Shape::Current) {
        s.insert(table, &rows, table.name());
    }
    let answers: Vec<usize> = queries.iter().map(|q| s.push(q.as_str())).collect();
    let a = s.run();
    for ((query, i), want) in queries.iter().zip(answers).zip(queries::ANSWERS) {
        assert_eq!(text(&a[i]), want, "{query}");
    }
}
