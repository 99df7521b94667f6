//! The forwarder's acknowledgement, over a real store (events compacted into blocks,
//! the outbox's `forward` reader) and an upstream on loopback that accepts every
//! connection and then answers what a test says. A project's progress (its `done`,
//! its window's part) and the reader's checkpoint move only after a 2xx took the
//! request; an event upstream refuses moves on only once the dead-letter file holds
//! it; a project upstream fails holds the checkpoint back without holding the other
//! projects back. A restart then sends exactly the requests not yet taken, byte for
//! byte as before.

mod checkpoint;
mod in_flight;
mod upstream;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::compactor::Compactor;
use crate::config::Compaction;
use crate::edge::forward::cursor::{self, State, Window};
use crate::edge::forward::dead::DEAD_LETTER;
use crate::edge::forward::Forwarder;
use crate::edge::{Client, Stats};
use crate::log::{self, Record};
use crate::projects::Projects;
use crate::store::outbox::{Outbox, FORWARD};
use crate::store::Trees;
use upstream::Upstream;

/// Events are stored at this time (2023), a day past `HISTORICAL_AFTER`: every one
/// travels as `historical_migration`.
const STORED_AT: i64 = 1_700_000_000_000;
const HISTORICAL_AFTER: Duration = Duration::from_secs(86_400);
/// Projects 1 and 2 of `projects.json`, by key.
const KEYS: [&str; 2] = ["phc_one", "phc_two"];

/// An edge's store holding compacted events, and the projects they belong to.
struct Edge {
    dir: tempfile::TempDir,
    trees: Trees,
    projects: Arc<ArcSwap<Projects>>,
    /// The stored events' uuids by project, in the order they were captured.
    uuids: [Vec<String>; 2],
}

/// A store holding `names` as events, the i-th of project `project_of(i)`.
fn edge(names: &[&str], project_of: impl Fn(usize) -> u64) -> Edge {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let trees = Trees::open(&db, dir.path()).unwrap();
    let (mut appender, reader) =
        log::open_for_tests(&dir.path().join(log::DIR_NAME), 1, None, 1 << 20);
    let projects = Projects::parse(
        format!(
            r#"{{"projects":[{{"id":1,"api_key":"{}"}},{{"id":2,"api_key":"{}"}}]}}"#,
            KEYS[0], KEYS[1]
        )
        .as_bytes(),
    )
    .unwrap();
    let projects = Arc::new(ArcSwap::from_pointee(projects));
    let geoip = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/GeoIP2-City-Test.mmdb");
    let geoip = Arc::new(crate::geoip::Database::open(&geoip).unwrap());
    // As an edge runs: the compactor feeds the outbox, whose one reader forwards.
    let settings = Compaction {
        outbox: true,
        ..Compaction::default()
    };
    Outbox::from_tree(trees.outbox.clone())
        .set_readers(&[FORWARD])
        .unwrap();
    let mut compactor = Compactor::new(trees.clone(), reader, projects.clone(), settings, geoip);
    let mut uuids: [Vec<String>; 2] = Default::default();
    let records: Vec<Record> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let project = project_of(i);
            let uuid = Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0000 + i as u128);
            uuids[project as usize - 1].push(uuid.hyphenated().to_string());
            let event = json!({"event": name, "distinct_id": format!("d{}", i % 5),
                               "properties": {"i": i}});
            Record {
                project,
                received_at: STORED_AT + i as i64,
                timestamp: STORED_AT + i as i64,
                sent_at: None,
                uuid,
                historical: false,
                ip: None,
                event: name.to_string(),
                distinct_id: format!("d{}", i % 5),
                data: serde_json::to_vec(&event).unwrap(),
            }
        })
        .collect();
    // Several log entries, so the outbox holds several entries too.
    for group in records.chunks(100) {
        let encoded: Vec<Vec<u8>> = group.iter().map(Record::encode).collect();
        let frame = log::record::encode_frame(encoded.iter().map(Vec::as_slice));
        appender.push(&frame).unwrap();
        appender.commit().unwrap();
        while !compactor.step().unwrap().is_idle() {}
    }
    Edge {
        dir,
        trees,
        projects,
        uuids,
    }
}

impl Edge {
    /// A forwarder as the server starts one, fresh: nothing of a previous one's
    /// memory, only what the outbox holds.
    fn forwarder(&self, upstream: &Upstream) -> Forwarder {
        Forwarder::new(
            Client::new(&upstream.url).unwrap(),
            self.outbox(),
            self.trees.events.clone(),
            self.trees.blocks.clone(),
            self.projects.clone(),
            Stats::default(),
            self.dir.path().to_path_buf(),
            HISTORICAL_AFTER,
        )
    }

    fn outbox(&self) -> Outbox {
        Outbox::from_tree(self.trees.outbox.clone())
    }

