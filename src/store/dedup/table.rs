//! The frozen segments' uuids by fingerprint: one open-addressing table (linear
//! probing) of 32-bit slots, each a 24-bit fingerprint of a (project, uuid) and the
//! 8-bit generation of the segment holding it. A lookup is one probe sequence however
//! many segments the window holds; a fingerprint that matches is confirmed in its
//! segment (a binary search over the full 16 bytes), so two uuids sharing a
//! fingerprint never read as one: the window stays exact, and a short fingerprint
//! costs only the odd needless search. Dropping a segment removes its uuids' slots by
//! generation.
//!
//! The home slot and the fingerprint come from separate bits of one 64-bit hash, so a
//! short fingerprint keeps all its bits for telling uuids apart; but a slot's bits do
//! not tell its home, so the table cannot move slots: it does not grow by itself, and
//! a removed slot is left as a tombstone that probes pass over (and inserts reuse).
//! [`Table::has_room`] counts tombstones as full; once it says no, the window builds a
//! new table from its segments' uuids ([`Table::for_len`]), which drops them.

use super::Id;

/// A slot's generation bits; the rest hold the fingerprint.
const GENERATION_BITS: u32 = 8;
/// Segments the table tells apart: the window keeps fewer alive at once.
pub const GENERATIONS: usize = 1 << GENERATION_BITS;
const GENERATION_MASK: u32 = (1 << GENERATION_BITS) - 1;
/// A slot's fingerprint bits: a probe meets another uuid's equal fingerprint about
/// once in 16 million, so the search that rules it out costs nothing measurable.
const FINGERPRINT_BITS: u32 = 32 - GENERATION_BITS;
/// Slots to start with: a small window costs little.
const MIN_SLOTS_LOG2: u32 = 12;
/// At most this share of the slots is full: linear probing stays at a probe or two
/// per lookup below about three quarters.
const MAX_LOAD_NUMERATOR: usize = 3;
const MAX_LOAD_DENOMINATOR: usize = 4;

/// A slot no id has used since the table was built: a probe ends there.
const EMPTY: u32 = 0;
/// A slot whose id was removed: probes go on past it. A fingerprint is never 0, so
/// neither is a slot in use.
const TOMBSTONE: u32 = 1;

pub struct Table {
    slots: Vec<u32>,
    /// log2 of the slot count.
    bits: u32,
    len: usize,
    tombstones: usize,
    /// The fingerprint bits kept: all of [`FINGERPRINT_BITS`], fewer in tests that
    /// make every uuid share a fingerprint.
    fingerprint_mask: u32,
}

