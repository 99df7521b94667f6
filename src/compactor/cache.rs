//! What one chunk's transaction has read or changed of persons, distinct ids and group
//! types, kept decoded for the whole chunk: a chunk often holds many events of the same
//! users, and each would otherwise read, parse and re-encode the same person. Persons
//! are changed in place and written to the transaction once, at the end, and only if
//! an event changed them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};

use sled::transaction::{TransactionalTree, UnabortableTransactionError};
use sled::IVec;
use uuid::Uuid;

use super::memo::{Learned, Memo};
use crate::persons::{self, Person};
use crate::store::by_property::count;
use crate::store::layered::chunk::{Journaled, Pending};
use crate::store::layered::TOMBSTONE;
use crate::store::person_cache::Changes;
use crate::store::{by_property, first_seen, keys, Trees};

type Result<T> = std::result::Result<T, UnabortableTransactionError>;

/// The chunk's maps hash with foldhash, randomly seeded: a chunk hashes each event's
/// distinct id and person several times, and SipHash took about 8 % of the compactor
/// thread's CPU in a profile of a drain (BENCHMARKS.md, "The compactor's drain
/// profiled").
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
type Set<K> = HashSet<K, foldhash::fast::RandomState>;

/// Whether the compactor keeps the persons' index by property: always, but for the
/// benches that measure what keeping it costs (`benches/compactor.rs`).
#[doc(hidden)]
pub static BY_PROPERTY_WRITES: AtomicBool = AtomicBool::new(true);

/// A changed person's entries by property, as `put(key, value)`: the ones of values
/// it lost removed, of values it gained added (all of them if its first event moved),
/// from the person as stored before the chunk (`born`, None if new) to `now` (None if
/// deleted). The stored person is parsed again for it: a diff of its properties' JSON
/// texts read in place costs as much (BENCHMARKS.md, "The persons' index by property:
/// what keeping it costs").
pub fn by_property_writes(
    project: u64,
    id: Uuid,
    born: Option<&[u8]>,
    now: Option<&Person>,
    put: impl FnMut(Vec<u8>, &[u8]),
) {
    by_property_upkeep(project, id, born, now, put, None);
}

/// [`by_property_writes`], and the person's moves of the index's counts
/// ([`count::Moves`]) if it is given them.
fn by_property_upkeep(
    project: u64,
    id: Uuid,
    born: Option<&[u8]>,
    now: Option<&Person>,
    put: impl FnMut(Vec<u8>, &[u8]),
    moves: Option<&mut count::Moves>,
) {
    let was = born.and_then(|b| serde_json::from_slice::<by_property::Stored>(b).ok());
    let was = was.as_ref().map(|w| (w.created_at, &w.properties));
    let now = now.map(|p| (p.created_at, &p.properties));
    by_property::changes(project, id, was, now, put);
    if let Some(moves) = moves {
        moves.person(project, was, now);
    }
}

/// The trees a record touches. Persons and distinct ids are layered tables
/// ([`crate::store::layered`]): their writes gathered until the chunk commits.
pub struct Tx<'a> {
    pub persons: &'a Pending,
    pub distinct_ids: &'a Pending,
    /// Persons by first seen ([`crate::store::first_seen`]), kept with the persons.
    pub first_seen: &'a Pending,
    /// Persons by property ([`crate::store::by_property`]), kept with the persons.
    pub by_property: &'a Pending,
    pub groups: &'a TransactionalTree,
    pub group_types: &'a TransactionalTree,
}

/// The layered tables' side of one chunk: persons', distinct ids' and the persons'
/// indexes' writes gathered until the chunk commits. The compactor's transaction and the
/// tests' are built from it alike.
pub struct Tables {
    /// Persons, distinct ids, first seen, by property.
    pending: [Pending; 4],
}

impl Tables {
    pub fn new(trees: &Trees) -> Tables {
        Tables {
            pending: trees.tables().map(Pending::new),
        }
    }

