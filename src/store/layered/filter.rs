//! The Bloom filter a run keeps over its keys, so a point read of a key the run does
//! not hold reads no block.

use twox_hash::XxHash64;

/// Bits of the filter a key; seven probes suit ten (about 1 % false positives).
const FILTER_BITS_PER_KEY: u64 = 10;
const FILTER_PROBES: u32 = 7;

/// A Bloom filter over the run's keys (double hashing of one XXH64).
#[derive(Debug)]
pub(super) struct Filter {
    pub(super) probes: u32,
    pub(super) words: Vec<u64>,
}

impl Filter {
    pub(super) fn hash(key: &[u8]) -> (u64, u64) {
        let h = XxHash64::oneshot(0, key);
        (h, h.rotate_left(32) | 1)
    }

    pub(super) fn build(hashes: &[u64]) -> Filter {
        let bits = (hashes.len() as u64 * FILTER_BITS_PER_KEY).max(64);
        let mut words = vec![0u64; bits.div_ceil(64) as usize];
        let bits = words.len() as u64 * 64;
        for &h in hashes {
            let (mut x, step) = (h, h.rotate_left(32) | 1);
            for _ in 0..FILTER_PROBES {
                let bit = x % bits;
                words[(bit / 64) as usize] |= 1 << (bit % 64);
                x = x.wrapping_add(step);
            }
        }
        Filter {
            probes: FILTER_PROBES,
            words,
        }
    }

    pub(super) fn may_hold(&self, key: &[u8]) -> bool {
        let bits = self.words.len() as u64 * 64;
        if bits == 0 {
            return true;
        }
        let (mut x, step) = Filter::hash(key);
        for _ in 0..self.probes {
            let bit = x % bits;
            if self.words[(bit / 64) as usize] & (1 << (bit % 64)) == 0 {
                return false;
            }
            x = x.wrapping_add(step);
        }
        true
    }
}
