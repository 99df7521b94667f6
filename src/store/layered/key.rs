//! A table's key held inline ([`Key`]), for the searches that compare many keys: the
//! delta's ordered maps and a run's block index.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::ops::Deref;

/// Bytes of a key held inside a [`Key`]: a distinct id's key with a UUID for the id
/// (8 + 36 bytes), a person's (24) and a first-seen key (32) all fit.
pub(super) const KEY_INLINE: usize = 46;

/// A key of the delta's maps and of a run's block index, its bytes inside it up to
/// [`KEY_INLINE`]. A search compares the keys of every node or block it passes; a key
/// behind a pointer (as an `IVec` longer than 22 bytes or a `Box<[u8]>` keeps it: every
/// person's and first-seen key) costs a cache miss a comparison once the map or index
/// outgrows the caches, as at a million persons.
#[derive(Clone)]
pub enum Key {
    Inline { len: u8, bytes: [u8; KEY_INLINE] },
    Heap(Box<[u8]>),
}

impl From<&[u8]> for Key {
    fn from(k: &[u8]) -> Key {
        match k.len() {
            len @ 0..=KEY_INLINE => {
                let mut bytes = [0u8; KEY_INLINE];
                bytes[..len].copy_from_slice(k);
                Key::Inline {
                    len: len as u8,
                    bytes,
                }
            }
            _ => Key::Heap(k.into()),
        }
    }
}

impl Deref for Key {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Key::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Key::Heap(k) => k,
        }
    }
}

impl Borrow<[u8]> for Key {
    fn borrow(&self) -> &[u8] {
        self
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        **self == **other
    }
}

impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Key) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Key) -> Ordering {
        (**self).cmp(&**other)
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn orders_and_finds_as_its_bytes_inline_or_not() {
        // Lengths on both sides of the inline bound, sharing prefixes, so inline keys
        // meet heap keys in comparisons.
        let mut bytes: Vec<Vec<u8>> = Vec::new();
        for len in [
            0,
            1,
            8,
            24,
            32,
            KEY_INLINE - 1,
            KEY_INLINE,
            KEY_INLINE + 1,
            90,
        ] {
            for last in [0u8, 7, 255] {
                let mut k = vec![3u8; len];
                if let Some(l) = k.last_mut() {
                    *l = last;
                }
                bytes.push(k);
            }
        }
        let mut keys: Vec<Key> = bytes.iter().map(|b| Key::from(&b[..])).collect();
        keys.sort();
        bytes.sort();
        bytes.dedup();
        keys.dedup();
        let sorted: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        assert_eq!(sorted, bytes.iter().map(|b| &b[..]).collect::<Vec<_>>());

        let map: BTreeMap<Key, usize> = keys.into_iter().zip(0..).collect();
        for (i, b) in bytes.iter().enumerate() {
            assert_eq!(map.get(&b[..]), Some(&i), "{b:?}");
        }
        assert_eq!(map.get(&[3u8; 5][..]), None);
        assert!(matches!(Key::from(&[9u8; 90][..]), Key::Heap(_)));
        assert!(matches!(
            Key::from(&[9u8; KEY_INLINE][..]),
            Key::Inline { .. }
        ));
    }
}