    /// Hold the journal the tables share for the chunk: take it before the
    /// transaction, call [`Journaled::restart`] at the start of each attempt.
    pub fn begin(&self) -> Journaled<'_> {
        Journaled::begin(self.pending[0].table().journal(), &self.pending)
    }

    /// What one attempt applies records through.
    pub fn tx<'a>(
        &'a self,
        groups: &'a TransactionalTree,
        group_types: &'a TransactionalTree,
    ) -> Tx<'a> {
        let [persons, distinct_ids, first_seen, by_property] = &self.pending;
        Tx {
            persons,
            distinct_ids,
            first_seen,
            by_property,
            groups,
            group_types,
        }
    }
}

#[derive(Default)]
pub struct Cache<'m> {
    /// What earlier chunks committed, consulted where this chunk has not read or
    /// changed the same distinct id or person.
    memo: Option<&'m Memo>,
    /// Project -> distinct id -> person, as read or linked during this chunk. Nested
    /// so a lookup by `&str` builds no key.
    ids: Map<u64, Map<String, Option<Uuid>>>,
    /// (project, person) -> the person, or None once deleted by a merge.
    persons: Map<(u64, Uuid), Option<Person>>,
    dirty: Set<(u64, Uuid)>,
    /// (project, person) -> its first event's time and bytes as stored before the
    /// chunk, for the persons read from the transaction: where its first-seen key is,
    /// and the properties its by-property entries are of.
    born: Map<(u64, Uuid), (i64, IVec)>,
    /// Project -> group type name -> index, once known.
    group_types: Map<u64, Map<String, u8>>,
    /// (project, person) -> the person operations (as text) applied to it last, by
    /// [`Cache::set_applied`]; any other change to the person forgets them.
    applied: Map<(u64, Uuid), Vec<u8>>,
    /// A buffer for the caller's operations text, reused from event to event.
    ops: Vec<u8>,
    /// Records in the chunk: the room a project's map of distinct ids starts with.
    room: usize,
    /// Distinct ids linked to a person during the chunk, for the decide cache.
    linked: Vec<(u64, String)>,
    /// Group types named and groups written during the chunk, for the decide cache.
    group_types_added: Vec<(u64, String)>,
    groups_written: Vec<(u64, u8, String)>,
}

