//! What the compactor remembers of persons from one chunk to the next: which person
//! each recently seen distinct id belongs to, and for each recently seen person the
//! person operations it last had applied (as a keyed digest). Most events repeat
//! their user's operations, or carry none: with both known, such an event changes
//! nothing and needs neither a read of its distinct id nor of its person.
//!
//! Only the compactor writes persons and links, so what it learns from the chunks it
//! commits stays true until a later chunk changes it; [`Memo::learn`] takes in each
//! committed chunk's reads and changes. Bounded: when full it starts again empty.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher, RandomState};

use uuid::Uuid;

/// Distinct ids remembered before the memo starts again; a digest is kept per person
/// besides: a few megabytes with ids of a typical length, about 40 MB at worst (every
/// id the longest capture keeps, 200 characters of up to four bytes).
pub const DEFAULT_CAPACITY: usize = 50_000;

/// A digest of operations text, keyed per process so text cannot be chosen to
/// collide with another's.
pub type Digest = [u64; 2];

/// The memo's maps hash with foldhash, randomly seeded (SipHash was about 3 % of the
/// compactor thread's CPU there in a profile of a drain); the digests stay keyed
/// SipHash, whose collisions would skip a change.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

pub struct Memo {
    /// Project -> distinct id -> its person. Nested so a lookup by `&str` builds no key.
    ids: Map<u64, Map<Box<str>, Uuid>>,
    id_count: usize,
    /// (project, person) -> the digest of the operations last applied to it, which
    /// applied again would change nothing.
    ops: Map<(u64, Uuid), Digest>,
    keys: [RandomState; 2],
    capacity: usize,
    /// Operations [`Memo::unchanged_by`] answered for, so tests can see it used.
    #[cfg(test)]
    pub hits: std::cell::Cell<u64>,
}

/// What a committed chunk read and changed, for [`Memo::learn`].
#[derive(Debug, Default)]
pub struct Learned {
    /// Each distinct id read or linked, with its person at the end of the chunk.
    pub ids: Vec<(u64, String, Option<Uuid>)>,
    /// Each person with operations applied last (Some) or changed otherwise (None).
    pub ops: Vec<((u64, Uuid), Option<Digest>)>,
}

impl Default for Memo {
    fn default() -> Self {
        Memo::with_capacity(DEFAULT_CAPACITY)
    }
}

impl Memo {
    pub fn with_capacity(capacity: usize) -> Memo {
        Memo {
            ids: Map::default(),
            id_count: 0,
            ops: Map::default(),
            keys: [RandomState::new(), RandomState::new()],
            capacity: capacity.max(1),
            #[cfg(test)]
            hits: std::cell::Cell::new(0),
        }
    }

    /// The person of `distinct_id` as of the last committed chunk, if remembered.
    pub fn person_of(&self, project: u64, distinct_id: &str) -> Option<Uuid> {
        self.ids.get(&project)?.get(distinct_id).copied()
    }

    /// Whether `person`'s last applied operations were `ops`, as of the last chunk.
    pub fn unchanged_by(&self, project: u64, person: Uuid, ops: &[u8]) -> bool {
        let unchanged = self.ops.get(&(project, person)) == Some(&self.digest(ops));
        #[cfg(test)]
        self.hits.set(self.hits.get() + u64::from(unchanged));
        unchanged
    }

    pub fn digest(&self, ops: &[u8]) -> Digest {
        self.keys.each_ref().map(|k| {
            let mut h = k.build_hasher();
            h.write(ops);
            h.finish()
        })
    }

    /// Take in what a chunk read and changed; call only once it is committed.
    pub fn learn(&mut self, learned: Learned) {
        if self.id_count + learned.ids.len() > self.capacity
            || self.ops.len() + learned.ops.len() > self.capacity
        {
            // Each map keeps its room: it fills to the same size again.
            self.ids.values_mut().for_each(Map::clear);
            self.ops.clear();
            self.id_count = 0;
        }
        for (project, distinct_id, person) in learned.ids {
            let ids = self.ids.entry(project).or_default();
            match person {
                Some(p) => {
                    if ids.insert(distinct_id.into_boxed_str(), p).is_none() {
                        self.id_count += 1;
                    }
                }
                None => {
                    if ids.remove(distinct_id.as_str()).is_some() {
                        self.id_count -= 1;
                    }
                }
            }
        }
        for (key, digest) in learned.ops {
            match digest {
                Some(d) => {
                    self.ops.insert(key, d);
                }
                None => {
                    self.ops.remove(&key);
                }
            }
        }
    }

    /// About the bytes it takes in memory: its maps' slots and the ids' text.
    pub fn footprint(&self) -> usize {
        use std::mem::size_of;
        let ids: usize = self
            .ids
            .values()
            .map(|m| {
                let text: usize = m.keys().map(|k| k.len()).sum();
                m.capacity() * (size_of::<(Box<str>, Uuid)>() + 1) + text
            })
            .sum();
        ids + self.ops.capacity() * (size_of::<((u64, Uuid), Digest)>() + 1)
    }

    /// Distinct ids remembered.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.id_count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    #[test]
    fn remembers_links_and_operations_until_changed() {
        let mut memo = Memo::default();
        let ops = b"\x02\x02\x02".as_slice();
        memo.learn(Learned {
            ids: vec![(1, "a".into(), Some(p(7))), (1, "b".into(), None)],
            ops: vec![((1, p(7)), Some(memo.digest(ops)))],
        });
        assert_eq!(memo.person_of(1, "a"), Some(p(7)));
        assert_eq!(memo.person_of(2, "a"), None, "projects are apart");
        assert_eq!(memo.person_of(1, "b"), None, "no person is not remembered");
        assert!(memo.unchanged_by(1, p(7), ops));
        assert!(!memo.unchanged_by(1, p(7), b"\x01{}\x02\x02"));
        assert!(!memo.unchanged_by(2, p(7), ops));

        // A later chunk relinks "a" and changes the person otherwise.
        memo.learn(Learned {
            ids: vec![(1, "a".into(), Some(p(8)))],
            ops: vec![((1, p(7)), None)],
        });
        assert_eq!(memo.person_of(1, "a"), Some(p(8)));
        assert!(!memo.unchanged_by(1, p(7), ops));
        assert_eq!(memo.len(), 1);
    }

    #[test]
    fn starts_again_when_full() {
        let mut memo = Memo::with_capacity(3);
        for n in 0..3u128 {
            memo.learn(Learned {
                ids: vec![(1, format!("u{n}"), Some(p(n)))],
                ops: vec![],
            });
        }
        assert_eq!(memo.len(), 3);
        memo.learn(Learned {
            ids: vec![(1, "u3".into(), Some(p(3)))],
            ops: vec![],
        });
        assert_eq!(memo.len(), 1);
        assert_eq!(memo.person_of(1, "u0"), None);
        assert_eq!(memo.person_of(1, "u3"), Some(p(3)));
    }
}
