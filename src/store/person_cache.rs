//! Decoded persons and groups for `/decide`, kept between requests: a person's flags
//! are asked for on every page load, and each ask would otherwise read two sled keys
//! and parse the person's JSON, and as much again for each group it names.
//!
//! Four maps: distinct id -> person id (or none), person id -> the person's
//! properties, group type name -> index (or none), and group -> its properties (or
//! none). The compactor, the only writer of all four, after each chunk it commits
//! forgets the distinct ids it linked, the persons it wrote or deleted, the group types
//! it named and the groups it wrote ([`PersonCache::forget`]), so a lookup never sees
//! a value older than the last commit that changed it.
//!
//! A lookup that misses reads sled and then fills the cache, and the compactor may
//! commit in between: the value read could be older than the commit, and its forget
//! could come before the fill. So the compactor bumps an epoch before it forgets
//! anything, and a fill is dropped unless the epoch is still the one read before the
//! sled read; the check and the insert happen under the shard's lock, which the
//! forget takes too.
//!
//! Every map is bounded in bytes (about), evicting arbitrary entries when full.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Map, Value};
use uuid::Uuid;

use super::{query, Trees};
use crate::support::sync::lock;

const SHARDS: usize = 8;
/// The default budget for both maps together.
pub const DEFAULT_BYTES: usize = 8 * 1024 * 1024;
/// What an entry costs beyond its strings: the map's slot, the Arc, the allocations.
const ENTRY_OVERHEAD: usize = 96;

/// What `/decide` needs of a person.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedPerson {
    pub properties: Map<String, Value>,
    /// The distinct id the person was first seen with (experience continuity).
    pub first_distinct_id: String,
}

impl CachedPerson {
    /// Roughly what it holds in memory.
    fn weight(&self) -> usize {
        ENTRY_OVERHEAD + self.first_distinct_id.len() + map_weight(&self.properties)
    }
}

fn map_weight(map: &Map<String, Value>) -> usize {
    map.iter()
        .map(|(k, v)| ENTRY_OVERHEAD + k.len() + value_weight(v))
        .sum()
}

fn value_weight(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len(),
        Value::Array(a) => a.iter().map(|v| 32 + value_weight(v)).sum(),
        Value::Object(o) => map_weight(o),
        _ => 0,
    }
}

/// A map in shards, each bounded by a byte budget.
struct Sharded<K, V> {
    shards: Vec<Mutex<Shard<K, V>>>,
    hasher: std::collections::hash_map::RandomState,
    budget: usize,
}

struct Shard<K, V> {
    map: HashMap<K, (V, usize)>,
    bytes: usize,
}

impl<K: Hash + Eq + Clone, V: Clone> Sharded<K, V> {
    fn new(bytes: usize) -> Self {
        Sharded {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        map: HashMap::new(),
                        bytes: 0,
                    })
                })
                .collect(),
            hasher: Default::default(),
            budget: bytes / SHARDS,
        }
    }

    fn shard<Q: Hash + ?Sized>(&self, key: &Q) -> MutexGuard<'_, Shard<K, V>> {
        let i = self.hasher.hash_one(key) as usize % SHARDS;
        // A shard is consistent at every point a panic could interrupt it.
        lock(&self.shards[i])
    }

    fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shard(key).map.get(key).map(|(v, _)| v.clone())
    }

    /// Insert unless `still` (checked under the shard's lock) says the value is stale.
    fn fill(&self, key: K, value: V, weight: usize, still: impl FnOnce() -> bool) {
        if weight > self.budget {
            return;
        }
        let mut shard = self.shard(&key);
        if !still() {
            return;
        }
        while shard.bytes + weight > self.budget {
            // The first key the table yields: arbitrary, which is enough.
            let Some(victim) = shard.map.keys().next().cloned() else {
                break;
            };
            if let Some((_, w)) = shard.map.remove(&victim) {
                shard.bytes = shard.bytes.saturating_sub(w);
            }
        }
        if let Some((_, old)) = shard.map.insert(key, (value, weight)) {
            shard.bytes = shard.bytes.saturating_sub(old);
        }
        shard.bytes += weight;
    }

    fn remove<Q>(&self, key: &Q)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut shard = self.shard(key);
        if let Some((_, w)) = shard.map.remove(key) {
            shard.bytes = shard.bytes.saturating_sub(w);
        }
    }

    fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    fn bytes(&self) -> usize {
        self.shards.iter().map(|s| lock(s).bytes).sum()
    }
}

/// A stored group's properties, shared with the requests that read them.
pub type GroupProperties = Arc<Map<String, Value>>;

/// What a committed chunk changed that the cache may hold.
#[derive(Debug, Default)]
pub struct Changes {
    /// (project, distinct id) linked to a person.
    pub linked: Vec<(u64, String)>,
    /// (project, person id) written or deleted.
    pub persons: Vec<(u64, Uuid)>,
    /// (project, group type name) given an index.
    pub group_types: Vec<(u64, String)>,
    /// (project, group type index, group key) written.
    pub groups: Vec<(u64, u8, String)>,
}

