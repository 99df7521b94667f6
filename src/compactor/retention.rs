//! Retention: deleting the event blocks older than the configured number of days,
//! the block files left holding none, and the rollups of the hours they held, a pass
//! the worker runs every few minutes beside its steps.

use std::sync::atomic::Ordering;

use sled::IVec;

use super::Compactor;
use crate::store::{block, keys, outbox, rollup};

/// Blocks deleted per retention batch, so the pass never holds much in memory.
const RETENTION_BATCH: usize = 256;
pub(super) const DAY_MS: i64 = 24 * 60 * 60 * 1000;

impl Compactor {
    /// Delete the blocks whose newest event is older than the retention period (so
    /// an event may outlive it by up to a block's span); returns how many events.
    pub fn enforce_retention(&self, now: i64) -> Result<u64, sled::Error> {
        if self.settings.retention_days == 0 {
            return Ok(0);
        }
        // The hot rollups first, so none of an hour deleted below is written back after.
        super::worker::write_rollups(self, None);
        let cutoff = now - i64::from(self.settings.retention_days) * DAY_MS;
        // Blocks the outbox's reader has not sent yet are kept (store::outbox::retention).
        let keep_from = match self.settings.outbox {
            true => outbox::keep_from(&self.trees.outbox)?,
            false => None,
        };
        let mut deleted = 0u64;
        let mut next_project = Some(0u64);
        while let Some(start) = next_project {
            // The first block key at or past `start`'s prefix names the next project.
            let Some((key, _)) = self.trees.events.get_gt(keys::project(start))? else {
                break;
            };
            let Some((project, _)) = keys::split_block(&key) else {
                break;
            };
            let mut lo = keys::event_bound(project, i64::MIN).to_vec();
            let hi = keys::event_bound(project, cutoff).to_vec();
            loop {
                let batch: Vec<(IVec, IVec)> = self
                    .trees
                    .events
                    .range(lo.clone()..hi.clone())
                    .take(RETENTION_BATCH)
                    .collect::<Result<_, _>>()?;
                let Some((last, _)) = batch.last() else {
                    break;
                };
                // Past the batch's last key: kept blocks are not met again.
                lo = [last.as_ref(), &[0]].concat();
                let mut blocks = sled::Batch::default();
                for (k, v) in &batch {
                    if outbox::held(k, keep_from) {
                        continue;
                    }
                    deleted += u64::from(block::count(v).unwrap_or(0));
                    blocks.remove(k);
                }
                self.trees.events.apply_batch(blocks)?;
            }
            next_project = project.checked_add(1);
        }
        if deleted > 0 {
            self.trees.event_index.note_deleted();
            // Files whose every block is gone; the file being appended to is kept.
            let files = self.trees.blocks.remove_unreferenced(&self.trees.events)?;
            if files > 0 {
                tracing::info!(files, "retention: removed event block files no longer used");
            }
        }
        // A kept block spans at most an hour before the cutoff, so every event of an
        // earlier hour is gone (but for blocks the outbox still holds, briefly).
        let hour = rollup::hour_of(cutoff - block::MAX_SPAN_MS);
        rollup::forget_before(&self.trees.rollups, hour)?;
        self.stats
            .retention_deleted
            .fetch_add(deleted, Ordering::Relaxed);
        if deleted > 0 {
            tracing::info!(
                deleted,
                days = self.settings.retention_days,
                "retention: deleted old events"
            );
        }
        Ok(deleted)
    }
}