    /// The outbox's entries' seqs.
    fn entries(&self) -> Vec<u64> {
        let entries = self.outbox().entries(None).unwrap();
        entries.map(|e| e.unwrap().seq).collect()
    }

    /// The `forward` reader's checkpoint, and each project's stored state.
    fn progress(&self) -> (u64, Option<State>, Option<State>) {
        let reader = self.outbox().reader(FORWARD);
        let mut states = cursor::states(&reader).unwrap();
        (
            reader.checkpoint().unwrap(),
            states.remove(&1),
            states.remove(&2),
        )
    }

    fn dead_letters(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.dir.path().join(DEAD_LETTER)).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// The window every project's events fall in when the outbox's entries are `seqs`.
fn window(seqs: &[u64], part: usize, cutoff: i64) -> Option<Window> {
    Some(Window {
        first: seqs[0],
        last: *seqs.last().unwrap(),
        cutoff,
        part,
    })
}

#[tokio::test]
async fn nothing_moves_until_a_request_is_taken_and_a_restart_resends_the_same_bytes() {
    // 1,100 events: two requests of one window (1,000 and 100).
    let names = vec!["e"; 1_100];
    let edge = edge(&names, |_| 1);
    let seqs = edge.entries();
    assert!(seqs.len() >= 2, "{seqs:?}");
    let upstream = Upstream::start().await;

    // Upstream fails the first request after taking the connection.
    upstream.script(&[503]);
    let wait = edge.forwarder(&upstream).step().await.unwrap();
    assert_eq!(wait, crate::edge::forward::POLL, "nothing delivered");
    let (checkpoint, state, _) = edge.progress();
    assert_eq!(checkpoint, 0);
    let state = state.expect("the window is fixed before its first request");
    let cutoff = state.window.as_ref().unwrap().cutoff;
    assert_eq!(state.done, 0);
    assert_eq!(state.window, window(&seqs, 0, cutoff));
    assert_eq!(edge.entries(), seqs, "the outbox keeps every entry");
    assert!(upstream.taken().is_empty());

    // Started again: the first request is taken, the second fails.
    upstream.script(&[200, 500]);
    let wait = edge.forwarder(&upstream).step().await.unwrap();
    assert_eq!(wait, Duration::ZERO, "a request went through");
    let (checkpoint, state, _) = edge.progress();
    assert_eq!(checkpoint, 0);
    assert_eq!(
        state,
        Some(State {
            done: 0,
            window: window(&seqs, 1, cutoff)
        }),
        "one request of the window taken, no entry done"
    );

    // Started again: only the second request goes, and then the window is done.
    upstream.script(&[]);
    let mut forwarder = edge.forwarder(&upstream);
    forwarder.step().await.unwrap();
    let (_, state, _) = edge.progress();
    let last = *seqs.last().unwrap();
    assert_eq!(
        state,
        Some(State {
            done: last,
            window: None
        })
    );
    // The next pass moves the checkpoint past every entry the project is done with.
    assert_eq!(forwarder.step().await.unwrap(), crate::edge::forward::POLL);
    let (checkpoint, state, _) = edge.progress();
    assert_eq!((checkpoint, state), (last, None));
    assert_eq!(
        edge.entries(),
        Vec::<u64>::new(),
        "forwarded, the entries are released"
    );

    let seen = upstream.seen();
    let statuses: Vec<(u16, usize)> = seen.iter().map(|s| (s.status, s.events.len())).collect();
    assert_eq!(statuses, [(503, 1000), (200, 1000), (500, 100), (200, 100)]);
    assert!(seen.iter().all(|s| s.historical && s.api_key == KEYS[0]));
    // Each resend is the failed request's events, byte for byte.
    assert_eq!(seen[0].events, seen[1].events);
    assert_eq!(seen[2].events, seen[3].events);
    assert_eq!(
        upstream.taken(),
        edge.uuids[0],
        "every event taken once, in order"
    );
}

#[tokio::test]
async fn a_refused_event_moves_on_only_once_the_dead_letter_file_holds_it() {
    let mut names = vec!["e"; 10];
    names[3] = "refused";
    let edge = edge(&names, |_| 1);
    let seqs = edge.entries();
    let upstream = Upstream::start().await;

    // The dead-letter file cannot be written: its folder's name is a file.
    let blocker = edge.dir.path().join(DEAD_LETTER);
    let blocker = blocker.parent().unwrap();
    std::fs::write(blocker, b"").unwrap();
    edge.forwarder(&upstream).step().await.unwrap();
    let (checkpoint, state, _) = edge.progress();
    assert_eq!(checkpoint, 0);
    let cutoff = state.as_ref().unwrap().window.as_ref().unwrap().cutoff;
    assert_eq!(
        state,
        Some(State {
            done: 0,
            window: window(&seqs, 0, cutoff)
        }),
        "the refused event is neither delivered nor kept: nothing moves"
    );
    // Bisected down to the one event, and stopped there.
    let refused = edge.uuids[0][3].clone();
    let seen = upstream.seen();
    let last = seen.last().unwrap();
    assert_eq!((last.status, last.uuids()), (400, vec![refused.clone()]));
    assert!(!upstream.taken().contains(&refused));

    // Writable again: after a restart the event is dead-lettered and the window done.
    std::fs::remove_file(blocker).unwrap();
    let mut forwarder = edge.forwarder(&upstream);
    forwarder.step().await.unwrap();
    forwarder.step().await.unwrap();
    let letters = edge.dead_letters();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0]["project"], 1);
    assert_eq!(letters[0]["reason"], "400 no");
    assert_eq!(letters[0]["event"]["uuid"], refused.as_str());
    assert_eq!(letters[0]["event"]["event"], "refused");
    let last_seq = *seqs.last().unwrap();
    assert_eq!(edge.progress(), (last_seq, None, None));
    // Upstream took every other event (some twice: the restart resent the window).
    let mut taken = upstream.taken();
    taken.sort();
    taken.dedup();
    let mut others = edge.uuids[0].clone();
    others.remove(3);
    assert_eq!(taken, others);
}