impl<'m> Cache<'m> {
    /// A cache that consults what earlier chunks committed, for a chunk of about
    /// `records` records: the maps that take an entry for most records start with
    /// room for them rather than growing through every size on the way.
    pub fn with_memo(memo: &'m Memo, records: usize) -> Cache<'m> {
        Cache {
            memo: Some(memo),
            room: records,
            applied: Map::with_capacity_and_hasher(records, Default::default()),
            ..Cache::default()
        }
    }

    /// The distinct ids of `project` read or linked so far.
    fn ids_of(&mut self, project: u64) -> &mut Map<String, Option<Uuid>> {
        let room = self.room;
        self.ids
            .entry(project)
            .or_insert_with(|| Map::with_capacity_and_hasher(room, Default::default()))
    }

    /// Write every person changed during the chunk into the transaction (a deleted
    /// one as a tombstone), and their first-seen keys and by-property entries, and the
    /// by-property counts they move.
    pub fn write(&self, tx: &Tx<'_>) -> Result<()> {
        let index = BY_PROPERTY_WRITES.load(Ordering::Relaxed);
        // How far the counts are kept, as committed: a build of them moves it only
        // while it holds the journal, which the chunk holds.
        let kept = count::Kept::read(|k| tx.by_property.get(k));
        let mut moves = count::Moves::default();
        for key @ (project, id) in &self.dirty {
            let k = keys::with_uuid(*project, *id);
            let value = match self.persons.get(key) {
                Some(Some(person)) => serde_json::to_vec(person).unwrap_or_default(),
                _ => TOMBSTONE.to_vec(),
            };
            tx.persons.insert(&k[..], value);
            self.write_first_seen(tx, *project, *id);
            if index {
                let counted = kept.covers(&k).then_some(&mut moves);
                self.write_by_property(tx, *project, *id, counted);
            }
        }
        for (k, v) in moves.writes(|k| tx.by_property.get(k)) {
            tx.by_property.insert(k, v);
        }
        Ok(())
    }

    /// Move a changed person's first-seen key if its first event changed (created,
    /// merged away, or given an older one by a merge). A person saved without being
    /// read is new to this chunk.
    fn write_first_seen(&self, tx: &Tx<'_>, project: u64, id: Uuid) {
        let was = self.born.get(&(project, id)).map(|b| b.0);
        let now = match self.persons.get(&(project, id)) {
            Some(Some(person)) => Some(person.created_at),
            _ => None,
        };
        if was == now {
            return;
        }
        // A removal is a tombstone: the index's run may hold the key.
        for (t, value) in [(was, TOMBSTONE), (now, first_seen::PRESENT)] {
            if let Some(t) = t {
                let key = keys::first_seen(project, t, id);
                tx.first_seen.insert(&key[..], value);
            }
        }
    }

    /// A changed person's entries by property ([`by_property_writes`]), and its moves
    /// of the counts if they count it.
    fn write_by_property(
        &self,
        tx: &Tx<'_>,
        project: u64,
        id: Uuid,
        moves: Option<&mut count::Moves>,
    ) {
        let born = self.born.get(&(project, id)).map(|(_, b)| &b[..]);
        let now = self.persons.get(&(project, id)).and_then(Option::as_ref);
        let put = |k, v: &[u8]| tx.by_property.insert(k, v);
        by_property_upkeep(project, id, born, now, put, moves);
    }

    /// How many persons [`Cache::write`] would write.
    #[cfg(test)]
    pub fn changed(&self) -> usize {
        self.dirty.len()
    }

    /// The person of `distinct_id`, if the operations last applied to it were `ops`:
    /// applying them again would change nothing. What this chunk read or changed
    /// comes first; the memo answers for a distinct id and a person it has not.
    pub fn applied(&self, project: u64, distinct_id: &str, ops: &[u8]) -> Option<Uuid> {
        let id = match self.ids.get(&project).and_then(|ids| ids.get(distinct_id)) {
            Some(found) => (*found)?,
            None => self.memo?.person_of(project, distinct_id)?,
        };
        match self.applied.get(&(project, id)) {
            Some(last) => (last.as_slice() == ops).then_some(id),
            // Read or changed in this chunk since: the memo may be out of date.
            None if self.persons.contains_key(&(project, id)) => None,
            None => self.memo?.unchanged_by(project, id, ops).then_some(id),
        }
    }

    /// What the chunk changed that `/decide` may have cached (the distinct ids linked,
    /// the persons written or deleted, the group types named, the groups written),
    /// and what it read and changed, for the memo once the chunk is committed. The
    /// last use of the cache, so its lists move rather than copy.
    pub fn into_reports(self) -> (Changes, Learned) {
        let changes = Changes {
            linked: self.linked,
            persons: self.dirty.iter().copied().collect(),
            group_types: self.group_types_added,
            groups: self.groups_written,
        };
        let Some(memo) = self.memo else {
            return (changes, Learned::default());
        };
        let changed = self
            .dirty
            .iter()
            .filter(|key| !self.applied.contains_key(key))
            .map(|key| (*key, None));
        let ops = self
            .applied
            .iter()
            .map(|(key, ops)| (*key, Some(memo.digest(ops))))
            .chain(changed)
            .collect();
        let ids = self
            .ids
            .into_iter()
            .flat_map(|(project, ids)| {
                ids.into_iter()
                    .map(move |(id, person)| (project, id, person))
            })
            .collect();
        (changes, Learned { ids, ops })
    }

    /// Record that `ops` were just applied to the person `id`.
    pub fn set_applied(&mut self, project: u64, id: Uuid, ops: &[u8]) {
        let last = self.applied.entry((project, id)).or_default();
        last.clear();
        last.extend_from_slice(ops);
    }

    pub fn take_ops_buffer(&mut self) -> Vec<u8> {
        let mut ops = std::mem::take(&mut self.ops);
        ops.clear();
        ops
    }

    pub fn put_ops_buffer(&mut self, ops: Vec<u8>) {
        self.ops = ops;
    }

    /// Forget what was applied to a person that changes otherwise.
    fn changing(&mut self, project: u64, id: Uuid) {
        if !self.applied.is_empty() {
            self.applied.remove(&(project, id));
        }
    }

    pub fn group_type(&self, project: u64, name: &str) -> Option<u8> {
        self.group_types.get(&project)?.get(name).copied()
    }

    pub fn set_group_type(&mut self, project: u64, name: &str, index: u8) {
        self.group_types
            .entry(project)
            .or_default()
            .insert(name.to_owned(), index);
    }

    /// The chunk gave a new group type its index.
    pub fn added_group_type(&mut self, project: u64, name: &str, index: u8) {
        self.set_group_type(project, name, index);
        self.group_types_added.push((project, name.to_owned()));
    }

    /// The chunk wrote a group.
    pub fn wrote_group(&mut self, project: u64, index: u8, key: &str) {
        self.groups_written.push((project, index, key.to_owned()));
    }

    /// The persons of one project, through this cache and the transaction.
    pub fn persons<'a, 'b>(&'a mut self, tx: &'a Tx<'b>, project: u64) -> TxPersons<'a, 'b, 'm> {
        TxPersons {
            tx,
            project,
            cache: self,
        }
    }

    /// The person (if any) of `id`, reading it from the transaction on first use.
    fn person(&mut self, tx: &Tx<'_>, project: u64, id: Uuid) -> Result<&mut Option<Person>> {
        let slot = match self.persons.entry((project, id)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let bytes = tx.persons.get(&keys::with_uuid(project, id));
                let found: Option<Person> =
                    bytes.as_ref().and_then(|b| serde_json::from_slice(b).ok());
                if let (Some(p), Some(b)) = (&found, bytes) {
                    self.born.insert((project, id), (p.created_at, b));
                }
                e.insert(found)
            }
        };
        Ok(slot)
    }
}

/// Persons of one project, read through the chunk's cache and the transaction.
pub struct TxPersons<'a, 'b, 'm> {
    tx: &'a Tx<'b>,
    project: u64,
    cache: &'a mut Cache<'m>,
}

