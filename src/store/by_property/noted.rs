//! A note of a block of the index: the bytes and trigrams its values hold, the bytes
//! and a few trigrams every string holds, and the start and the end its strings share
//! (see [`super`]). Written by the fold beside the block ([`NOTER`]), or made by a
//! search of a run written before notes were.

use memchr::memmem;

use super::{split_entry, Sieve};
use crate::store::by_property::CUT;
use crate::store::layered::{block_entries, Noter};

/// Bits of a [`Noted`] block's trigrams.
const GRAM_BITS: usize = 1024;
/// Bytes of the start and the end its strings share that a [`Noted`] block keeps.
const SHARED_BYTES: usize = 32;
/// Trigrams every string holds that a [`Noted`] block keeps: a `not_icontains` text of
/// up to three bytes that one of them holds is in every string.
const COMMON: usize = 8;
/// Bytes of a note's two parts as stored: what an `icontains` sieve reads (its flags,
/// the bytes and trigrams), and what a `not_icontains` one reads (its flags, the bytes
/// every string holds, the common trigrams: a count, then each, the shared start and
/// end: a length, then their bytes).
const HOLDS_BYTES: usize = 1 + 32 + GRAM_BITS / 8;
const LACKS_BYTES: usize = 1 + 32 + 1 + COMMON * 3 + 2 * (1 + SHARED_BYTES);
/// The part of a note a sieve reads.
pub(super) fn part(sieve: Sieve<'_>) -> usize {
    match sieve {
        Sieve::Holds(_) => 0,
        Sieve::Lacks(_) => 1,
    }
}

/// How the fold notes each block of the index it writes.
pub const NOTER: Noter = Noter {
    parts: &[HOLDS_BYTES as u32, LACKS_BYTES as u32],
    note: |raw, out| {
        let noted = Noted::of(raw);
        noted.put(0, out);
        noted.put(1, out);
    },
};

/// What a block's values hold: of every entry of the block whatever its key (a search
/// reads only its own key's, so it is true of them), so one note serves every search.
pub(super) struct Noted {
    /// Every value is whole with no escape (a sieve judges those by their text) ...
    plain: bool,
    /// ... and a string.
    strings: bool,
    /// The bytes and the trigrams (hashed to [`GRAM_BITS`]) of the values' texts,
    /// ASCII-lowercased as an `icontains` sieve looks for them.
    bytes: [u64; 4],
    grams: [u64; GRAM_BITS / 64],
    /// The bytes every string's text within its quotes holds, as it is (as a
    /// `not_icontains` sieve looks for them), and up to [`COMMON`] of its trigrams.
    every: [u64; 4],
    common: [[u8; 3]; COMMON],
    commons: usize,
    /// The start and the end every string's text within its quotes has, as it is.
    start: Shared,
    end: Shared,
}

/// Up to [`SHARED_BYTES`] bytes that every text of a block starts (or ends) with.
struct Shared {
    bytes: [u8; SHARED_BYTES],
    len: usize,
}