/// The 64-bit hash of an id: its top bits pick the home slot, its low bits are the
/// fingerprint.
pub fn hash((project, id): Id) -> u64 {
    let mut h = (id as u64) ^ project.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h = (h ^ (h >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= (id >> 64) as u64;
    h = (h ^ (h >> 29)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 32)
}

/// log2 of the slots `len` ids need within the load bound.
fn bits_for(len: usize) -> u32 {
    let wanted = len * MAX_LOAD_DENOMINATOR / MAX_LOAD_NUMERATOR + 1;
    wanted
        .next_power_of_two()
        .trailing_zeros()
        .max(MIN_SLOTS_LOG2)
}

impl Default for Table {
    fn default() -> Table {
        Table::for_len(0)
    }
}

impl Table {
    /// An empty table with room for `len` ids.
    pub fn for_len(len: usize) -> Table {
        let bits = bits_for(len);
        Table {
            slots: vec![0; 1 << bits],
            bits,
            len: 0,
            tombstones: 0,
            fingerprint_mask: (1 << FINGERPRINT_BITS) - 1,
        }
    }

    /// Empty the table and size it for `len` ids. The old slots are freed before the
    /// new ones are taken, so the two are never held at once.
    pub fn reset(&mut self, len: usize) {
        self.slots = Vec::new();
        self.bits = bits_for(len);
        self.slots = vec![EMPTY; 1 << self.bits];
        self.len = 0;
        self.tombstones = 0;
    }

    /// A table whose fingerprints keep only `bits` bits, so that uuids share them.
    #[cfg(test)]
    pub fn with_fingerprint_bits(mut self, bits: u32) -> Table {
        self.fingerprint_mask = (1 << bits.min(FINGERPRINT_BITS)) - 1;
        self
    }

    #[cfg(test)]
    pub fn fingerprint_bits(&self) -> u32 {
        self.fingerprint_mask.count_ones()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes of its slots.
    pub fn bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<u32>()
    }

    /// Whether `more` ids fit without passing the load bound, tombstones counted.
    pub fn has_room(&self, more: usize) -> bool {
        let used = self.len + self.tombstones + more;
        used * MAX_LOAD_DENOMINATOR <= self.slots.len() * MAX_LOAD_NUMERATOR
    }

    fn home(&self, hash: u64) -> usize {
        (hash >> (64 - self.bits)) as usize
    }

    fn fingerprint(&self, hash: u64) -> u32 {
        (hash as u32 & self.fingerprint_mask).max(1)
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Record that segment `generation` holds the id of `hash`. The caller keeps the
    /// load bound ([`Table::has_room`]); a full table would never end a probe.
    pub fn insert(&mut self, hash: u64, generation: u8) {
        debug_assert!(self.has_room(1));
        let slot = self.fingerprint(hash) << GENERATION_BITS | u32::from(generation);
        let mut i = self.home(hash);
        while self.slots[i] > TOMBSTONE {
            i = (i + 1) & self.mask();
        }
        if self.slots[i] == TOMBSTONE {
            self.tombstones -= 1;
        }
        self.slots[i] = slot;
        self.len += 1;
    }

    /// The generations of the segments that may hold the id of `hash` (each to be
    /// confirmed), until `found` answers true; whether it did.
    pub fn any(&self, hash: u64, mut found: impl FnMut(u8) -> bool) -> bool {
        let fingerprint = self.fingerprint(hash);
        let mut i = self.home(hash);
        loop {
            let slot = self.slots[i];
            if slot == EMPTY {
                return false;
            }
            if slot >> GENERATION_BITS == fingerprint && found((slot & GENERATION_MASK) as u8) {
                return true;
            }
            i = (i + 1) & self.mask();
        }
    }

    /// Forget that segment `generation` holds the id of `hash`: its slot becomes a
    /// tombstone (a slot's home is not in its bits, so no later slot can be moved
    /// back into it), or empty when nothing probes past it.
    pub fn remove(&mut self, hash: u64, generation: u8) {
        let wanted = self.fingerprint(hash) << GENERATION_BITS | u32::from(generation);
        let mut i = self.home(hash);
        loop {
            match self.slots[i] {
                EMPTY => return,
                s if s == wanted => break,
                _ => i = (i + 1) & self.mask(),
            }
        }
        self.len -= 1;
        if self.slots[(i + 1) & self.mask()] != EMPTY {
            self.slots[i] = TOMBSTONE;
            self.tombstones += 1;
            return;
        }
        // The end of a cluster: it and the tombstones just before it end probes.
        self.slots[i] = EMPTY;
        let mut j = i.wrapping_sub(1) & self.mask();
        while self.slots[j] == TOMBSTONE {
            self.slots[j] = EMPTY;
            self.tombstones -= 1;
            j = j.wrapping_sub(1) & self.mask();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(t: &mut Table, n: u128) {
        for id in 0..n {
            t.insert(hash((1, id)), (id % 3) as u8);
        }
    }

    #[test]
    fn finds_what_was_inserted_until_removed_with_generations_apart() {
        let n = 20_000u128;
        let mut t = Table::for_len(n as usize);
        assert!(t.has_room(n as usize) && !t.has_room(t.slots.len()));
        fill(&mut t, n);
        assert_eq!(t.len(), n as usize);
        for id in 0..n {
            let mut seen = Vec::new();
            t.any(hash((1, id)), |g| {
                seen.push(g);
                false
            });
            assert!(seen.contains(&((id % 3) as u8)), "id {id}: {seen:?}");
        }
        // Another project's same uuid is another hash.
        assert_ne!(hash((1, 5)), hash((2, 5)));
        for id in (0..n).filter(|id| id % 3 == 1) {
            t.remove(hash((1, id)), 1);
        }
        for id in 0..n {
            let held = t.any(hash((1, id)), |g| g == (id % 3) as u8);
            assert_eq!(held, id % 3 != 1, "id {id}");
        }
        let kept = (0..n).filter(|id| id % 3 != 1).count();
        assert_eq!(t.len(), kept);
        // Removed slots inside clusters stay as tombstones, counted against the room.
        assert!(t.tombstones > 0 && t.tombstones <= n as usize - kept);
        let free = t.slots.len() * 3 / 4 - kept - t.tombstones;
        assert!(t.has_room(free) && !t.has_room(free + 1));
    }

    #[test]
    fn tombstones_are_passed_over_and_reused() {
        // Every uuid shares one fingerprint: only the generations tell slots apart. A
        // table filled near its bound, so clusters are long.
        let n = 3_000u128;
        let mut t = Table::for_len(n as usize).with_fingerprint_bits(0);
        for id in 0..n {
            t.insert(hash((1, id)), (id % 4) as u8);
        }
        for id in (0..n).filter(|id| id % 4 == 0) {
            t.remove(hash((1, id)), 0);
        }
        assert_eq!(t.len(), 2_250);
        let check = |t: &Table| {
            for id in 0..n {
                let held = t.any(hash((1, id)), |g| g == (id % 4) as u8);
                assert_eq!(held, id % 4 != 0, "id {id}");
            }
        };
        check(&t);
        let (used, tombstones) = (t.len + t.tombstones, t.tombstones);
        assert!(tombstones > 100, "{tombstones}");
        for id in n..n + 200 {
            t.insert(hash((1, id)), 9);
        }
        assert!(
            t.tombstones < tombstones,
            "an insert takes a tombstone's slot"
        );
        assert!(t.len + t.tombstones < used + 200);
        check(&t);
        assert!((n..n + 200).all(|id| t.any(hash((1, id)), |g| g == 9)));
    }

    #[test]
    fn the_end_of_a_cluster_becomes_empty_again() {
        let mut t = Table::for_len(8).with_fingerprint_bits(0);
        // One fingerprint, so each slot is told by its generation alone.
        let ids: Vec<u128> = (0..6).collect();
        for &id in &ids {
            t.insert(hash((1, id)), id as u8);
        }
        for &id in &ids {
            t.remove(hash((1, id)), id as u8);
        }
        assert_eq!((t.len(), t.tombstones), (0, 0));
        assert!(t.slots.iter().all(|&s| s == EMPTY));
    }
}
