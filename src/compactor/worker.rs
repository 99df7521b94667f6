//! The compactor's thread: steps until stopped, idles when there is nothing to do,
//! backs off (and reports itself unhealthy) while steps fail, runs retention every
//! few minutes, and stops for good on a panic rather than risk applying a chunk twice.
//!
//! It also owns the database's recovery. When a step fails and sled cannot even flush,
//! or the tables' journal failed a record, the database has kept an I/O error (a full
//! disk, say) that it returns until reopened: the thread closes the database
//! ([`Live::close`]), opens it again as soon as it can write, and resumes from the
//! durable checkpoint. A full disk is waited out however long it lasts, as a restart
//! would meet it too; anything else that keeps the database from reopening, or a
//! panic, marks it failed, and `/_liveness` (and the systemd watchdog) then ask for a
//! restart.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{fold, Compactor};
use crate::store::live::{is_disk_full, still_writes, Live};
use crate::store::rollup::hot::Moment;

/// With nothing to do, look again after this long (the lag floor at low load).
const IDLE_WAIT: Duration = Duration::from_millis(5);
/// A step that applied fewer than [`FEW_RECORDS`] records waits this long before the
/// next, so the next chunk gathers more: each chunk syncs the event block files once,
/// and a steady stream of single events would otherwise make chunks of a few records
/// that each pay a sync beside the log's.
const GATHER_WAIT: Duration = Duration::from_millis(5);
const FEW_RECORDS: usize = 256;
/// Records applied between two idle steps that make a backlog: the step that empties
/// the log after one hands the memory freed back at once ([`crate::support::idle::freed`]).
/// A trickle, idle between chunks, leaves it to [`crate::support::idle::idle`]'s interval.
const BACKLOG_RECORDS: usize = 10_000;
/// After a storage error, wait before retrying the same step.
const ERROR_BACKOFF: Duration = Duration::from_millis(500);
/// How often old events are deleted.
const RETENTION_INTERVAL: Duration = Duration::from_secs(600);
/// Request handlers hold the database for one request (an NDJSON export for its whole
/// stream): a reopen waits this long for them to let go before giving up.
const RELEASE_PATIENCE: Duration = Duration::from_secs(30);
/// How often a reopen is tried while the disk is still full.
const REOPEN_INTERVAL: Duration = Duration::from_millis(200);
/// A reopen failing for another reason than a full disk for this long is given up:
/// a restart is then the better chance.
const REOPEN_PATIENCE: Duration = Duration::from_secs(30);
/// The environment variable that replaces [`REOPEN_PATIENCE`] (in milliseconds), for
/// tests only: the integration test of giving up would otherwise wait 30 s. Read once,
/// at the first reopen that fails; a value that does not parse is ignored with a warning.
const TEST_REOPEN_PATIENCE_VAR: &str = "FLAGPOST_TEST_REOPEN_PATIENCE_MS";

/// The environment variable naming a file that, while it exists, holds the compactor
/// between steps, for tests only: the backpressure tests need a compactor that is
/// behind on demand. Read once; unset (always, in service) it costs nothing.
const TEST_HOLD_VAR: &str = "FLAGPOST_TEST_COMPACTOR_HOLD";
/// How often a held compactor looks for its hold file again.
const HOLD_POLL: Duration = Duration::from_millis(20);

/// Whether a test holds the compactor (see [`TEST_HOLD_VAR`]).
fn held() -> bool {
    static HOLD: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();
    let hold = HOLD.get_or_init(|| {
        let path = std::env::var_os(TEST_HOLD_VAR)?;
        tracing::warn!(path = ?path, "the compactor is held while the file {TEST_HOLD_VAR} names exists");
        Some(path.into())
    });
    hold.as_ref().is_some_and(|path| path.exists())
}

/// [`REOPEN_PATIENCE`], unless a test shortened it (see [`TEST_REOPEN_PATIENCE_VAR`]).
fn reopen_patience() -> Duration {
    static PATIENCE: OnceLock<Duration> = OnceLock::new();
    *PATIENCE.get_or_init(|| {
        let Ok(text) = std::env::var(TEST_REOPEN_PATIENCE_VAR) else {
            return REOPEN_PATIENCE;
        };
        match text.trim().parse::<u64>() {
            Ok(ms) => {
                tracing::warn!(ms, "database reopen patience set by {TEST_REOPEN_PATIENCE_VAR}");
                Duration::from_millis(ms)
            }
            Err(error) => {
                tracing::warn!(%error, value = %text, "{TEST_REOPEN_PATIENCE_VAR} ignored: not a number of milliseconds");
                REOPEN_PATIENCE
            }
        }
    })
}

/// The compactor's thread; stop it at shutdown.
pub struct Handle {
    thread: JoinHandle<()>,
    stop: Arc<AtomicBool>,
}

impl Handle {
    /// Finish the current step and stop. What is left in the log is applied at the
    /// next start.
    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.thread().unpark();
        if self.thread.join().is_err() {
            tracing::error!("compactor thread panicked");
        }
    }
}

