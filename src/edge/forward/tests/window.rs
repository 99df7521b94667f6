//! Sending one project's window, pass by pass: against an upstream that fails, a pass
//! sends one request alone and not the window (one failure is enough to learn
//! upstream is down, and the rest would only add to its load); once upstream takes
//! requests again the rest follow and the window is saved done. A window with nothing
//! left to send (its event blocks deleted before they were forwarded) is done and
//! saved without a request, so the checkpoint can pass its entries.

use std::path::Path;
use std::sync::Arc;

use super::{forwarder_over, lines, upstream};
use crate::edge::answer::{Backoff, BACKOFF_START};
use crate::edge::forward::cursor::{self, State, Window};
use crate::edge::forward::deliver::Pending;
use crate::edge::forward::window::{Partial, Taken};
use crate::edge::forward::{Forwarder, Sending, RETRY_CAP};
use crate::edge::Client;
use crate::store::outbox::{Outbox, FORWARD};
use crate::store::Trees;

/// The project whose window is sent, and the outbox entries its window spans.
const PROJECT: u64 = 1;
const FIRST: u64 = 1;
const LAST: u64 = 3;

/// A forwarder whose project has a window of `parts` one-event requests to send to
/// `url`; with the state its window was planned from, and the outbox its progress is
/// saved in.
fn forwarder(dir: &Path, url: &str, parts: usize) -> (Forwarder, State, Outbox) {
    let db = sled::open(dir.join("db")).unwrap();
    let trees = Trees::open(&db, dir).unwrap();
    let outbox = Outbox::from_tree(trees.outbox.clone());
    outbox.set_readers(&[FORWARD]).unwrap();
    let mut forwarder = forwarder_over(dir, &trees, outbox.clone(), url);
    let window = Window {
        first: FIRST,
        last: LAST,
        cutoff: 0,
        part: 0,
    };
    let state = State {
        done: 0,
        window: Some(window),
    };
    let sending = Sending {
        state: state.clone(),
        lines: Arc::new(lines(parts, None, None)),
        parts: (0..parts).map(|i| (vec![i], false)).collect(),
        pending: Partial::new(),
        taken: Taken::new(),
        backoff: Backoff::new(BACKOFF_START, RETRY_CAP),
        next_try: None,
        paused: None,
        paused_key: None,
    };
    forwarder.sending.insert(PROJECT, sending);
    (forwarder, state, outbox)
}

/// The project's progress as saved in the outbox.
fn saved(outbox: &Outbox) -> Option<State> {
    cursor::states(&outbox.reader(FORWARD))
        .unwrap()
        .remove(&PROJECT)
}

const DONE: State = State {
    done: LAST,
    window: None,
};

#[tokio::test]
async fn a_failing_upstream_gets_one_request_a_pass_and_the_rest_follow_its_return() {
    let dir = tempfile::tempdir().unwrap();
    let (failing, failed) = upstream(usize::MAX, 503).await;
    let (mut forwarder, state, outbox) = forwarder(dir.path(), &failing, 3);
    let delivered = forwarder.send_window(PROJECT, &state).await.unwrap();
    assert_eq!(delivered, 0, "nothing delivered");
    assert_eq!(*failed.lock().unwrap(), [1], "one request alone");
    let s = &forwarder.sending[&PROJECT];
    assert_eq!(s.state, state, "nothing taken, nothing moves");
    let whole: Pending = std::iter::once(0..1).collect();
    assert_eq!(s.pending.get(&0), Some(&whole), "the first part kept whole");
    assert!(s.next_try.is_some());
    assert_eq!(saved(&outbox), None);

    // Upstream back, and the retry due: every part goes, and the window is done.
    let (working, taken) = upstream(usize::MAX, 200).await;
    forwarder.client = Client::new(&working).unwrap();
    forwarder.sending.get_mut(&PROJECT).unwrap().next_try = None;
    let delivered = forwarder.send_window(PROJECT, &state).await.unwrap();
    assert_eq!(*taken.lock().unwrap(), [1, 1, 1]);
    assert_eq!(delivered, 3, "the three requests' events");
    assert_eq!(
        *failed.lock().unwrap(),
        [1],
        "nothing more to the old upstream"
    );
    assert_eq!(forwarder.sending[&PROJECT].state, DONE);
    assert_eq!(saved(&outbox), Some(DONE));
}

#[tokio::test]
async fn a_window_with_nothing_left_to_send_is_done_without_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let (url, seen) = upstream(usize::MAX, 200).await;
    // Its blocks were deleted before they were forwarded: no part to send.
    let (mut forwarder, state, outbox) = forwarder(dir.path(), &url, 0);
    assert_eq!(forwarder.send_window(PROJECT, &state).await.unwrap(), 0);
    assert!(seen.lock().unwrap().is_empty());
    assert_eq!(forwarder.sending[&PROJECT].state, DONE);
    assert_eq!(
        saved(&outbox),
        Some(DONE),
        "saved, for the checkpoint to pass"
    );
}
