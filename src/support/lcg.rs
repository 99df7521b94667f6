//! A seeded pseudo-random sequence for tests that generate data: the same seed gives
//! the same data on every machine, so a failing seed can be replayed, and no random
//! number crate is needed for it.

/// Knuth's MMIX linear congruential generator; its upper bits are used.
pub struct Lcg(pub u64);

impl Lcg {
    /// A number below `below` (0 when `below` is 0).
    pub fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below.max(1)
    }

    /// Any 64-bit number.
    pub fn wide(&mut self) -> u64 {
        self.next(1 << 32) << 32 | self.next(1 << 32)
    }
}
