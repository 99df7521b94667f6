//! A note of a block of the index a search read: the bytes and trigrams its values
//! hold, and the start and the end its strings share (see [`super`]).

use memchr::memmem;

use super::{split_entry, Sieve};
use crate::store::by_property::CUT;
use crate::store::layered::block_entries;

/// Bits of a [`Noted`] block's trigrams.
const GRAM_BITS: usize = 1024;
/// Bytes of the start and the end its strings share that a [`Noted`] block keeps.
const SHARED_BYTES: usize = 32;

/// What a block's values hold, noted when a search with a sieve first reads it: of
/// every entry of the block whatever its key (a search reads only its own key's, so
/// it is true of them), so one note serves every later search.
pub(super) struct Noted {
    /// Every value is whole with no escape (a sieve judges those by their text) ...
    plain: bool,
    /// ... and a string.
    strings: bool,
    /// The bytes and the trigrams (hashed to [`GRAM_BITS`]) of the values' texts,
    /// ASCII-lowercased as an `icontains` sieve looks for them.
    bytes: [u64; 4],
    grams: [u64; GRAM_BITS / 64],
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

fn has_bit(words: &[u64], bit: usize) -> bool {
    words[bit / 64] & (1 << (bit % 64)) != 0
}

impl Noted {
    pub(super) fn of(raw: &[u8]) -> Noted {
        let mut noted = Noted {
            plain: true,
            strings: true,
            bytes: [0; 4],
            grams: [0; GRAM_BITS / 64],
            start: Shared::of(b"", false),
            end: Shared::of(b"", true),
        };
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
                noted.bytes[usize::from(b / 64)] |= 1 << (b % 64);
                gram = ((gram << 8) | u32::from(b)) & 0xff_ffff;
                if i >= 2 {
                    let bit = gram_bit(gram);
                    noted.grams[bit / 64] |= 1 << (bit % 64);
                }
            }
            if noted.strings {
                let inside = &text[1..text.len() - 1];
                if first {
                    (noted.start, noted.end) =
                        (Shared::of(inside, false), Shared::of(inside, true));
                } else {
                    noted.start.keep(inside, false);
                    noted.end.keep(inside, true);
                }
                first = false;
            }
        }
        noted
    }

    /// Whether no value of the block may pass `sieve`: none holds an `icontains` text
    /// (a byte or a trigram of it is in no value), or every one is a string holding a
    /// `not_icontains` text in the start or the end they share.
    pub(super) fn none_may_pass(&self, sieve: Sieve<'_>) -> bool {
        match sieve {
            Sieve::Holds(text) => {
                let lacks_byte = text.iter().any(|&b| !has_bit(&self.bytes, usize::from(b)));
                let lacks_gram = text.windows(3).any(|w| {
                    let gram = (u32::from(w[0]) << 16) | (u32::from(w[1]) << 8) | u32::from(w[2]);
                    !has_bit(&self.grams, gram_bit(gram))
                });
                self.plain && (lacks_byte || lacks_gram)
            }
            Sieve::Lacks(text) => {
                let shared = |s: &Shared| memmem::find(s.get(), text).is_some();
                self.strings && (shared(&self.start) || shared(&self.end))
            }
        }
    }
}
