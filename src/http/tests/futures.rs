//! The size of the futures every request is answered through. A request's future is
//! moved whole (into hyper's box, into each caller's state) and is as large as the
//! largest state of any handler it may await, so one path that holds an upstream call
//! inline makes every capture and `/decide` copy kilobytes it never uses. Handlers only
//! edge mode or the console reach are boxed at their call (`Box::pin`); these bounds
//! fail when a large state creeps back onto the common path.

use std::mem::size_of;

use super::*;

/// The request future (`route`) in test builds: it was 8.5 KiB with the edge's
/// upstream calls inline and 3 KiB with them boxed; the headroom is for compilers.
const MAX_ROUTE_FUTURE: usize = 4096;

/// Capture's and `/decide`'s own futures in test builds: 1.2 to 1.7 KiB.
const MAX_HANDLER_FUTURE: usize = 2048;

/// The size of the future `f` returns, without calling it (no request is needed).
fn future_of<A, B, C, Fut, F: FnOnce(A, B, C) -> Fut>(_: F) -> usize {
    size_of::<Fut>()
}

fn future_of4<A, B, C, D, Fut, F: FnOnce(A, B, C, D) -> Fut>(_: F) -> usize {
    size_of::<Fut>()
}

#[test]
fn the_request_future_stays_small() {
    let size = future_of(route);
    assert!(
        size <= MAX_ROUTE_FUTURE,
        "route's future is {size} bytes; box the large handler (Box::pin) at its call"
    );
}

#[test]
fn capture_and_decide_hold_no_large_state_inline() {
    for (name, size) in [
        ("capture", future_of4(capture::handle)),
        ("decide", future_of4(super::super::decide::handle)),
        ("capture_v1", future_of(super::super::capture_v1::handle)),
    ] {
        assert!(
            size <= MAX_HANDLER_FUTURE,
            "{name}'s future is {size} bytes; box what only some requests await"
        );
    }
}