#[tokio::test]
async fn a_project_upstream_fails_holds_the_checkpoint_but_not_the_others() {
    // Projects 1 and 2 alternate, so every entry holds events of both.
    let names = vec!["e"; 300];
    let edge = edge(&names, |i| 1 + (i % 2) as u64);
    let seqs = edge.entries();
    let last = *seqs.last().unwrap();
    let upstream = Upstream::start().await;

    upstream.fail_key(KEYS[1], 502);
    let mut forwarder = edge.forwarder(&upstream);
    forwarder.step().await.unwrap();
    forwarder.step().await.unwrap();
    let (checkpoint, one, two) = edge.progress();
    let cutoff = two.as_ref().unwrap().window.as_ref().unwrap().cutoff;
    let done = State {
        done: last,
        window: None,
    };
    assert_eq!(one, Some(done), "project 1 delivered everything");
    assert_eq!(
        two,
        Some(State {
            done: 0,
            window: window(&seqs, 0, cutoff)
        })
    );
    assert_eq!(
        checkpoint, 0,
        "every entry still has project 2's events to send"
    );
    assert_eq!(edge.entries(), seqs);
    assert_eq!(upstream.taken(), edge.uuids[0]);

    // Project 2's requests are taken after a restart: the checkpoint passes everything.
    upstream.answers.lock().unwrap().failing = None;
    let mut forwarder = edge.forwarder(&upstream);
    forwarder.step().await.unwrap();
    forwarder.step().await.unwrap();
    assert_eq!(edge.progress(), (last, None, None));
    assert_eq!(edge.entries(), Vec::<u64>::new());
    let taken = upstream.taken();
    assert_eq!(taken[..150], edge.uuids[0]);
    assert_eq!(taken[150..], edge.uuids[1]);
}

#[tokio::test]
async fn a_failed_project_waits_for_its_retry_and_a_refused_key_for_a_new_one() {
    let edge = edge(&["e"; 10], |_| 1);
    let seqs = edge.entries();
    let upstream = Upstream::start().await;
    let requests = || upstream.seen().len();

    // A 503 asking for ten minutes: the next passes send nothing.
    upstream.fail_key(KEYS[0], 503);
    let mut forwarder = edge.forwarder(&upstream);
    forwarder.step().await.unwrap();
    assert_eq!(requests(), 1);
    forwarder.step().await.unwrap();
    forwarder.step().await.unwrap();
    assert_eq!(requests(), 1, "retried before upstream's Retry-After");

    // A 401 pauses the project while its key stays the one refused.
    upstream.fail_key(KEYS[0], 401);
    let mut forwarder = edge.forwarder(&upstream);
    forwarder.step().await.unwrap();
    assert_eq!(requests(), 2);
    forwarder.step().await.unwrap();
    assert_eq!(requests(), 2, "the refused key tried again unchanged");
    assert_eq!(edge.progress().0, 0);

    // projects.json gives the project a new key: tried at once, and taken.
    let json = r#"{"projects":[{"id":1,"api_key":"phc_new"},{"id":2,"api_key":"phc_two"}]}"#;
    edge.projects
        .store(Arc::new(Projects::parse(json.as_bytes()).unwrap()));
    forwarder.step().await.unwrap();
    let seen = upstream.seen();
    assert_eq!(seen.len(), 3);
    assert_eq!((seen[2].api_key.as_str(), seen[2].status), ("phc_new", 200));
    forwarder.step().await.unwrap();
    assert_eq!(upstream.taken(), edge.uuids[0]);
    assert_eq!(edge.progress(), (*seqs.last().unwrap(), None, None));
    assert_eq!(edge.entries(), Vec::<u64>::new());
}