impl persons::Store for TxPersons<'_, '_, '_> {
    type Error = UnabortableTransactionError;

    fn project(&self) -> u64 {
        self.project
    }

    fn person_of(&mut self, distinct_id: &str) -> Result<Option<Uuid>> {
        let memo = self.cache.memo;
        let ids = self.cache.ids_of(self.project);
        if let Some(found) = ids.get(distinct_id) {
            return Ok(*found);
        }
        // A link the memo knows is unchanged: only this chunk could have changed it,
        // and it would then be in `ids`.
        let remembered = memo.and_then(|m| m.person_of(self.project, distinct_id));
        let found = match remembered {
            Some(person) => Some(person),
            None => self
                .tx
                .distinct_ids
                .get(&keys::with_str(self.project, distinct_id))
                .and_then(|b| Uuid::from_slice(&b).ok()),
        };
        ids.insert(distinct_id.to_owned(), found);
        Ok(found)
    }

    fn link(&mut self, distinct_id: &str, person: Uuid) -> Result<()> {
        let key = keys::with_str(self.project, distinct_id);
        self.tx.distinct_ids.insert(key, &person.as_bytes()[..]);
        self.cache
            .ids_of(self.project)
            .insert(distinct_id.to_owned(), Some(person));
        self.cache
            .linked
            .push((self.project, distinct_id.to_owned()));
        Ok(())
    }

    fn load(&mut self, id: Uuid) -> Result<Option<Person>> {
        Ok(self.cache.person(self.tx, self.project, id)?.clone())
    }

    fn save(&mut self, person: &Person) -> Result<()> {
        let key = (self.project, person.id);
        self.cache.changing(self.project, person.id);
        self.cache.persons.insert(key, Some(person.clone()));
        self.cache.dirty.insert(key);
        Ok(())
    }

    fn delete(&mut self, id: Uuid) -> Result<()> {
        let key = (self.project, id);
        self.cache.changing(self.project, id);
        self.cache.persons.insert(key, None);
        self.cache.dirty.insert(key);
        Ok(())
    }

    fn update(&mut self, id: Uuid, change: &mut dyn FnMut(&mut Person) -> bool) -> Result<bool> {
        let project = self.project;
        self.cache.changing(project, id);
        let Some(person) = self.cache.person(self.tx, project, id)? else {
            return Ok(false);
        };
        if change(person) {
            self.cache.dirty.insert((project, id));
        }
        Ok(true)
    }
}

#[cfg(test)]
#[path = "tests/cache.rs"]
mod tests;
