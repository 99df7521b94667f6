//! A unique-count sketch: a HyperLogLog of 2^10 one-byte registers (1 KiB, standard
//! error 1.04/sqrt(1024), about 3.3%), kept as the exact set of hashes while it holds
//! at most 128 of them (the same 1 KiB), so an hour or a day with few persons counts
//! them exactly. Sketches of several hours merge by register maximum, which estimates
//! the union: a person seen in two hours of a day counts once in the day.
//!
//! Hashes are XXH64 with a fixed seed (a specified, stable function), so a sketch
//! written by one version merges with one written by the next.

use uuid::Uuid;

/// Bits of the hash that choose the register.
const INDEX_BITS: u32 = 10;
pub const REGISTERS: usize = 1 << INDEX_BITS;
/// Hashes kept exactly at most: as many bytes as the registers.
pub const EXACT_MAX: usize = REGISTERS / 8;
/// Part of the on-disk format: changing it changes every stored sketch.
const SEED: u64 = 0x666c_6167_706f_7374;

const TAG_EXACT: u8 = 0;
const TAG_DENSE: u8 = 1;

/// The hash a person is counted by: its uuid when it has one, else its distinct id
/// (as the console always counted an event without a person).
pub fn who(person: Option<Uuid>, distinct_id: &str) -> u64 {
    match person {
        Some(p) => twox_hash::XxHash64::oneshot(SEED, p.as_bytes()),
        None => twox_hash::XxHash64::oneshot(SEED ^ 1, distinct_id.as_bytes()),
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Sketch {
    /// Sorted, without repeats.
    Exact(Vec<u64>),
    Dense(Box<[u8; REGISTERS]>),
}

impl Default for Sketch {
    fn default() -> Sketch {
        Sketch::Exact(Vec::new())
    }
}

fn set(registers: &mut [u8; REGISTERS], hash: u64) {
    let index = (hash >> (64 - INDEX_BITS)) as usize;
    // The position of the first one bit in the rest; all zeros counts as the last.
    let rank = ((hash << INDEX_BITS).leading_zeros().min(64 - INDEX_BITS) + 1) as u8;
    if registers[index] < rank {
        registers[index] = rank;
    }
}

impl Sketch {
    pub fn insert(&mut self, hash: u64) {
        match self {
            Sketch::Exact(hashes) => {
                if let Err(at) = hashes.binary_search(&hash) {
                    hashes.insert(at, hash);
                    if hashes.len() > EXACT_MAX {
                        self.densify();
                    }
                }
            }
            Sketch::Dense(registers) => set(registers, hash),
        }
    }

    fn densify(&mut self) {
        if let Sketch::Exact(hashes) = self {
            let mut registers = Box::new([0u8; REGISTERS]);
            for &h in hashes.iter() {
                set(&mut registers, h);
            }
            *self = Sketch::Dense(registers);
        }
    }

    /// The union of both.
    pub fn merge(&mut self, other: &Sketch) {
        match other {
            Sketch::Exact(hashes) => {
                for &h in hashes {
                    self.insert(h);
                }
            }
            Sketch::Dense(theirs) => {
                self.densify();
                if let Sketch::Dense(ours) = self {
                    for (a, b) in ours.iter_mut().zip(theirs.iter()) {
                        *a = (*a).max(*b);
                    }
                }
            }
        }
    }

    /// How many different hashes were inserted: exact up to [`EXACT_MAX`], then the
    /// HyperLogLog estimate (linear counting while registers are still empty).
    pub fn estimate(&self) -> u64 {
        let registers = match self {
            Sketch::Exact(hashes) => return hashes.len() as u64,
            Sketch::Dense(r) => r,
        };
        let m = REGISTERS as f64;
        let (sum, zeros) = registers.iter().fold((0.0f64, 0u32), |(s, z), &r| {
            (s + (-f64::from(r)).exp2(), z + u32::from(r == 0))
        });
        let alpha = 0.7213 / (1.0 + 1.079 / m);
        let raw = alpha * m * m / sum;
        let estimate = if raw <= 2.5 * m && zeros > 0 {
            m * (m / f64::from(zeros)).ln()
        } else {
            raw
        };
        estimate.round() as u64
    }

    /// Appended to `out`: a tag, then the hashes (count u16 LE, each u64 LE) or the
    /// registers.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Sketch::Exact(hashes) => {
                out.push(TAG_EXACT);
                out.extend_from_slice(&(hashes.len() as u16).to_le_bytes());
                for h in hashes {
                    out.extend_from_slice(&h.to_le_bytes());
                }
            }
            Sketch::Dense(registers) => {
                out.push(TAG_DENSE);
                out.extend_from_slice(&registers[..]);
            }
        }
    }

    /// None if damaged.
    pub fn decode(bytes: &[u8]) -> Option<Sketch> {
        let (&tag, rest) = bytes.split_first()?;
        match tag {
            TAG_EXACT => {
                let n = u16::from_le_bytes(rest.get(..2)?.try_into().ok()?) as usize;
                let body = rest.get(2..)?;
                if n > EXACT_MAX || body.len() != n * 8 {
                    return None;
                }
                let hashes: Vec<u64> = body
                    .chunks_exact(8)
                    .filter_map(|c| c.try_into().ok().map(u64::from_le_bytes))
                    .collect();
                hashes
                    .windows(2)
                    .all(|w| w[0] < w[1])
                    .then_some(Sketch::Exact(hashes))
            }
            TAG_DENSE => {
                let registers: [u8; REGISTERS] = rest.try_into().ok()?;
                Some(Sketch::Dense(Box::new(registers)))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(range: std::ops::Range<u64>) -> Sketch {
        let mut s = Sketch::default();
        for i in range {
            s.insert(who(None, &format!("user-{i}")));
        }
        s
    }

    #[test]
    fn small_sets_are_exact() {
        for n in [0, 1, 2, 17, EXACT_MAX as u64] {
            let s = of(0..n);
            assert!(matches!(s, Sketch::Exact(_)));
            assert_eq!(s.estimate(), n);
        }
        // Repeats count once; a person's uuid is not their distinct id's hash.
        let mut s = of(0..10);
        s.merge(&of(5..15));
        assert_eq!(s.estimate(), 15);
        let p = Uuid::from_u128(7);
        assert_ne!(who(Some(p), "d"), who(None, "d"));
        assert_eq!(who(Some(p), "d"), who(Some(p), "e"));
    }

    /// The relative error at known cardinalities stays within three standard errors
    /// (3 x 3.3%), and is printed for the documentation's figure.
    #[test]
    fn estimates_are_close_at_known_cardinalities() {
        let mut worst = 0.0f64;
        for n in [129u64, 500, 1_000, 3_000, 10_000, 100_000, 1_000_000] {
            let e = of(0..n).estimate() as f64;
            let error = (e - n as f64) / n as f64;
            eprintln!("n={n} estimate={e} error={:+.2}%", error * 100.0);
            assert!(error.abs() < 0.10, "n={n} estimate={e}");
            worst = worst.max(error.abs());
        }
        assert!(worst > 0.0, "dense sketches estimate");
    }

    #[test]
    fn merged_hours_estimate_the_union() {
        // 24 hours of 1,000 persons each, half of them the same every hour.
        let mut day = Sketch::default();
        for hour in 0..24u64 {
            let mut h = of(0..500);
            h.merge(&of(10_000 + hour * 500..10_000 + hour * 500 + 500));
            day.merge(&h);
        }
        let n = 500.0 + 24.0 * 500.0;
        let e = day.estimate() as f64;
        assert!(((e - n) / n).abs() < 0.10, "estimate {e} of {n}");
        let mut direct = of(0..500);
        direct.merge(&of(10_000..22_000));
        assert_eq!(direct, day, "merging is the union, in any order");
    }

    #[test]
    fn encoding_round_trips_and_refuses_damage() {
        for s in [of(0..0), of(0..40), of(0..5_000)] {
            let mut bytes = Vec::new();
            s.encode(&mut bytes);
            assert_eq!(Sketch::decode(&bytes), Some(s.clone()));
            assert_eq!(
                Sketch::decode(&bytes[..bytes.len().saturating_sub(1)]),
                None
            );
        }
        let mut unsorted = vec![TAG_EXACT, 2, 0];
        unsorted.extend_from_slice(&9u64.to_le_bytes());
        unsorted.extend_from_slice(&3u64.to_le_bytes());
        assert_eq!(Sketch::decode(&unsorted), None);
        assert_eq!(Sketch::decode(&[7]), None);
    }
}
