//! The reader's checkpoint passing one project's entries while another is midway
//! through its window: the finished project's state is cleared, the other keeps its
//! window and the requests of it upstream already took.

use super::*;

#[tokio::test]
async fn the_checkpoint_passes_a_finished_project_and_keeps_anothers_window() {
    // Three entries of project 1, then eleven of project 2: its window is two
    // requests (1,000 and 100 events).
    let edge = edge(&["e"; 1_400], |i| if i < 300 { 1 } else { 2 });
    let seqs = edge.entries();
    assert_eq!(seqs.len(), 14, "{seqs:?}");
    let upstream = Upstream::start().await;

    // Project 1's request taken, project 2's first taken and its second failed.
    upstream.script(&[200, 200, 503]);
    let mut forwarder = edge.forwarder(&upstream);
    forwarder.step().await.unwrap();
    let (checkpoint, one, two) = edge.progress();
    assert_eq!(checkpoint, 0);
    let done = |done| State { done, window: None };
    assert_eq!(one, Some(done(seqs[2])));
    let cutoff = two.as_ref().unwrap().window.as_ref().unwrap().cutoff;
    let midway = State {
        done: 0,
        window: window(&seqs[3..], 1, cutoff),
    };
    assert_eq!(two, Some(midway.clone()));

    // The next pass moves the checkpoint past project 1's entries only.
    forwarder.step().await.unwrap();
    assert_eq!(edge.progress(), (seqs[2], None, Some(midway)));
    assert_eq!(edge.entries(), seqs[3..]);

    // After a restart only the failed request goes.
    let mut forwarder = edge.forwarder(&upstream);
    forwarder.step().await.unwrap();
    forwarder.step().await.unwrap();
    assert_eq!(edge.progress(), (seqs[13], None, None));
    let sizes: Vec<(u16, usize)> = upstream
        .seen()
        .iter()
        .map(|s| (s.status, s.events.len()))
        .collect();
    assert_eq!(sizes, [(200, 300), (200, 1000), (503, 100), (200, 100)]);
    let mut all = edge.uuids[0].clone();
    all.extend(edge.uuids[1].iter().cloned());
    assert_eq!(upstream.taken(), all);
}
