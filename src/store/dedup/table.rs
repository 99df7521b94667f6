//! The frozen segments' uuids by fingerprint: one open-addressing table (linear
//! probing) of 64-bit slots, each a 48-bit fingerprint of a (project, uuid) and the
//! 16-bit generation of the segment holding it. A lookup is one probe sequence
//! however many segments the window holds; a fingerprint that matches is confirmed in
//! its segment (a binary search), so two uuids sharing a fingerprint never read as
//! one: the window stays exact. Dropping a segment removes its uuids' slots by
//! generation (backward-shift deletion, no tombstones to accumulate).

use super::Id;

/// A slot's fingerprint bits; the rest hold the generation.
const FINGERPRINT_BITS: u32 = 48;
const GENERATION_MASK: u64 = (1 << (64 - FINGERPRINT_BITS)) - 1;
/// Slots to start with: a small window costs little.
const MIN_SLOTS_LOG2: u32 = 12;
/// The table doubles once more than this share of its slots are full: linear probing
/// stays at a probe or two per lookup below about three quarters.
const MAX_LOAD_NUMERATOR: usize = 3;
const MAX_LOAD_DENOMINATOR: usize = 4;

pub struct Table {
    /// 0 is an empty slot; a fingerprint is never 0.
    slots: Vec<u64>,
    /// log2 of the slot count.
    bits: u32,
    len: usize,
}

/// The fingerprint of an id: 48 well-mixed bits, never 0. Its top bits are its home
/// slot, so the table can grow without the ids.
pub fn fingerprint((project, id): Id) -> u64 {
    let mut h = (id as u64) ^ project.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h = (h ^ (h >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= (id >> 64) as u64;
    h = (h ^ (h >> 29)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 32;
    (h >> (64 - FINGERPRINT_BITS)).max(1)
}

impl Default for Table {
    fn default() -> Table {
        Table {
            slots: vec![0; 1 << MIN_SLOTS_LOG2],
            bits: MIN_SLOTS_LOG2,
            len: 0,
        }
    }
}

impl Table {
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes of its slots.
    pub fn bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<u64>()
    }

    fn home(&self, fingerprint: u64) -> usize {
        (fingerprint >> (FINGERPRINT_BITS - self.bits)) as usize
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Record that segment `generation` holds the id of `fingerprint`.
    pub fn insert(&mut self, fingerprint: u64, generation: u16) {
        if (self.len + 1) * MAX_LOAD_DENOMINATOR > self.slots.len() * MAX_LOAD_NUMERATOR {
            self.grow();
        }
        self.place(fingerprint << 16 | u64::from(generation));
        self.len += 1;
    }

    fn place(&mut self, slot: u64) {
        let mut i = self.home(slot >> 16);
        while self.slots[i] != 0 {
            i = (i + 1) & self.mask();
        }
        self.slots[i] = slot;
    }

    fn grow(&mut self) {
        let old = std::mem::replace(&mut self.slots, vec![0; 1 << (self.bits + 1)]);
        self.bits += 1;
        for slot in old.into_iter().filter(|&s| s != 0) {
            self.place(slot);
        }
    }

    /// The generations of the segments that may hold the id of `fingerprint` (each
    /// to be confirmed), until `found` answers true; whether it did.
    pub fn any(&self, fingerprint: u64, mut found: impl FnMut(u16) -> bool) -> bool {
        let mut i = self.home(fingerprint);
        loop {
            let slot = self.slots[i];
            if slot == 0 {
                return false;
            }
            if slot >> 16 == fingerprint && found((slot & GENERATION_MASK) as u16) {
                return true;
            }
            i = (i + 1) & self.mask();
        }
    }

    /// Forget that segment `generation` holds the id of `fingerprint`.
    pub fn remove(&mut self, fingerprint: u64, generation: u16) {
        let wanted = fingerprint << 16 | u64::from(generation);
        let mut i = self.home(fingerprint);
        loop {
            match self.slots[i] {
                0 => return,
                s if s == wanted => break,
                _ => i = (i + 1) & self.mask(),
            }
        }
        self.len -= 1;
        // Backward shift: move each later slot of the cluster that may live at `i`
        // (its home is not strictly between `i` and it) into the hole.
        let mut hole = i;
        let mut j = (i + 1) & self.mask();
        loop {
            let slot = self.slots[j];
            if slot == 0 {
                break;
            }
            let home = self.home(slot >> 16);
            let dist_home = j.wrapping_sub(home) & self.mask();
            let dist_hole = j.wrapping_sub(hole) & self.mask();
            if dist_home >= dist_hole {
                self.slots[hole] = slot;
                hole = j;
            }
            j = (j + 1) & self.mask();
        }
        self.slots[hole] = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_what_was_inserted_until_removed_with_generations_apart() {
        let mut t = Table::default();
        let n = 20_000u128;
        for id in 0..n {
            t.insert(fingerprint((1, id)), (id % 3) as u16);
        }
        assert_eq!(t.len(), n as usize);
        assert!(t.slots.len() > 1 << MIN_SLOTS_LOG2, "it grew");
        for id in 0..n {
            let mut seen = Vec::new();
            t.any(fingerprint((1, id)), |g| {
                seen.push(g);
                false
            });
            assert!(seen.contains(&((id % 3) as u16)), "id {id}: {seen:?}");
        }
        // Another project's same uuid is another fingerprint.
        assert_ne!(fingerprint((1, 5)), fingerprint((2, 5)));
        for id in (0..n).filter(|id| id % 3 == 1) {
            t.remove(fingerprint((1, id)), 1);
        }
        for id in 0..n {
            let held = t.any(fingerprint((1, id)), |g| g == (id % 3) as u16);
            assert_eq!(held, id % 3 != 1, "id {id}");
        }
        assert_eq!(t.len(), (0..n).filter(|id| id % 3 != 1).count());
    }

    #[test]
    fn equal_fingerprints_are_kept_apart_by_generation() {
        let mut t = Table::default();
        t.insert(77, 1);
        t.insert(77, 2);
        t.insert(78, 1);
        let mut seen = Vec::new();
        assert!(!t.any(77, |g| {
            seen.push(g);
            false
        }));
        seen.sort_unstable();
        assert_eq!(seen, [1, 2]);
        t.remove(77, 1);
        assert!(!t.any(77, |g| g == 1));
        assert!(t.any(77, |g| g == 2));
        assert!(t.any(78, |g| g == 1));
        assert_eq!(t.len(), 2);
    }
}
