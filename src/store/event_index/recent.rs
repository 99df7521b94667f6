//! The recent part of the event index, in memory: the blocks newer than what the
//! runs cover, by key ((project, distinct id), (project, event name) and (project,
//! property key)). Filled by
//! the compactor once a chunk's blocks are committed; lost in a crash and rebuilt
//! from those blocks at the next start (they are immutable and durable), so nothing
//! of it is ever written but as a run.

use std::hash::BuildHasher;

use hashbrown::HashTable;

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

/// The recent part: each key's bytes once in one buffer, its blocks' ids chained in
/// another, and a table from the key's hash to it. A map of a vector a key to a
/// vector of ids took about 140 bytes a key in three allocations of their own (a
/// million of them between two folds at 20 M events, and the frozen part's beside
/// the active's); this takes about 90 in a few large buffers, which go back whole
/// once the part is written.
#[derive(Default)]
pub struct Recent {
    /// Indexes into `keys`, by the key's hash.
    table: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    keys: Vec<Held>,
    /// The keys' bytes, one after another.
    bytes: Vec<u8>,
    /// The blocks' ids of every key, each a link in its key's chain, newest first.
    links: Vec<Link>,
    /// Ascending by id, as they mostly come: a read finds a key's blocks in one walk.
    blocks: Vec<BlockRef>,
}

/// A key held: where its bytes are, and its newest link.
struct Held {
    at: usize,
    len: usize,
    newest: usize,
}

/// A block id of a key, and the place of the key's link before it ([`NONE`] for none).
struct Link {
    id: u64,
    before: usize,
}

impl Held {
    /// Its bytes, in the part's `bytes`.
    fn text<'a>(&self, bytes: &'a [u8]) -> &'a [u8] {
        &bytes[self.at..self.at + self.len]
    }
}

/// No link.
const NONE: usize = usize::MAX;