impl Shared {
    fn get(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// `text`'s first bytes, or its last if `end`.
    fn of(text: &[u8], end: bool) -> Shared {
        let len = text.len().min(SHARED_BYTES);
        let mut bytes = [0u8; SHARED_BYTES];
        let kept = if end {
            &text[text.len() - len..]
        } else {
            &text[..len]
        };
        bytes[..len].copy_from_slice(kept);
        Shared { bytes, len }
    }

    /// What of it `text` shares too: its start, or its end if `end`.
    fn keep(&mut self, text: &[u8], end: bool) {
        let kept = self.get();
        let same = match end {
            false => kept.iter().zip(text).take_while(|(a, b)| a == b).count(),
            true => (kept.iter().rev().zip(text.iter().rev()))
                .take_while(|(a, b)| a == b)
                .count(),
        };
        if end {
            self.bytes.copy_within(self.len - same..self.len, 0);
        }
        self.len = same;
    }
}

/// The bit of a trigram (its three bytes in a word's low ones).
fn gram_bit(gram: u32) -> usize {
    (gram.wrapping_mul(0x9E37_79B1) >> (32 - GRAM_BITS.trailing_zeros())) as usize
}

fn set_bit(words: &mut [u64], bit: usize) {
    words[bit / 64] |= 1 << (bit % 64);
}

impl Noted {
    pub(super) fn of(raw: &[u8]) -> Noted {
        let mut noted = Noted {
            plain: true,
            strings: true,
            bytes: [0; 4],
            grams: [0; GRAM_BITS / 64],
            every: [0; 4],
            common: [[0; 3]; COMMON],
            commons: 0,
            start: Shared::of(b"", false),
            end: Shared::of(b"", true),
        };
        let mut common = Vec::new();
        let mut first = true;
        for (_, k, v) in block_entries(raw) {
            // Every entry, as a search of its key splits it.
            let Some((text, _)) = (k.get(8..).and_then(|r| r.split_first()))
                .and_then(|(&len, rest)| split_entry(rest.get(len as usize..)?))
            else {
                continue;
            };
            noted.plain &= v != CUT && memchr::memchr(b'\\', text).is_none();
            noted.strings &= noted.plain && text.len() >= 2 && text[0] == b'"';
            let mut gram = 0u32;
            for (i, b) in text.iter().map(u8::to_ascii_lowercase).enumerate() {
                set_bit(&mut noted.bytes, usize::from(b));
                gram = ((gram << 8) | u32::from(b)) & 0xff_ffff;
                if i >= 2 {
                    set_bit(&mut noted.grams, gram_bit(gram));
                }
            }
            if noted.strings {
                noted.string(&text[1..text.len() - 1], first, &mut common);
                first = false;
            }
        }
        noted.commons = common.len().min(COMMON);
        noted.common[..noted.commons].copy_from_slice(&common[..noted.commons]);
        noted
    }

    /// Keep of the string `inside` (its text within its quotes) what every string holds,
    /// its trigrams in `common`.
    fn string(&mut self, inside: &[u8], first: bool, common: &mut Vec<[u8; 3]>) {
        let mut bytes = [0u64; 4];
        for &b in inside {
            set_bit(&mut bytes, usize::from(b));
        }
        if first {
            (self.start, self.end) = (Shared::of(inside, false), Shared::of(inside, true));
            self.every = bytes;
            for w in inside.windows(3) {
                let gram = [w[0], w[1], w[2]];
                if !common.contains(&gram) {
                    common.push(gram);
                }
            }
            return;
        }
        self.start.keep(inside, false);
        self.end.keep(inside, true);
        for (e, b) in self.every.iter_mut().zip(bytes) {
            *e &= b;
        }
        common.retain(|g| inside.windows(3).any(|w| w == g));
    }

