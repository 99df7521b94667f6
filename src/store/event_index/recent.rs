//! The recent part of the event index, in memory: the blocks newer than what the
//! runs cover, by key ((project, distinct id), (project, event name) and (project,
//! property key)). Filled by
//! the compactor once a chunk's blocks are committed; lost in a crash and rebuilt
//! from those blocks at the next start (they are immutable and durable), so nothing
//! of it is ever written but as a run.

use std::collections::HashMap;

use super::run::{self, BlockRef};
use crate::store::block::PropertyKeys;

/// What an index key names after its project: the byte that follows the project.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A distinct id: a person's events.
    DistinctId = 0,
    /// An event's name.
    Event = 1,
    /// A property key some event of the block has.
    Property = 2,
    /// The block may hold any property key (some event's properties are kept whole);
    /// its text is empty.
    AnyProperty = 3,
}

/// A block just stored, with the distinct ids, the names and the property keys of its
/// events (each once).
#[derive(Debug, Clone)]
pub struct NewBlock {
    pub block: BlockRef,
    pub distinct_ids: Vec<String>,
    pub events: Vec<String>,
    pub properties: PropertyKeys,
}

/// Index keys: the project big-endian, the kind, then the distinct id's or the name's
/// bytes.
pub fn key(project: u64, kind: Kind, text: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + text.len());
    k.extend_from_slice(&project.to_be_bytes());
    k.push(kind as u8);
    k.extend_from_slice(text.as_bytes());
    k
}

#[derive(Default)]
pub struct Recent {
    by_key: HashMap<Vec<u8>, Vec<u64>, foldhash::fast::RandomState>,
    /// Ascending by id, as they mostly come: a read finds a key's blocks in one walk.
    blocks: Vec<BlockRef>,
}

impl Recent {
    /// Empty, with room for as many keys as `full` holds: the next recent part after
    /// a fold takes about as many, without growing its map through every size.
    pub fn sized_as(full: &Recent) -> Recent {
        let hasher = foldhash::fast::RandomState::default();
        Recent {
            by_key: HashMap::with_capacity_and_hasher(full.by_key.len(), hasher),
            blocks: Vec::with_capacity(full.blocks.len()),
        }
    }

    /// A block added again (a chunk's transaction tried again, or the build and the
    /// compactor both saw it) takes its latest place; its keys are kept from every
    /// try (a read passes over a block without the events asked for).
    pub fn add(&mut self, new: &NewBlock) {
        let b = new.block;
        match self.blocks.last() {
            Some(last) if last.id >= b.id => {
                match self.blocks.binary_search_by_key(&b.id, |held| held.id) {
                    Ok(i) => self.blocks[i] = b,
                    Err(i) => self.blocks.insert(i, b),
                }
            }
            _ => self.blocks.push(b),
        }
        let any: &[String] = match new.properties.any {
            true => &[String::new()],
            false => &[],
        };
        let keyed = [
            (Kind::DistinctId, &new.distinct_ids[..]),
            (Kind::Event, &new.events[..]),
            (Kind::Property, &new.properties.keys[..]),
            (Kind::AnyProperty, any),
        ];
        let mut k = Vec::new();
        for (kind, texts) in keyed {
            for text in texts {
                // Most keys are held already: looked up without making one.
                k.clear();
                k.extend_from_slice(&b.project.to_be_bytes());
                k.push(kind as u8);
                k.extend_from_slice(text.as_bytes());
                let ids = match self.by_key.get_mut(&k[..]) {
                    Some(ids) => ids,
                    None => self.by_key.entry(k.clone()).or_default(),
                };
                // Ids come ascending from the compactor and the build: a block's keys
                // are added once, unless its chunk was tried again.
                if ids.last() != Some(&b.id) {
                    ids.push(b.id);
                }
            }
        }
    }

    /// About the bytes it takes in memory: per key its bytes, its ids and a map slot;
    /// per block its reference.
    pub fn footprint(&self) -> usize {
        use std::mem::size_of;
        // A hash map's slot and its control byte, at a load of about seven eighths.
        let slot = |entry: usize| (entry + 1) * 8 / 7;
        let keys: usize = self
            .by_key
            .iter()
            .map(|(k, ids)| {
                k.capacity()
                    + ids.capacity() * size_of::<u64>()
                    + slot(size_of::<(Vec<u8>, Vec<u64>)>())
            })
            .sum();
        keys + self.blocks.capacity() * size_of::<BlockRef>()
    }

    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// The highest block id held.
    pub fn last_id(&self) -> Option<u64> {
        self.blocks.last().map(|b| b.id)
    }

    /// The ids of `key`'s blocks, ascending.
    pub fn ids(&self, key: &[u8]) -> Vec<u64> {
        let mut ids = self.by_key.get(key).cloned().unwrap_or_default();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Every block held, ascending by id.
    pub fn table(&self) -> &[BlockRef] {
        &self.blocks
    }

    /// Write everything held as a run at `path`.
    pub fn write(&self, path: &std::path::Path) -> std::io::Result<()> {
        let mut keys: Vec<&Vec<u8>> = self.by_key.keys().collect();
        keys.sort_unstable();
        let mut w = run::Writer::create(path)?;
        for k in keys {
            w.entry(k, &self.ids(k))?;
        }
        w.finish(&self.blocks)
    }
}