impl Recent {
    /// Empty, with room for as many keys, bytes and ids as `full` holds: the next
    /// recent part after a fold takes about as many, without growing through every
    /// size (room untouched is not resident).
    pub fn sized_as(full: &Recent) -> Recent {
        Recent {
            table: HashTable::with_capacity(full.keys.len()),
            hasher: foldhash::fast::RandomState::default(),
            keys: Vec::with_capacity(full.keys.len()),
            bytes: Vec::with_capacity(full.bytes.len()),
            links: Vec::with_capacity(full.links.len()),
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
                k.clear();
                k.extend_from_slice(&b.project.to_be_bytes());
                k.push(kind as u8);
                k.extend_from_slice(text.as_bytes());
                self.add_id(&k, b.id);
            }
        }
    }

    /// Add `id` to `key`'s blocks. Ids come ascending from the compactor and the
    /// build: a block's keys are added once, unless its chunk was tried again.
    fn add_id(&mut self, key: &[u8], id: u64) {
        let Recent {
            table,
            hasher,
            keys,
            bytes,
            links,
            ..
        } = self;
        let hash = hasher.hash_one(key);
        let found = table.find(hash, |&i| keys[i as usize].text(bytes) == key);
        let i = match found {
            Some(&i)
                if links
                    .get(keys[i as usize].newest)
                    .is_some_and(|l| l.id == id) =>
            {
                return
            }
            Some(&i) => i as usize,
            None => {
                let Ok(i) = u32::try_from(keys.len()) else {
                    // Four billion keys between two folds cannot come (a fold is due
                    // every few thousand blocks); were they to, the block is still
                    // read, as one whose keys are not all indexed.
                    return;
                };
                keys.push(Held {
                    at: bytes.len(),
                    len: key.len(),
                    newest: NONE,
                });
                bytes.extend_from_slice(key);
                let (held, bytes) = (&*keys, &*bytes);
                table.insert_unique(hash, i, |&j| hasher.hash_one(held[j as usize].text(bytes)));
                i as usize
            }
        };
        links.push(Link {
            id,
            before: keys[i].newest,
        });
        keys[i].newest = links.len() - 1;
    }

    /// About the bytes it takes in memory: its buffers' and its table's room.
    pub fn footprint(&self) -> usize {
        use std::mem::size_of;
        // A table's slot and its control byte, at a load of about seven eighths.
        let table = self.table.capacity() * (size_of::<u32>() + 1) * 8 / 7;
        table
            + self.keys.capacity() * size_of::<Held>()
            + self.bytes.capacity()
            + self.links.capacity() * size_of::<Link>()
            + self.blocks.capacity() * size_of::<BlockRef>()
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
        let hash = self.hasher.hash_one(key);
        match self.table.find(hash, |&i| self.text(i as usize) == key) {
            Some(&i) => self.ids_of(i as usize),
            None => Vec::new(),
        }
    }

    /// The bytes of the `i`th key held.
    fn text(&self, i: usize) -> &[u8] {
        self.keys[i].text(&self.bytes)
    }

    /// The ids of the `i`th key's blocks, ascending.
    fn ids_of(&self, i: usize) -> Vec<u64> {
        let mut ids = Vec::new();
        let mut at = self.keys[i].newest;
        while let Some(link) = self.links.get(at) {
            ids.push(link.id);
            at = link.before;
        }
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
        let mut order: Vec<usize> = (0..self.keys.len()).collect();
        order.sort_unstable_by(|&a, &b| self.text(a).cmp(self.text(b)));
        let mut w = run::Writer::create(path)?;
        for i in order {
            w.entry(self.text(i), &self.ids_of(i))?;
        }
        w.finish(&self.blocks)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    fn block(id: u64, project: u64, ids: &[&str], events: &[&str], any: bool) -> NewBlock {
        let texts = |t: &[&str]| t.iter().map(|s| s.to_string()).collect();
        NewBlock {
            block: BlockRef {
                id,
                project,
                newest: id as i64,
                oldest: id as i64,
            },
            distinct_ids: texts(ids),
            events: texts(events),
            properties: PropertyKeys {
                keys: vec!["$browser".into(), format!("p{}", id % 3)],
                any,
            },
        }
    }

    #[test]
    fn it_answers_and_writes_what_a_map_of_each_key_to_its_blocks_would() {
        let mut recent = Recent::default();
        let mut model: BTreeMap<Vec<u8>, BTreeSet<u64>> = BTreeMap::new();
        let mut added = Vec::new();
        for id in 1..400u64 {
            // Distinct ids shared by a few blocks, long and short, two projects; a
            // block added again (a chunk tried again) and one out of order.
            let ids: Vec<String> = (0..5)
                .map(|j| format!("{}{}", "u".repeat((id % 7) as usize * 20), (id + j) % 37))
                .collect();
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            let events = [
                "$pageview",
                if id % 2 == 0 {
                    "$identify"
                } else {
                    "$autocapture"
                },
            ];
            let nb = block(id, 1 + id % 2, &ids, &events, id % 11 == 0);
            added.push(nb.clone());
            if id % 50 == 0 {
                added.push(nb.clone());
                added.push(block(
                    id - 5,
                    1 + (id - 5) % 2,
                    &["late"],
                    &["$late"],
                    false,
                ));
            }
        }
        for nb in &added {
            recent.add(nb);
            let b = nb.block;
            let any: &[String] = if nb.properties.any {
                &[String::new()]
            } else {
                &[]
            };
            for (kind, texts) in [
                (Kind::DistinctId, &nb.distinct_ids[..]),
                (Kind::Event, &nb.events[..]),
                (Kind::Property, &nb.properties.keys[..]),
                (Kind::AnyProperty, any),
            ] {
                for t in texts {
                    model
                        .entry(key(b.project, kind, t))
                        .or_default()
                        .insert(b.id);
                }
            }
        }
        for (k, ids) in &model {
            assert_eq!(
                recent.ids(k),
                ids.iter().copied().collect::<Vec<_>>(),
                "{k:?}"
            );
        }
        assert!(recent.ids(&key(1, Kind::DistinctId, "nobody")).is_empty());
        let table: Vec<u64> = recent.table().iter().map(|b| b.id).collect();
        assert!(
            table.windows(2).all(|w| w[0] < w[1]),
            "blocks ascending, once each"
        );
        assert_eq!(recent.blocks(), 399);
        assert!(recent.footprint() > 0);

        // Written as a run, every key reads back with its blocks.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("1.run");
        recent.write(&path).unwrap();
        let run = run::Run::open(&path).unwrap();
        for (k, ids) in &model {
            assert_eq!(run.get(k).unwrap(), ids.iter().copied().collect::<Vec<_>>());
        }

        // The next part, sized as this one, starts empty.
        let next = Recent::sized_as(&recent);
        assert_eq!(next.blocks(), 0);
        assert!(next.ids(model.keys().next().unwrap()).is_empty());
    }
}
