//! An event block the outbox names but retention deleted before the sink read it: the
//! batch goes on with every other row (nothing waits for a block that cannot come
//! back), is acknowledged, and the loss is counted once per block in
//! `flagpost_sink_missing_blocks_total`, which the operator's alert reads, and said
//! once in the log: a batch with every block there says nothing of deleted blocks, so
//! the error is one an operator can act on.

use std::io;
use std::sync::{Arc, Mutex};

use flagpost::sink::Table;
use flagpost::store::block;

use super::worker::{drain, store, worker, CHUNKS, EVENTS_PER_CHUNK};
use super::*;

#[test]
#[ignore = "needs clickhouse-server: run by .ci/run, cargo test -- --include-ignored"]
fn a_block_deleted_before_it_was_sent_is_counted_once_and_the_rest_arrives() {
    let ch = ClickHouse::start("sink_missing");
    let s = store();
    // The first event block, gone before the worker's first pass.
    let (key, value) = s.trees.events.iter().next().unwrap().unwrap();
    let lost = u64::from(block::count(&value).expect("an event block"));
    assert!(lost > 0);
    s.trees.events.remove(&key).unwrap();

    let mut w = worker(&ch, &s);
    let (_, logs) = logged(|| drain(&mut w));
    assert_eq!(w.stats().missing_blocks.get(), 1);
    let said: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("deleted before they were sent"))
        .collect();
    // The outbox's entries make two batches; only the first misses a block.
    assert_eq!(
        said.len(),
        1,
        "once, for the one batch missing a block: {logs}"
    );
    assert!(
        said[0].contains("ERROR") && said[0].contains("blocks=1"),
        "{logs}"
    );
    let sent = CHUNKS * EVENTS_PER_CHUNK - lost;
    assert_eq!(w.stats().rows_of(Table::Event), sent);
    assert_eq!(
        ch.query("SELECT count(), uniqExact(uuid) FROM events FINAL"),
        format!("{sent}\t{sent}\n")
    );
    // The persons, links and group of the batch went in regardless.
    assert_eq!(ch.query("SELECT count() FROM person FINAL"), "2\n");
    assert_eq!(ch.query("SELECT count() FROM groups FINAL"), "1\n");
    assert_eq!(s.outbox.entries(None).unwrap().count(), 0, "acknowledged");
    assert_eq!(s.outbox.checkpoint().unwrap(), CHUNKS);
    assert_eq!(s.outbox.in_flight().unwrap(), None);
}

/// The log lines `f` writes (on this thread), with what it returns.
fn logged<T>(f: impl FnOnce() -> T) -> (T, String) {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let out = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    (out, text)
}

/// A log kept in memory.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
