//! The compactor's thread: a failing step is reported, and it recovers.

use super::*;

#[test]
fn the_thread_reports_a_failing_step_and_recovers() {
    let mut f = fixture(Compaction::default());
    f.push(&story());
    f.compactor.fail_at = Some((Source::Log, 0));
    let stats = f.compactor.stats();
    let Fixture {
        compactor,
        log,
        _dir,
        ..
    } = f;
    let handle = spawn(compactor).unwrap();
    // The failed step marks it unhealthy (the server then refuses new events) ...
    let deadline = Instant::now() + Duration::from_secs(5);
    while stats.healthy.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "never reported unhealthy");
        std::thread::sleep(Duration::from_millis(1));
    }
    // ... and the retry after the back-off applies everything and clears it.
    while !(stats.healthy.load(Ordering::SeqCst) && log.shared().depth() == 0) {
        assert!(Instant::now() < deadline, "never recovered");
        std::thread::sleep(Duration::from_millis(5));
    }
    handle.stop();
    assert_eq!(stats.applied.load(Ordering::Relaxed), 8);
}
