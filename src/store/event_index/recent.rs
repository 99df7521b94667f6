//! The recent part of the event index, in memory: the blocks newer than what the
//! runs cover, by (project, distinct id). Filled by the compactor once a chunk's
//! blocks are committed; lost in a crash and rebuilt from those blocks at the next
//! start (they are immutable and durable), so nothing of it is ever written but as a
//! run.

use std::collections::HashMap;

use super::run::{self, BlockRef};

/// A block just stored and the distinct ids of its events.
#[derive(Debug, Clone)]
pub struct NewBlock {
    pub block: BlockRef,
    pub distinct_ids: Vec<String>,
}

/// Index keys: the project big-endian, then the distinct id's bytes.
pub fn key(project: u64, distinct_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + distinct_id.len());
    k.extend_from_slice(&project.to_be_bytes());
    k.extend_from_slice(distinct_id.as_bytes());
    k
}

#[derive(Default)]
pub struct Recent {
    by_key: HashMap<Vec<u8>, Vec<u64>>,
    blocks: HashMap<u64, BlockRef>,
}

impl Recent {
    /// A block added again (a chunk's transaction tried again, or the build and the
    /// compactor both saw it) takes its latest place; its ids are kept from every
    /// try (a read passes over a block without the distinct id's events).
    pub fn add(&mut self, new: &NewBlock) {
        self.blocks.insert(new.block.id, new.block);
        for id in &new.distinct_ids {
            let ids = self.by_key.entry(key(new.block.project, id)).or_default();
            ids.push(new.block.id);
        }
    }

    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// The highest block id held.
    pub fn last_id(&self) -> Option<u64> {
        self.blocks.keys().max().copied()
    }

    /// The blocks of `key`.
    pub fn get(&self, key: &[u8]) -> Vec<BlockRef> {
        let ids = self.by_key.get(key).map_or(&[][..], Vec::as_slice);
        ids.iter()
            .filter_map(|id| self.blocks.get(id).copied())
            .collect()
    }

    /// Write everything held as a run at `path`.
    pub fn write(&self, path: &std::path::Path) -> std::io::Result<()> {
        let mut keys: Vec<&Vec<u8>> = self.by_key.keys().collect();
        keys.sort_unstable();
        let mut w = run::Writer::create(path)?;
        let mut ids = Vec::new();
        for k in keys {
            ids.clear();
            ids.extend_from_slice(&self.by_key[k]);
            ids.sort_unstable();
            ids.dedup();
            w.entry(k, &ids)?;
        }
        let mut blocks: Vec<BlockRef> = self.blocks.values().copied().collect();
        blocks.sort_unstable();
        w.finish(&blocks)
    }
}