/// Persons by distinct id, and groups, for `/decide`. Shared by the compactor, which forgets what
/// it changes, and the request handlers.
pub struct PersonCache {
    epoch: AtomicU64,
    ids: Sharded<(u64, String), Option<Uuid>>,
    persons: Sharded<(u64, Uuid), Option<Arc<CachedPerson>>>,
    group_types: Sharded<(u64, String), Option<u8>>,
    groups: Sharded<(u64, u8, String), Option<GroupProperties>>,
}

impl PersonCache {
    /// A cache of about `bytes` in all.
    pub fn new(bytes: usize) -> PersonCache {
        // Group types are a handful per project; groups are fewer than persons.
        let (ids, group_types, groups) = (bytes / 8, bytes / 64, bytes / 8);
        PersonCache {
            epoch: AtomicU64::new(0),
            ids: Sharded::new(ids),
            persons: Sharded::new(bytes - ids - group_types - groups),
            group_types: Sharded::new(group_types),
            groups: Sharded::new(groups),
        }
    }

    /// The person of `distinct_id` in `project`, from the cache or from sled.
    pub fn person(
        &self,
        trees: &Trees,
        project: u64,
        distinct_id: &str,
    ) -> Result<Option<Arc<CachedPerson>>, sled::Error> {
        let id = self.cached(
            &self.ids,
            (project, distinct_id.to_owned()),
            || query::person_id_of(trees, project, distinct_id),
            |_| ENTRY_OVERHEAD + distinct_id.len(),
        )?;
        let Some(id) = id else {
            return Ok(None);
        };
        self.cached(
            &self.persons,
            (project, id),
            || {
                Ok(query::person(trees, project, id)?.map(|p| {
                    Arc::new(CachedPerson {
                        properties: p.properties,
                        first_distinct_id: p.first_distinct_id,
                    })
                }))
            },
            |person| person.as_ref().map_or(ENTRY_OVERHEAD, |p| p.weight()),
        )
    }

    /// The stored properties of the group `key` of the type named `kind`, from the
    /// cache or from sled; None if the type or the group is not stored.
    pub fn group(
        &self,
        trees: &Trees,
        project: u64,
        kind: &str,
        key: &str,
    ) -> Result<Option<GroupProperties>, sled::Error> {
        let index = self.cached(
            &self.group_types,
            (project, kind.to_owned()),
            || query::group_type_index(trees, project, kind),
            |_| ENTRY_OVERHEAD + kind.len(),
        )?;
        let Some(index) = index else {
            return Ok(None);
        };
        self.cached(
            &self.groups,
            (project, index, key.to_owned()),
            || Ok(query::group(trees, project, index, key)?.map(|g| Arc::new(g.properties))),
            |group| ENTRY_OVERHEAD + key.len() + group.as_deref().map_or(0, map_weight),
        )
    }

    /// `key`'s value in `map`; on a miss, `read` from sled and kept (weighing
    /// `weight`) unless the compactor committed a change in between.
    fn cached<K: Hash + Eq + Clone, V: Clone>(
        &self,
        map: &Sharded<K, V>,
        key: K,
        read: impl FnOnce() -> Result<V, sled::Error>,
        weight: impl FnOnce(&V) -> usize,
    ) -> Result<V, sled::Error> {
        if let Some(value) = map.get(&key) {
            return Ok(value);
        }
        let epoch = self.epoch.load(Ordering::Acquire);
        let value = read()?;
        let w = weight(&value);
        map.fill(key, value.clone(), w, || self.unchanged_since(epoch));
        Ok(value)
    }

    fn unchanged_since(&self, epoch: u64) -> bool {
        self.epoch.load(Ordering::Acquire) == epoch
    }

    /// After a commit: forget the distinct ids it linked and the persons it wrote or
    /// deleted.
    pub fn forget(&self, changes: &Changes) {
        if changes.linked.is_empty()
            && changes.persons.is_empty()
            && changes.group_types.is_empty()
            && changes.groups.is_empty()
        {
            return;
        }
        self.epoch.fetch_add(1, Ordering::AcqRel);
        for key in &changes.linked {
            self.ids.remove(key);
        }
        for key in &changes.persons {
            self.persons.remove(key);
        }
        for key in &changes.group_types {
            self.group_types.remove(key);
        }
        for key in &changes.groups {
            self.groups.remove(key);
        }
    }

    /// Bytes held by its own count, within the budget it was made with.
    pub fn bytes(&self) -> usize {
        self.ids.bytes() + self.persons.bytes() + self.group_types.bytes() + self.groups.bytes()
    }

    /// Entries held: (distinct ids, persons).
    pub fn len(&self) -> (usize, usize) {
        (self.ids.len(), self.persons.len())
    }
}

#[cfg(test)]
#[path = "tests/person_cache.rs"]
mod tests;
