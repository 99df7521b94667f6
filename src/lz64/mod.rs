//! Decoder for "lz64" request bodies: LZ-String's `compressToBase64` format.
//!
//! Older posthog-js builds compress event batches with the LZ-String JavaScript
//! library and send the result as base64 text (`compression=lz-string`, often
//! called lz64). It has nothing to do with LZ4: it is an LZW variant that works
//! on UTF-16 code units, packs variable-width codes into 6-bit base64 digits
//! and marks the end of the stream with a dedicated code.
//!
//! # Stream format
//!
//! Each base64 digit contributes six bits, most significant first, and each
//! code is assembled from those bits least significant first. The first code
//! is two bits wide: `0` is followed by an 8-bit literal, `1` by a 16-bit
//! literal, `2` means "empty string". After that, codes start three bits wide:
//! `0`/`1` introduce a new literal (which also becomes a dictionary entry), `2`
//! ends the stream, and anything else refers to a dictionary entry. Each step
//! adds `previous entry + first unit of current entry` to the dictionary, and
//! the code width grows by one bit whenever the dictionary crosses a power of
//! two. A code equal to the next free slot (the classic LZW `KwKwK` case) means
//! `previous + previous[0]`.
//!
//! # Why capped
//!
//! LZW-style formats expand a lot: about 2 KiB of lz64 decodes to 1 MiB of
//! text. This decoder takes a limit on the size of the UTF-8 output and fails
//! with [`Error::TooLarge`] before it writes the unit that would go over it, so a
//! small request can never make the server allocate more than a small multiple
//! of the limit.
//!
//! Memory is O(output). Every dictionary entry is a substring of the output
//! produced so far: a literal is written to the output as soon as it is read,
//! and `previous + current[0]` sits contiguously in the output because the
//! current entry is written right after the previous one. So entries are stored
//! as `(start, len)` ranges into the output buffer instead of owned strings,
//! which also avoids the quadratic copying of a naive implementation.
//!
//! # Behaviour choices
//!
//! * Empty input is [`Error::Empty`] (LZ-String returns `null` for it).
//! * Any byte outside `A-Z a-z 0-9 + / =` is [`Error::InvalidCharacter`],
//!   including whitespace and newlines, wherever it appears. LZ-String silently
//!   reads unknown characters as zero bits, which hides corruption. Callers
//!   that form-decode the body must make sure `+` is not turned into a space.
//! * `=` is accepted anywhere and reads as six zero bits, as in LZ-String
//!   (it is the 65th alphabet entry, value 64).
//! * Running out of input before the end-of-stream code is [`Error::Corrupt`]
//!   (LZ-String returns `""`, which is indistinguishable from a real empty
//!   string). This is stricter than LZ-String in one respect: LZ-String
//!   completes a code that runs past the end of the input with zero bits, so a
//!   truncated body sometimes decodes "successfully" to a prefix of the text.
//!   Here every bit of every code, end marker included, must be present. The
//!   encoder always flushes the end marker into a whole digit, so real output
//!   is unaffected.
//! * Anything after the end-of-stream code (the flush bits, `=` padding) is
//!   ignored, as in LZ-String.
//! * A first code of `3` or a reference beyond the next free dictionary slot is
//!   [`Error::Corrupt`].
//! * UTF-16 is converted to UTF-8; an unpaired surrogate becomes U+FFFD, and the
//!   cap counts the output after that conversion.
//! * Limits above `u32::MAX` bytes are treated as `u32::MAX`, so dictionary
//!   ranges fit in `u32` and the dictionary stays at 8 bytes per entry.

/// Why an lz64 payload could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A byte outside the LZ-String base64 alphabet.
    #[error("lz64 payload contains an invalid character")]
    InvalidCharacter,
    /// A bad dictionary reference, a bad first code, or input that ends
    /// before the end-of-stream marker.
    #[error("lz64 payload is corrupt")]
    Corrupt,
    /// The decoded UTF-8 output would exceed the caller's limit.
    #[error("lz64 payload decompresses to more than the allowed size")]
    TooLarge,
    /// The input was empty.
    #[error("lz64 payload is empty")]
    Empty,
}

