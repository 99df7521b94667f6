//! The compactor's tests, end to end over a real log and database: [`Fixture`] holds
//! both, and each file below tests one concern.

mod events;
mod fold_thread;
mod folds;
mod lanes;
mod once;
mod person_counts;
mod person_events;
mod persons;
mod synced;
mod worker;

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};
use uuid::Uuid;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use super::chunk::Source;
use super::retention::DAY_MS;
use super::*;
use crate::config::Compaction;
use crate::log::Record;
use crate::store::keys::{CHECKPOINT_KEY, NEXT_BLOCK_KEY};
use crate::store::query::{self, EventFilter};

const NOW: i64 = 1_700_000_000_000;

struct Fixture {
    _dir: tempfile::TempDir,
    /// For the log tree of earlier versions.
    db: sled::Db,
    trees: Trees,
    log: log::Appender,
    compactor: Compactor,
}

/// Small segments, so the tests cross segment boundaries.
const SEGMENT: u64 = 4096;

fn open_log(dir: &std::path::Path, checkpoint: Option<u64>) -> (log::Appender, log::Reader) {
    log::open_for_tests(&dir.join(log::DIR_NAME), 1, checkpoint, SEGMENT)
}

fn fixture(settings: Compaction) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let trees = Trees::open(&db, dir.path()).unwrap();
    let (log, reader) = open_log(dir.path(), None);
    let projects = Projects::parse(
        br#"{"projects":[{"id":1,"api_key":"phc_a"},{"id":2,"api_key":"phc_b","anonymize_ips":true}]}"#,
    )
    .unwrap();
    let test_db =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/GeoIP2-City-Test.mmdb");
    let geoip = Arc::new(crate::geoip::Database::open(&test_db).unwrap());
    let compactor = Compactor::new(
        trees.clone(),
        reader,
        Arc::new(ArcSwap::from_pointee(projects)),
        settings,
        geoip,
    );
    Fixture {
        _dir: dir,
        db,
        trees,
        log,
        compactor,
    }
}

fn record(project: u64, i: i64, event: Value) -> Record {
    let name = event["event"].as_str().unwrap().to_string();
    let distinct_id = event["distinct_id"].as_str().unwrap().to_string();
    Record {
        project,
        received_at: NOW + i,
        timestamp: NOW + i,
        sent_at: None,
        uuid: Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0000 + i as u128),
        historical: false,
        ip: Some("127.0.0.1".parse().unwrap()),
        event: name,
        distinct_id,
        data: serde_json::to_vec(&event).unwrap(),
    }
}

/// Log entries of up to three records each.
fn entries(records: &[Record]) -> impl Iterator<Item = Vec<u8>> + '_ {
    records.chunks(3).map(|group| {
        let encoded: Vec<Vec<u8>> = group.iter().map(Record::encode).collect();
        crate::log::record::encode_frame(encoded.iter().map(Vec::as_slice))
    })
}

impl Fixture {
    /// Append to the log as the writer does, up to three records per entry.
    fn push(&mut self, records: &[Record]) {
        for frame in entries(records) {
            self.log.push(&frame).unwrap();
        }
        self.log.commit().unwrap();
    }

    /// Append to the log tree that versions before the log's files wrote.
    fn push_legacy(&self, records: &[Record]) {
        for frame in entries(records) {
            let seq = self.db.generate_id().unwrap();
            self.trees.wal.insert(seq.to_be_bytes(), frame).unwrap();
        }
    }

    /// Nothing waits in the log, in its files or its tree.
    fn log_empty(&self) -> bool {
        self.trees.wal.is_empty() && self.log.shared().depth() == 0
    }

    /// A new log and compactor on the same database, as after a restart.
    fn restart(&mut self) {
        let checkpoint = self
            .trees
            .meta
            .get(CHECKPOINT_KEY)
            .unwrap()
            .and_then(|v| keys::seq(&v));
        let (log, reader) = open_log(self._dir.path(), checkpoint);
        self.log = log;
        let geoip = self.compactor.geoip.clone();
        let projects = self.compactor.projects.clone();
        self.compactor = Compactor::new(
            self.trees.clone(),
            reader,
            projects,
            Compaction::default(),
            geoip,
        );
    }

    fn drain(&mut self) {
        for _ in 0..1000 {
            if self.compactor.step().unwrap().is_idle() {
                return;
            }
        }
        panic!("compactor never went idle");
    }

    fn events(&self, project: u64) -> Vec<crate::store::StoredEvent> {
        query::events_page(&self.trees, project, EventFilter::default(), None, 100_000)
            .unwrap()
            .0
    }

    /// Everything a user can observe, in a comparable form.
    fn state(&self, project: u64) -> BTreeMap<String, Value> {
        let mut out = BTreeMap::new();
        for e in self.events(project) {
            let person = e
                .person_id
                .and_then(|id| query::person(&self.trees, project, id).unwrap());
            let mut ids = person
                .as_ref()
                .map(|p| p.distinct_ids.clone())
                .unwrap_or_default();
            ids.sort();
            out.insert(
                e.uuid.to_string(),
                json!({"event": e.event, "props": e.properties,
                       "person_ids": ids,
                       "person_props": person.map(|p| p.properties)}),
            );
        }
        for (_, name) in query::group_types(&self.trees, project).unwrap() {
            let index = query::group_type_index(&self.trees, project, &name)
                .unwrap()
                .unwrap();
            for g in query::groups_of_type(&self.trees, project, index, 1000).unwrap() {
                out.insert(
                    format!("group {name} {}", g.group_key),
                    Value::Object(g.properties),
                );
            }
        }
        out
    }
}

/// A small story touching every kind of write the compactor makes.
fn story() -> Vec<Record> {
    let events = [
        json!({"event": "$pageview", "distinct_id": "anon-1", "properties": {"$current_url": "https://x/", "$set_once": {"ref": "ad"}}}),
        json!({"event": "$identify", "distinct_id": "user-1", "properties": {"$anon_distinct_id": "anon-1", "$set": {"email": "u@x"}}}),
        json!({"event": "$pageview", "distinct_id": "anon-1", "properties": {"$groups": {"company": "acme"}}}),
        json!({"event": "$groupidentify", "distinct_id": "user-1", "properties": {"$group_type": "company", "$group_key": "acme", "$group_set": {"plan": "pro"}}}),
        json!({"event": "e", "distinct_id": "user-2", "$set": {"a": 1}}),
        json!({"event": "$create_alias", "distinct_id": "user-2", "properties": {"alias": "user-1"}}),
        json!({"event": "survey sent", "distinct_id": "user-2", "properties": {"$survey_id": "s1", "$survey_response": "yes"}}),
        json!({"event": "e", "distinct_id": "bot", "properties": {"$process_person_profile": false}}),
    ];
    events
        .into_iter()
        .enumerate()
        .map(|(i, e)| record(1, i as i64, e))
        .collect()
}