    /// Append part `part` of the note as stored (see [`NOTER`]).
    pub(super) fn put(&self, part: usize, out: &mut Vec<u8>) {
        out.push(u8::from(self.plain) | u8::from(self.strings) << 1);
        let words = |w: &[u64], out: &mut Vec<u8>| {
            w.iter()
                .for_each(|w| out.extend_from_slice(&w.to_le_bytes()))
        };
        if part == 0 {
            words(&self.bytes, out);
            words(&self.grams, out);
            return;
        }
        words(&self.every, out);
        out.push(self.commons as u8);
        for g in &self.common {
            out.extend_from_slice(g);
        }
        for s in [&self.start, &self.end] {
            out.push(s.len as u8);
            out.extend_from_slice(&s.bytes);
        }
    }
}

/// Whether no value of a block may pass `sieve`, given the part of the block's note the
/// sieve reads as [`Noted::put`] stored it (read in place: a search reads the notes of
/// every block of its key): none holds an `icontains` text (a byte or a trigram of it
/// is in no value), or every one is a string holding a `not_icontains` text (a byte or
/// trigram every one holds, or in the start or the end they share). A part of another
/// length tells nothing.
pub(super) fn none_may_pass(sieve: Sieve<'_>, stored: &[u8]) -> bool {
    let bit = |at: usize, bit: usize| stored[at + bit / 8] >> (bit % 8) & 1 != 0;
    let flags = stored.first().copied().unwrap_or(0);
    match sieve {
        Sieve::Holds(text) if stored.len() == HOLDS_BYTES => {
            let lacks_byte = text.iter().any(|&b| !bit(1, usize::from(b)));
            let lacks_gram = text.windows(3).any(|w| {
                let gram = (u32::from(w[0]) << 16) | (u32::from(w[1]) << 8) | u32::from(w[2]);
                !bit(33, gram_bit(gram))
            });
            flags & 1 != 0 && (lacks_byte || lacks_gram)
        }
        Sieve::Lacks(text) if stored.len() == LACKS_BYTES => {
            let (commons, start) = (34, 34 + COMMON * 3);
            let every = match text {
                [b] => bit(1, usize::from(*b)),
                [_, _] | [_, _, _] => {
                    let n = usize::from(stored[33]).min(COMMON);
                    (stored[commons..commons + n * 3].chunks_exact(3))
                        .any(|g| memmem::find(g, text).is_some())
                }
                _ => false,
            };
            let shared = |at: usize| {
                let len = usize::from(stored[at]).min(SHARED_BYTES);
                memmem::find(&stored[at + 1..at + 1 + len], text).is_some()
            };
            flags & 2 != 0 && (every || shared(start) || shared(start + 1 + SHARED_BYTES))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block of entries of key "k" in project 1, each value's text as given.
    fn block(texts: &[&str]) -> Vec<u8> {
        let mut raw = Vec::new();
        for (i, t) in texts.iter().enumerate() {
            let mut k = 1u64.to_be_bytes().to_vec();
            k.extend_from_slice(&[1, b'k', t.len() as u8]);
            k.extend_from_slice(t.as_bytes());
            k.extend_from_slice(&[i as u8; 24]);
            raw.extend_from_slice(&(k.len() as u32).to_le_bytes());
            raw.extend_from_slice(&1u32.to_le_bytes());
            raw.extend_from_slice(&k);
            raw.push(1);
        }
        raw
    }

    #[test]
    fn a_stored_note_reads_back_and_answers_as_made() {
        let raw = block(&["\"ann@acme.io\"", "\"bo@x.acme.io\"", "\"cy@acme.io.uk\""]);
        let mut stored = Vec::new();
        (NOTER.note)(&raw, &mut stored);
        assert_eq!(stored.len(), HOLDS_BYTES + LACKS_BYTES);
        let (holding, lacking) = stored.split_at(HOLDS_BYTES);
        let lacks: [&[u8]; 9] = [
            b"@", b"c", b"acm", b"me", b".io", b"n", b"io.u", b"a", b"@a",
        ];
        let every = [true, true, true, true, true, false, false, true, false];
        for (text, every) in lacks.iter().zip(every) {
            let got = none_may_pass(Sieve::Lacks(text), lacking);
            assert_eq!(got, every, "{}", String::from_utf8_lossy(text));
            assert!(!none_may_pass(Sieve::Lacks(text), holding));
        }
        let holds: [&[u8]; 4] = [b"ann", b"zz", b"acme", b"@acm"];
        for (text, none) in holds.iter().zip([false, true, false, false]) {
            assert_eq!(none_may_pass(Sieve::Holds(text), holding), none);
            assert!(!none_may_pass(Sieve::Holds(text), lacking));
        }
        // Neither part tells anything of a block with a value not a string.
        let mut mixed = Vec::new();
        (NOTER.note)(&block(&["\"ann@acme.io\"", "7"]), &mut mixed);
        assert!(!none_may_pass(Sieve::Lacks(b"@"), &mixed[HOLDS_BYTES..]));
    }
}
