//! When a project whose request failed is tried again: against an upstream nothing
//! listens on, within [`PROBE`] however often it failed before; against one that
//! answered with an error, after the backoff's growing wait, which by the sixth failure
//! is past half of [`RETRY_CAP`]. The wait is read off the project's `next_try` right
//! after the pass, so the assertions compare instants the pass fixed, not how fast it ran.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use super::{forwarder_over, lines, upstream};
use crate::edge::answer::{Backoff, BACKOFF_START};
use crate::edge::forward::cursor::{State, Window};
use crate::edge::forward::window::{Partial, Taken, PROBE};
use crate::edge::forward::{Forwarder, Sending, RETRY_CAP};
use crate::store::outbox::Outbox;
use crate::store::Trees;

/// Failed tries before the pass: the backoff's ceiling (one second doubled five
/// times) is then past the cap, so its wait is between half the cap and the cap.
const EARLIER_FAILURES: u32 = 5;

/// A forwarder whose project 1 has a window of one request (one event) to send to
/// `url`, after `failures` failed tries; with the state its window is planned from.
fn forwarder(dir: &Path, url: &str, failures: u32) -> (Forwarder, State) {
    let db = sled::open(dir.join("db")).unwrap();
    let trees = Trees::open(&db, dir).unwrap();
    let outbox = Outbox::from_tree(trees.outbox.clone());
    let mut forwarder = forwarder_over(dir, &trees, outbox, url);
    let window = Window {
        first: 1,
        last: 1,
        cutoff: 0,
        part: 0,
    };
    let state = State {
        done: 0,
        window: Some(window),
    };
    let mut backoff = Backoff::new(BACKOFF_START, RETRY_CAP);
    for _ in 0..failures {
        backoff.next(None);
    }
    let sending = Sending {
        state: state.clone(),
        lines: Arc::new(lines(1, None, None)),
        parts: vec![(vec![0], false)],
        pending: Partial::new(),
        taken: Taken::new(),
        backoff,
        next_try: None,
        paused: None,
        paused_key: None,
    };
    forwarder.sending.insert(1, sending);
    (forwarder, state)
}

/// One pass over the project's window against `url`, which fails its request: the
/// instants just before and after the pass, and the retry the pass set.
async fn failed_pass(url: &str, failures: u32) -> (Instant, Instant, Instant) {
    let dir = tempfile::tempdir().unwrap();
    let (mut forwarder, state) = forwarder(dir.path(), url, failures);
    let before = Instant::now();
    let delivered = forwarder.send_window(1, &state).await.unwrap();
    let after = Instant::now();
    assert_eq!(delivered, 0);
    let s = &forwarder.sending[&1];
    assert_eq!(s.backoff.failures(), failures + 1);
    assert_eq!(s.state, state, "nothing taken, nothing moves");
    (before, after, s.next_try.expect("a retry is set"))
}

/// A port that refuses connections for as long as the socket is held: bound, so no
/// other test's server can be given it, but not listening, so a connect is reset.
fn closed_port() -> (tokio::net::TcpSocket, String) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let url = format!("http://{}", socket.local_addr().unwrap());
    (socket, url)
}

#[tokio::test]
async fn an_unreachable_upstream_is_tried_again_within_the_probe_whatever_failed_before() {
    let (_held, url) = closed_port();
    for failures in [0, EARLIER_FAILURES] {
        let (before, after, next) = failed_pass(&url, failures).await;
        assert!(next > before, "{failures} failures: a retry in the future");
        assert!(
            next <= after + PROBE,
            "{failures} failures: retried {:?} after the pass",
            next - after
        );
    }
}

#[tokio::test]
async fn an_upstream_that_answered_an_error_waits_out_the_backoff() {
    // 503 without a Retry-After: the backoff alone sets the wait.
    let (url, seen) = upstream(usize::MAX, 503).await;
    let (before, after, next) = failed_pass(&url, EARLIER_FAILURES).await;
    assert_eq!(*seen.lock().unwrap(), [1]);
    assert!(next >= before + RETRY_CAP / 2, "{:?}", next - before);
    assert!(next <= after + RETRY_CAP, "{:?}", next - after);
}