/// Decode LZ-String's `compressToBase64` output.
///
/// `input` is the base64 text (alphabet `A-Z a-z 0-9 + /` plus `=` as in
/// LZ-String's `keyStrBase64`, where `=` has value 64). The output is UTF-8:
/// UTF-16 code units are converted and a lone surrogate becomes U+FFFD.
///
/// Fails with [`Error::TooLarge`] as soon as the UTF-8 output would exceed
/// `max_output` bytes, so a tiny "bomb" cannot exhaust memory. See the module
/// documentation for how malformed input is treated.
pub fn decompress_from_base64(input: &[u8], max_output: usize) -> Result<String, Error> {
    if input.is_empty() {
        return Err(Error::Empty);
    }
    // Validate everything up front so the error does not depend on where the
    // end-of-stream code happens to be.
    if input.iter().any(|&b| DIGITS[usize::from(b)] == INVALID) {
        return Err(Error::InvalidCharacter);
    }

    let mut bits = BitReader::new(input);
    let mut out = Output::new(max_output);

    let first = match bits.read(2)? {
        0 => bits.read(8)?,
        1 => bits.read(16)?,
        2 => return Ok(String::new()),
        _ => return Err(Error::Corrupt),
    };
    out.push(first as u16)?;

    // `dict[i]` is code `i + FIRST_CODE`; codes 0..=2 are the control codes.
    let mut dict: Vec<Span> = vec![Span { start: 0, len: 1 }];
    // The previous entry; always the last thing written to `out`.
    let mut prev = Span { start: 0, len: 1 };
    let mut num_bits: u32 = 3;
    // Entries to add before the code width grows.
    let mut enlarge_in: u64 = 4;

    loop {
        let code = bits.read(num_bits)?;
        let start = out.len_u32();
        let entry = match code {
            0 | 1 => {
                let unit = bits.read(if code == 0 { 8 } else { 16 })?;
                out.push(unit as u16)?;
                let entry = Span { start, len: 1 };
                dict.push(entry);
                enlarge_in -= 1;
                if enlarge_in == 0 {
                    enlarge_in = 1 << num_bits;
                    num_bits += 1;
                }
                entry
            }
            2 => return Ok(out.finish()),
            code => {
                let next_free = dict.len() as u64 + FIRST_CODE;
                if code < next_free {
                    let known = dict[(code - FIRST_CODE) as usize];
                    out.append(known)?;
                    Span {
                        start,
                        len: known.len,
                    }
                } else if code == next_free {
                    // KwKwK: the entry being defined is prev + prev[0].
                    out.append(prev)?;
                    out.append(Span {
                        start: prev.start,
                        len: 1,
                    })?;
                    Span {
                        start,
                        len: prev.len + 1,
                    }
                } else {
                    return Err(Error::Corrupt);
                }
            }
        };

        // prev + entry[0]: contiguous, because entry was written right after prev.
        dict.push(Span {
            start: prev.start,
            len: prev.len + 1,
        });
        enlarge_in -= 1;
        if enlarge_in == 0 {
            enlarge_in = 1 << num_bits;
            num_bits += 1;
        }
        // Unreachable in practice: the output limit keeps the dictionary under
        // 2^33 entries, so codes stay far below 64 bits. Checked anyway so that
        // no input can make the shifts above or in `read` overflow.
        if num_bits > MAX_CODE_BITS {
            return Err(Error::TooLarge);
        }
        prev = entry;
    }
}

/// First dictionary code; 0, 1 and 2 are literal-8, literal-16 and end.
const FIRST_CODE: u64 = 3;

/// Upper bound on the code width; see the check in the decode loop.
const MAX_CODE_BITS: u32 = 48;

const INVALID: u8 = 0xFF;

/// Byte -> base64 digit value with its six bits reversed, or `INVALID`.
///
/// LZ-String consumes each digit from its most significant bit and builds
/// codes least significant bit first. Reversing each digit once turns the
/// input into an ordinary LSB-first bit stream that can be read in chunks of
/// up to six bits instead of one bit at a time.
static DIGITS: [u8; 256] = digit_table();

