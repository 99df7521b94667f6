//! The compactor's thread: a failing step is reported, and it recovers; a gate taken
//! for writing holds it between steps.

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
        db,
        trees,
    } = f;
    let open = crate::store::live::Open { db, trees };
    let live = Arc::new(crate::store::live::Live::new(_dir.path(), 1 << 20, open));
    let handle = spawn(compactor, live.clone(), Default::default()).unwrap();
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
    // A failed transaction is not a failed disk: the database was never reopened.
    assert!(live.is_live() && live.get().is_some());
}

#[test]
fn a_gate_taken_for_writing_holds_the_thread_between_steps() {
    let mut f = fixture(Compaction::default());
    f.push(&story());
    let stats = f.compactor.stats();
    let Fixture {
        compactor,
        log,
        _dir,
        db,
        trees,
    } = f;
    let waiting = log.shared().depth();
    assert!(waiting > 0);
    let gate = Arc::new(crate::support::sync::Gate::default());
    let paused = gate.clone().try_write_owned().unwrap();
    let open = crate::store::live::Open { db, trees };
    let live = Arc::new(crate::store::live::Live::new(_dir.path(), 1 << 20, open));
    let handle = spawn(compactor, live, gate).unwrap();
    // Paused before its first step: nothing applied, however long it waits.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(stats.applied.load(Ordering::Relaxed), 0);
    assert_eq!(log.shared().depth(), waiting);
    drop(paused);
    let deadline = Instant::now() + Duration::from_secs(5);
    while log.shared().depth() > 0 {
        assert!(Instant::now() < deadline, "never resumed");
        std::thread::sleep(Duration::from_millis(5));
    }
    handle.stop();
    assert_eq!(stats.applied.load(Ordering::Relaxed), 8);
}
