//! The index worker's loop, on a thread the pipeline starts: a pass at a time on
//! the database as it is then (it follows a reopen), logging the build's progress,
//! resting when there is nothing to do until the compactor freezes a recent part. At
//! a stop it writes the recent part out, so the next start has nothing to build.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::Step;
use crate::store::live::Live;

/// How long the worker rests with nothing to do; the compactor wakes it sooner.
const IDLE: Duration = Duration::from_secs(1);
/// After a failed pass, wait before the next.
const BACKOFF: Duration = Duration::from_secs(1);
/// The build's progress is logged each time it passes a multiple of this many percent.
const LOG_PERCENT: u64 = 5;

pub fn work(live: &Live, stop: &AtomicBool) {
    let mut logged: Option<u64> = None;
    let started = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let Some(open) = live.get() else {
            std::thread::park_timeout(BACKOFF);
            continue;
        };
        let index = open.trees.event_index.clone();
        index.set_worker(std::thread::current());
        let t = Instant::now();
        let step = index.step(&open.trees);
        drop(open);
        match step {
            Ok(Step::Idle) => {
                // A merge frees its tables and the runs it replaced on this thread:
                // hand the pages back before resting, as the compactor does.
                crate::support::idle::idle();
                std::thread::park_timeout(IDLE);
            }
            Ok(Step::Wrote) => {}
            Ok(Step::Built { done, total }) => {
                let percent = (done * 100).checked_div(total).unwrap_or(100);
                if done == total {
                    tracing::info!(
                        blocks = total,
                        seconds = started.elapsed().as_secs(),
                        "event index built: events by person or by name are read through it from now on"
                    );
                    logged = None;
                } else if logged.is_none_or(|l| percent >= l + LOG_PERCENT) {
                    logged = Some(percent - percent % LOG_PERCENT);
                    tracing::info!(
                        percent,
                        done,
                        total,
                        "building the event index from stored blocks"
                    );
                }
                // Rest as long as the batch took: capture and the compactor come first.
                std::thread::park_timeout(t.elapsed());
            }
            Err(e) => {
                tracing::warn!(error = %e, "event index: a pass failed; retrying");
                std::thread::park_timeout(BACKOFF);
            }
        }
    }
    if let Some(open) = live.get() {
        if let Err(e) = open.trees.event_index.fold_all() {
            tracing::warn!(error = %e, "event index: the recent part was not written at the stop");
        }
    }
}
