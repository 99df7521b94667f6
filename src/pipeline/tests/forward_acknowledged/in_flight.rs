//! Several requests of a window on their way at once: the window's progress moves
//! only over the requests taken without a gap, a request taken past a failed one is
//! not sent again by the same forwarder, and the failed one goes again byte for byte.

use super::*;

#[tokio::test]
async fn progress_moves_over_the_requests_taken_without_a_gap() {
    // 4,000 events of one project: one window of four 1,000-event requests.
    let edge = edge(&["e"; 4_000], |_| 1);
    let seqs = edge.entries();
    let upstream = Upstream::start().await;
    // The second request fails; its backoff is the forwarder's own (a second at most).
    let second = edge.uuids[0][1_500].clone();
    {
        let mut answers = upstream.answers.lock().unwrap();
        answers.holding = Some((second.clone(), 503));
        answers.no_retry_after = true;
    }
    let mut forwarder = edge.forwarder(&upstream);
    forwarder.step().await.unwrap();

    let seen = upstream.seen();
    let statuses: Vec<u16> = seen.iter().map(|s| s.status).collect();
    assert_eq!(seen.len(), 4, "{statuses:?}");
    // The first request goes alone, then the three others at once, in any order.
    assert_eq!(seen[0].uuids(), edge.uuids[0][..1_000]);
    let mut rest = statuses[1..].to_vec();
    rest.sort();
    assert_eq!(rest, [200, 200, 503]);
    let (checkpoint, state, _) = edge.progress();
    let cutoff = state.as_ref().unwrap().window.as_ref().unwrap().cutoff;
    assert_eq!(checkpoint, 0);
    assert_eq!(
        state,
        Some(State {
            done: 0,
            window: window(&seqs, 1, cutoff)
        }),
        "the third and fourth taken, but not the second: progress stops at it"
    );

    // Upstream takes it again: after the backoff, only the failed request goes.
    upstream.answers.lock().unwrap().holding = None;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    forwarder.step().await.unwrap();
    let seen = upstream.seen();
    assert_eq!(seen.len(), 5);
    let failed = seen[1..4].iter().find(|s| s.status == 503).unwrap();
    assert_eq!((seen[4].status, &seen[4].events), (200, &failed.events));
    assert!(seen[4].uuids().contains(&second));
    let last = *seqs.last().unwrap();
    let (_, state, _) = edge.progress();
    assert_eq!(
        state,
        Some(State {
            done: last,
            window: None
        })
    );
    let mut taken = upstream.taken();
    taken.sort();
    let mut stored = edge.uuids[0].clone();
    stored.sort();
    assert_eq!(taken, stored, "every event taken once");
}
