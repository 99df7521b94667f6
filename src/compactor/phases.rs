//! Where the compactor thread's wall time goes while it works: each phase of a step
//! timed and summed, logged at debug every [`EVERY`] of work as shares of the time,
//! with the block thread's own time beside it. Only the clock is read in a step; the
//! summary costs nothing unless debug logging is on.

use std::time::{Duration, Instant};

/// How much work between two summaries.
const EVERY: Duration = Duration::from_secs(5);

/// The phases of a step on the compactor's thread, in their order.
#[derive(Debug, Clone, Copy)]
pub(super) enum Phase {
    /// The log's next chunk read and decoded.
    Read,
    /// The chunk's records applied in the transaction.
    Apply,
    /// The persons written and the layered tables journaled, the blocks being made.
    Write,
    /// Waiting for the block thread.
    WaitBlocks,
    /// The rest of the transaction: pointers, rollups, window, checkpoint, and
    /// sled's commit.
    Commit,
    /// After the commit: the window, the memo, the caches.
    After,
    /// sled flushed so the log's segments can go.
    Release,
    /// Reading the slower lanes, the lag and the memory figures (the lanes'
    /// transactions count in the phases above).
    Lanes,
    /// The layered tables' folds between steps.
    Fold,
}

const PHASES: usize = Phase::Fold as usize + 1;
const NAMES: [&str; PHASES] = [
    "read",
    "apply",
    "write",
    "wait_blocks",
    "commit",
    "after",
    "release",
    "lanes",
    "fold",
];

/// The block thread's time for one chunk: making and appending the blocks, syncing.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct BlockTimes {
    pub(super) build: Duration,
    pub(super) sync: Duration,
}

#[derive(Debug)]
pub(super) struct Phases {
    spent: [Duration; PHASES],
    blocks: BlockTimes,
    records: usize,
    steps: usize,
    /// When the current phase started.
    mark: Instant,
}

impl Default for Phases {
    fn default() -> Phases {
        Phases {
            spent: [Duration::ZERO; PHASES],
            blocks: BlockTimes::default(),
            records: 0,
            steps: 0,
            mark: Instant::now(),
        }
    }
}

impl Phases {
    /// Start timing from now (a step's first phase).
    pub(super) fn start(&mut self) {
        self.mark = Instant::now();
    }

    /// The time since the last mark goes to `phase`.
    pub(super) fn end(&mut self, phase: Phase) {
        let now = Instant::now();
        self.spent[phase as usize] += now - self.mark;
        self.mark = now;
    }

    pub(super) fn blocks(&mut self, t: BlockTimes) {
        self.blocks.build += t.build;
        self.blocks.sync += t.sync;
    }

    /// A step that did work is done; every [`EVERY`] of work, the summary.
    pub(super) fn step_done(&mut self, records: usize) {
        self.steps += 1;
        self.records += records;
        let total: Duration = self.spent.iter().sum();
        if total < EVERY {
            return;
        }
        if tracing::enabled!(tracing::Level::DEBUG) {
            let share =
                |d: Duration| format!("{:.1}%", 100.0 * d.as_secs_f64() / total.as_secs_f64());
            let phases: Vec<String> = (0..PHASES)
                .map(|i| format!("{}={}", NAMES[i], share(self.spent[i])))
                .collect();
            tracing::debug!(
                records = self.records,
                steps = self.steps,
                seconds = total.as_secs_f64(),
                per_event_us = total.as_secs_f64() * 1e6 / self.records.max(1) as f64,
                phases = %phases.join(" "),
                block_build = %share(self.blocks.build),
                block_sync = %share(self.blocks.sync),
                "compactor's wall time by phase"
            );
        }
        *self = Phases::default();
    }
}