const fn digit_table() -> [u8; 256] {
    const ALPHABET: &[u8; 65] =
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=";
    let mut table = [INVALID; 256];
    let mut i = 0;
    while i < ALPHABET.len() {
        // '=' has value 64, which has no bits in the six that are read.
        let value = (i as u8) & 0x3F;
        table[ALPHABET[i] as usize] = value.reverse_bits() >> 2;
        i += 1;
    }
    table
}

/// LSB-first reader over validated input.
struct BitReader<'a> {
    input: &'a [u8],
    /// Index of the digit currently being consumed.
    index: usize,
    /// Bits of that digit already consumed (0..6).
    offset: u32,
}

impl<'a> BitReader<'a> {
    fn new(input: &'a [u8]) -> Self {
        BitReader {
            input,
            index: 0,
            offset: 0,
        }
    }

    /// Read an `n`-bit code; a code cut off by the end of the input is corrupt.
    fn read(&mut self, n: u32) -> Result<u64, Error> {
        debug_assert!(n <= 64);
        let mut value = 0u64;
        let mut got = 0;
        while got < n {
            let take = (6 - self.offset).min(n - got);
            let digit = match self.input.get(self.index) {
                Some(&b) => DIGITS[usize::from(b)],
                None => return Err(Error::Corrupt),
            };
            let chunk = u64::from(digit >> self.offset) & ((1 << take) - 1);
            value |= chunk << got;
            got += take;
            self.offset += take;
            if self.offset == 6 {
                self.offset = 0;
                self.index += 1;
            }
        }
        Ok(value)
    }
}

/// A dictionary entry: a range of UTF-16 units in the output buffer.
#[derive(Clone, Copy)]
struct Span {
    start: u32,
    len: u32,
}

/// UTF-16 output buffer that tracks the exact UTF-8 size of its contents.
struct Output {
    units: Vec<u16>,
    utf8_len: usize,
    max: usize,
    /// The last unit is a high surrogate that is still unpaired.
    pending_high: bool,
}

impl Output {
    fn new(max_output: usize) -> Self {
        Output {
            units: Vec::new(),
            utf8_len: 0,
            // Every unit costs at least one UTF-8 byte, so this keeps the unit
            // count, and with it every `Span`, within u32.
            max: max_output.min(u32::MAX as usize),
            pending_high: false,
        }
    }

    fn len_u32(&self) -> u32 {
        // Bounded by `max`, which is at most u32::MAX.
        self.units.len() as u32
    }

    /// Add the UTF-8 cost of `unit` following the current contents.
    #[inline]
    fn charge(&mut self, unit: u16) -> Result<(), Error> {
        let cost = match unit {
            0..=0x7F => 1,
            0x80..=0x7FF => 2,
            // Completes a pair: the high half was charged 3 (the cost of a lone
            // surrogate as U+FFFD), a pair is 4 bytes in total.
            0xDC00..=0xDFFF if self.pending_high => 1,
            // Rest of the BMP, or a surrogate that is unpaired so far.
            _ => 3,
        };
        self.pending_high = (0xD800..=0xDBFF).contains(&unit) && cost == 3;
        if cost > self.max - self.utf8_len {
            return Err(Error::TooLarge);
        }
        self.utf8_len += cost;
        Ok(())
    }

    fn push(&mut self, unit: u16) -> Result<(), Error> {
        self.charge(unit)?;
        self.units.push(unit);
        Ok(())
    }

    /// Append a copy of an earlier part of the output.
    fn append(&mut self, span: Span) -> Result<(), Error> {
        let start = span.start as usize;
        let end = start + span.len as usize;
        // Charge before copying so an oversized copy is never allocated.
        for i in start..end {
            self.charge(self.units[i])?;
        }
        self.units.extend_from_within(start..end);
        Ok(())
    }

    fn finish(self) -> String {
        let mut text = String::with_capacity(self.utf8_len);
        text.extend(
            char::decode_utf16(self.units.iter().copied())
                .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER)),
        );
        debug_assert_eq!(text.len(), self.utf8_len);
        text
    }
}

#[cfg(test)]
mod tests;
