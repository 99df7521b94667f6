//! The Bloom filter a run keeps over its keys, so a point read of a key the run does
//! not hold reads no block.
//!
//! Runs are written with a blocked filter: all of a key's bits lie in one block of 512
//! bits, one cache line, chosen by the key's hash. A read of a key the run holds tests
//! every bit; with the bits spread over the whole filter (the classic layout, which
//! runs written before keep) that was seven cache misses and seven divisions per read,
//! and at a million persons the compactor looks up a distinct id this way for nearly
//! every event.

use twox_hash::XxHash64;

/// Bits of the filter a key (about 1 % false positives either way).
const FILTER_BITS_PER_KEY: u64 = 10;
/// The classic filter's probes, which runs written before the blocked one store.
#[cfg(test)]
const FILTER_PROBES: u32 = 7;
/// Bits set a key in the blocked filter, and the block's size in words.
const BLOCK_PROBES: u32 = 7;
const BLOCK_WORDS: usize = 8;
const BLOCK_BITS: u64 = (BLOCK_WORDS * 64) as u64;
/// The probe count a run's index stores for a blocked filter. Versions that knew only
/// the classic filter read no probes as "may hold every key": they still read such a
/// run correctly, only without its filter.
const BLOCKED: u32 = 0;

/// A Bloom filter over the run's keys, from one XXH64 of each.
#[derive(Debug)]
pub(super) struct Filter {
    /// The classic filter's probes (double hashing over the whole filter), or
    /// [`BLOCKED`].
    pub(super) probes: u32,
    pub(super) words: Vec<u64>,
}

impl Filter {
    pub(super) fn hash(key: &[u8]) -> u64 {
        XxHash64::oneshot(0, key)
    }

    /// A blocked filter over keys of these hashes.
    pub(super) fn build(hashes: &[u64]) -> Filter {
        let blocks = (hashes.len() as u64 * FILTER_BITS_PER_KEY)
            .div_ceil(BLOCK_BITS)
            .max(1);
        let mut words = vec![0u64; blocks as usize * BLOCK_WORDS];
        for &h in hashes {
            let block = block_of(h, blocks);
            for bit in block_bits(h) {
                words[block + (bit / 64) as usize] |= 1 << (bit % 64);
            }
        }
        Filter {
            probes: BLOCKED,
            words,
        }
    }

    /// A classic filter, as runs written before the blocked one hold.
    #[cfg(test)]
    pub(super) fn build_classic(hashes: &[u64]) -> Filter {
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
        if self.words.is_empty() {
            return true;
        }
        let h = Filter::hash(key);
        if self.probes == BLOCKED {
            let blocks = (self.words.len() / BLOCK_WORDS) as u64;
            if blocks == 0 {
                return true;
            }
            let block = &self.words[block_of(h, blocks)..][..BLOCK_WORDS];
            return block_bits(h).all(|bit| block[(bit / 64) as usize] & (1 << (bit % 64)) != 0);
        }
        self.classic_may_hold(h)
    }

    /// The classic filter's test, as every version before the blocked filter made it
    /// whatever the probe count stored.
    fn classic_may_hold(&self, h: u64) -> bool {
        let bits = self.words.len() as u64 * 64;
        let (mut x, step) = (h, h.rotate_left(32) | 1);
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

/// The first word of the block a key of hash `h` falls in, of `blocks`: its high 32
/// bits scaled to the count (no division).
fn block_of(h: u64, blocks: u64) -> usize {
    (((h >> 32) * blocks) >> 32) as usize * BLOCK_WORDS
}

/// The key's bits within its block: nine bits each of a second mix of the hash.
fn block_bits(h: u64) -> impl Iterator<Item = u64> {
    let x = (h ^ (h >> 31)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..BLOCK_PROBES).map(move |i| (x >> (i * 9)) % BLOCK_BITS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(from: u64, n: u64) -> Vec<Vec<u8>> {
        (from..from + n)
            .map(|i| format!("user-{i:07}").into_bytes())
            .collect()
    }

    fn false_positives(filter: &Filter) -> usize {
        keys(1_000_000, 100_000)
            .iter()
            .filter(|k| filter.may_hold(k))
            .count()
    }

    #[test]
    fn both_layouts_hold_every_key_and_few_others() {
        let held = keys(0, 100_000);
        let hashes: Vec<u64> = held.iter().map(|k| Filter::hash(k)).collect();
        for filter in [Filter::build(&hashes), Filter::build_classic(&hashes)] {
            assert!(held.iter().all(|k| filter.may_hold(k)), "{}", filter.probes);
            // About 1 % at ten bits a key; a blocked filter's blocks fill unevenly,
            // so a little more there.
            let fp = false_positives(&filter);
            assert!(fp < 2_000, "{fp} of 100000 with {} probes", filter.probes);
            assert!(fp > 100, "{fp}: a filter that holds nothing would show 0");
        }
    }

    #[test]
    fn a_reader_of_the_classic_filter_takes_a_blocked_one_as_holding_every_key() {
        let filter = Filter::build(
            &keys(0, 1000)
                .iter()
                .map(|k| Filter::hash(k))
                .collect::<Vec<_>>(),
        );
        let absent = keys(5000, 1000);
        assert!(absent.iter().any(|k| !filter.may_hold(k)));
        assert!(absent
            .iter()
            .all(|k| filter.classic_may_hold(Filter::hash(k))));
    }

    #[test]
    fn an_empty_filter_may_hold_anything() {
        let filter = Filter::build(&[]);
        assert_eq!(filter.words.len(), BLOCK_WORDS);
        assert!(!filter.may_hold(b"x"));
        let none = Filter {
            probes: BLOCKED,
            words: Vec::new(),
        };
        assert!(none.may_hold(b"x"));
    }
}
