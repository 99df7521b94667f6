//! A minimal LZ-String `compressToBase64`, transcribed from lz-string 1.5.0, so the lz64
//! decoder can be checked by round trip. It works on UTF-16 code units like the original,
//! so lone surrogates (which a Rust `String` cannot hold) can be fed to it too.
//!
//! Shared with the main test suite, which checks it against lz-string's own output
//! (`tests/fixtures/lz64_vectors.json`).

use std::collections::{HashMap, HashSet};

const ALPHABET: &[u8; 65] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=";

/// `LZString.compressToBase64` of a string given as UTF-16 code units.
pub fn compress_to_base64(units: &[u16]) -> String {
    let mut out = Bits::default();
    // Single units seen so far, and those not yet written as a literal.
    let mut chars: HashMap<u16, u32> = HashMap::new();
    let mut to_create: HashSet<u16> = HashSet::new();
    // (code of a string, next unit) -> code of the longer string.
    let mut pairs: HashMap<(u32, u16), u32> = HashMap::new();
    let mut dict_size: u32 = 3;
    let mut num_bits: u32 = 2;
    // Compensates for the first entry, which does not count.
    let mut enlarge_in: u64 = 2;
    // The current match: its code, and its unit when it is a single unit.
    let mut w: Option<(u32, Option<u16>)> = None;

    for &c in units {
        let c_code = *chars.entry(c).or_insert_with(|| {
            to_create.insert(c);
            dict_size += 1;
            dict_size - 1
        });
        match w {
            None => w = Some((c_code, Some(c))),
            Some((code, single)) => match pairs.get(&(code, c)) {
                Some(&longer) => w = Some((longer, None)),
                None => {
                    let mut state = (&mut out, &mut to_create, &mut num_bits, &mut enlarge_in);
                    emit((code, single), &mut state);
                    pairs.insert((code, c), dict_size);
                    dict_size += 1;
                    w = Some((c_code, Some(c)));
                }
            },
        }
    }
    if let Some(last) = w {
        emit(
            last,
            &mut (&mut out, &mut to_create, &mut num_bits, &mut enlarge_in),
        );
    }
    out.write(2, num_bits);
    out.finish()
}

/// The output and the coder state writing one match changes.
type State<'a> = (&'a mut Bits, &'a mut HashSet<u16>, &'a mut u32, &'a mut u64);

/// Write the match `w`: as a literal the first time its unit is written, else its code.
fn emit(w: (u32, Option<u16>), state: &mut State<'_>) {
    let (out, to_create, num_bits, enlarge_in) = state;
    match w.1.filter(|c| to_create.contains(c)) {
        Some(c) => {
            if c < 256 {
                out.write(0, **num_bits);
                out.write(u32::from(c), 8);
            } else {
                out.write(1, **num_bits);
                out.write(u32::from(c), 16);
            }
            grow(num_bits, enlarge_in);
            to_create.remove(&c);
        }
        None => out.write(w.0, **num_bits),
    }
    grow(num_bits, enlarge_in);
}

/// One more dictionary entry: widen the codes when the dictionary crosses a power of two.
fn grow(num_bits: &mut u32, enlarge_in: &mut u64) {
    *enlarge_in -= 1;
    if *enlarge_in == 0 {
        *enlarge_in = 1 << *num_bits;
        *num_bits += 1;
    }
}

/// LZ-String's bit packing: each code least significant bit first, six bits per digit,
/// most significant first within a digit.
#[derive(Default)]
struct Bits {
    text: String,
    val: u32,
    position: u32,
}

impl Bits {
    fn write(&mut self, mut value: u32, n: u32) {
        for _ in 0..n {
            self.push_bit(value & 1);
            value >>= 1;
        }
    }

    fn push_bit(&mut self, bit: u32) {
        self.val = (self.val << 1) | bit;
        if self.position == 5 {
            self.position = 0;
            self.text.push(char::from(ALPHABET[self.val as usize]));
            self.val = 0;
        } else {
            self.position += 1;
        }
    }

    fn finish(mut self) -> String {
        // As the original: shift until a digit completes, even if that adds a whole one.
        loop {
            self.val <<= 1;
            if self.position == 5 {
                self.text.push(char::from(ALPHABET[self.val as usize]));
                break;
            }
            self.position += 1;
        }
        let pad = (4 - self.text.len() % 4) % 4;
        self.text.extend(std::iter::repeat_n('=', pad));
        self.text
    }
}