/// Run the compactor on its own thread until stopped. A failing step marks the
/// compactor unhealthy (the server then refuses new writes) and is retried; a panic
/// stops it for good rather than risk applying a chunk twice or half. Each pass of the
/// loop (retention, a step, a recovery) holds `gate` for reading, so a backup that takes
/// it for writing finds the database between steps and keeps it so.
pub fn spawn(
    mut compactor: Compactor,
    live: Arc<Live>,
    gate: Arc<crate::support::sync::Gate>,
) -> std::io::Result<Handle> {
    let stop = Arc::new(AtomicBool::new(false));
    let stop_flag = stop.clone();
    compactor.folds.set_gate(gate.clone());
    let thread = std::thread::Builder::new().name("compactor".into()).spawn(move || {
        crate::support::priority::lower(compactor.settings.nice, "compactor");
        // The deltas' maps are written here: their heaps are made and released here.
        crate::support::heaps::adopt();
        let stats = compactor.stats();
        let mut last_retention: Option<Instant> = None;
        // Records applied since the last idle step.
        let mut applied = 0;
        while !stop_flag.load(Ordering::SeqCst) {
            if held() {
                std::thread::park_timeout(HOLD_POLL);
                continue;
            }
            let _pass = gate.blocking_read();
            if last_retention.is_none_or(|t| t.elapsed() >= RETENTION_INTERVAL) {
                last_retention = Some(Instant::now());
                if let Err(e) = compactor.enforce_retention(crate::support::clock::now_ms()) {
                    tracing::error!(error = %e, "retention pass failed");
                }
            }
            match std::panic::catch_unwind(AssertUnwindSafe(|| compactor.step())) {
                Ok(Ok(report)) => {
                    if !stats.healthy.swap(true, Ordering::SeqCst) {
                        tracing::info!("compactor recovered");
                    }
                    let moment = match report.is_idle() {
                        true => fold::Moment::Idle,
                        false => fold::Moment::Busy,
                    };
                    compactor.fold_tables(moment);
                    // Between chunks: the heaps of the maps folded since go back.
                    crate::support::heaps::release();
                    if !report.is_idle() {
                        compactor.phases.end(super::phases::Phase::Fold);
                        let records = report.realtime + report.historical + report.overflow;
                        compactor.phases.step_done(records);
                    }
                    if report.is_idle() {
                        compactor.rest();
                        write_rollups(&compactor, Some(Moment::Idle));
                        // The log just emptied after a backlog: what its chunks took goes
                        // back at once, not up to an interval later.
                        match std::mem::take(&mut applied) >= BACKLOG_RECORDS {
                            true => crate::support::idle::freed(),
                            false => crate::support::idle::idle(),
                        }
                        std::thread::park_timeout(IDLE_WAIT);
                    } else {
                        applied += report.realtime + report.historical + report.overflow;
                        if report.realtime < FEW_RECORDS && report.historical + report.overflow == 0 {
                            std::thread::park_timeout(GATHER_WAIT);
                        }
                    }
                }
                Ok(Err(e)) => {
                    if stats.healthy.swap(false, Ordering::SeqCst) {
                        tracing::error!(error = %e, "compactor step failed; refusing new events until it succeeds");
                    }
                    if let Err(kept) = still_writes(&compactor.trees) {
                        tracing::error!(error = %kept, "the database keeps failing to write; reopening it once it can write again");
                        match recover(compactor, &live, &stop_flag) {
                            Some(reopened) => {
                                compactor = reopened;
                                compactor.folds.set_gate(gate.clone());
                            }
                            None => return,
                        }
                        continue;
                    }
                    std::thread::park_timeout(ERROR_BACKOFF);
                }
                Err(_) => {
                    stats.healthy.store(false, Ordering::SeqCst);
                    live.give_up();
                    tracing::error!("compactor panicked; refusing new events, and /_liveness fails so the service is restarted");
                    return;
                }
            }
        }
        // Stopped: with the log's writer stopped first (as a clean shutdown does), the
        // log's files hold nothing a start would read once everything is applied.
        let _pass = gate.blocking_read();
        write_rollups(&compactor, None);
        compactor.fold_tables(fold::Moment::Stop);
        compactor.release_log_at_stop();
    })?;
    Ok(Handle { thread, stop })
}

/// Write the rollups' hot counts if they are due at `moment`, or always (`None`: at a
/// stop). A failure leaves them in memory for the next try (and counted again from
/// the events after a crash), so it is only logged.
pub(super) fn write_rollups(compactor: &Compactor, moment: Option<Moment>) {
    let mut hot = compactor.trees.rollups.hot();
    if moment.is_some_and(|m| !hot.due(m, Instant::now())) {
        return;
    }
    if let Err(e) = hot.write_now(&compactor.trees) {
        tracing::warn!(error = %e, "cannot write the console's rollups yet; kept in memory");
    }
}

/// Close the database and open it again once it can write; the compactor on the
/// reopened database, or `None` when stopped or given up (see the module docs).
fn recover(compactor: Compactor, live: &Live, stop: &AtomicBool) -> Option<Compactor> {
    let detached = compactor.detach();
    if !live.close(RELEASE_PATIENCE) {
        tracing::error!("the database is still in use after {RELEASE_PATIENCE:?} and cannot be reopened; /_liveness fails so the service is restarted");
        live.give_up();
        return None;
    }
    let started = Instant::now();
    let mut other_since: Option<Instant> = None;
    while !stop.load(Ordering::SeqCst) {
        match live.reopen() {
            Ok((trees, checkpoint)) => {
                tracing::info!(
                    after_ms = started.elapsed().as_millis() as u64,
                    checkpoint,
                    "database reopened; the compactor resumes from its durable checkpoint"
                );
                return Some(detached.attach(trees, checkpoint));
            }
            Err(e) if is_disk_full(&e) => {
                other_since = None;
                tracing::debug!(error = %e, "database not reopened yet: the disk is still full");
            }
            Err(e) => {
                let since = *other_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= reopen_patience() {
                    tracing::error!(error = %e, "the database cannot be reopened; /_liveness fails so the service is restarted");
                    live.give_up();
                    return None;
                }
                tracing::warn!(error = %e, "database not reopened yet; retrying");
            }
        }
        std::thread::park_timeout(REOPEN_INTERVAL);
    }
    None
}
