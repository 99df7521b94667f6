//! The window's hash set of ids, hashed by mixing their bits.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};

use super::Id;

/// Hashes ids by mixing their bits: uuids are random already, SipHash is not needed.
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(23) ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_u128(&mut self, x: u128) {
        self.write_u64(x as u64);
        self.write_u64((x >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
}

pub type IdSet = HashSet<Id, BuildHasherDefault<IdHasher>>;
