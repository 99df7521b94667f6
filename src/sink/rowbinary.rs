//! ClickHouse's RowBinary input format, written by hand: each row is its columns'
//! values back to back in the order the INSERT names them, with no framing. It is the
//! cheapest format for the server to parse (no text to scan, no escaping), and every
//! server version since 1.1 reads it, 18.16 included.
//!
//! Encodings (all little-endian): integers at their width; `String` as a LEB128
//! length then the bytes; `UUID` as two `u64` halves, the high half (the first eight
//! bytes of the canonical form) first, each little-endian; `DateTime` as `u32` Unix
//! seconds; `DateTime64(p)` as `i64` ticks of 10^-p seconds.

use uuid::Uuid;

/// Rows being encoded for one INSERT.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RowBinary {
    buf: Vec<u8>,
}

impl RowBinary {
    pub fn with_capacity(bytes: usize) -> RowBinary {
        RowBinary {
            buf: Vec::with_capacity(bytes),
        }
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    pub fn i8(&mut self, v: i8) {
        self.buf.push(v as u8);
    }

    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// A `String` column: any bytes, length first.
    pub fn string(&mut self, v: &[u8]) {
        self.leb128(v.len() as u64);
        self.buf.extend_from_slice(v);
    }

    pub fn str(&mut self, v: &str) {
        self.string(v.as_bytes());
    }

    /// A `UUID` column. ClickHouse keeps a UUID as a 128-bit integer whose high half
    /// is the canonical form's first eight bytes, and writes each half little-endian.
    pub fn uuid(&mut self, v: Uuid) {
        let n = v.as_u128();
        self.u64((n >> 64) as u64);
        self.u64(n as u64);
    }

    /// A `DateTime` column from Unix milliseconds. The type holds 1970 to 2106 in
    /// whole seconds; times outside are clamped rather than wrapped, so a bad clock
    /// cannot land an event in another century.
    pub fn datetime_ms(&mut self, ms: i64) {
        let secs = ms.div_euclid(1000).clamp(0, u32::MAX as i64) as u32;
        self.buf.extend_from_slice(&secs.to_le_bytes());
    }

    /// A `DateTime64(precision)` column from Unix milliseconds.
    pub fn datetime64_ms(&mut self, ms: i64, precision: u32) {
        let ticks = match precision {
            0..=2 => ms.div_euclid(10i64.pow(3 - precision)),
            _ => ms.saturating_mul(10i64.pow(precision - 3)),
        };
        self.i64(ticks);
    }

    /// Unsigned LEB128: seven bits a byte, low bits first, high bit set on all but
    /// the last.
    fn leb128(&mut self, mut v: u64) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.buf.push(byte);
                return;
            }
            self.buf.push(byte | 0x80);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(f: impl FnOnce(&mut RowBinary)) -> Vec<u8> {
        let mut r = RowBinary::default();
        f(&mut r);
        r.into_bytes()
    }

    #[test]
    fn strings_carry_a_leb128_length() {
        assert_eq!(bytes(|r| r.str("ab")), b"\x02ab");
        assert_eq!(bytes(|r| r.str("")), b"\x00");
        let long = "x".repeat(300);
        let encoded = bytes(|r| r.str(&long));
        // 300 = 0b10_0101100: 0xac (low seven bits, continued), then 0x02.
        assert_eq!(&encoded[..2], &[0xac, 0x02]);
        assert_eq!(encoded.len(), 302);
    }

    /// The bytes 18.16 itself writes for
    /// `SELECT toUUID('61f0c404-5cb3-11e7-907b-a6006ad3dba0') FORMAT RowBinary`.
    #[test]
    fn uuid_halves_as_the_server_writes_them() {
        let id = Uuid::parse_str("61f0c404-5cb3-11e7-907b-a6006ad3dba0").unwrap();
        assert_eq!(
            bytes(|r| r.uuid(id)),
            [
                0xe7, 0x11, 0xb3, 0x5c, 0x04, 0xc4, 0xf0, 0x61, 0xa0, 0xdb, 0xd3, 0x6a, 0x00, 0xa6,
                0x7b, 0x90
            ]
        );
    }

    #[test]
    fn datetimes() {
        // 1700000000 as the server writes `toDateTime(1700000000)`.
        assert_eq!(
            bytes(|r| r.datetime_ms(1_700_000_000_999)),
            [0x00, 0xf1, 0x53, 0x65]
        );
        assert_eq!(bytes(|r| r.datetime_ms(-5)), [0, 0, 0, 0]);
        assert_eq!(bytes(|r| r.datetime_ms(i64::MAX)), [0xff; 4]);
        assert_eq!(
            bytes(|r| r.datetime64_ms(1_700_000_000_123, 6)),
            1_700_000_000_123_000i64.to_le_bytes()
        );
        assert_eq!(
            bytes(|r| r.datetime64_ms(1_700_000_000_123, 3)),
            1_700_000_000_123i64.to_le_bytes()
        );
        assert_eq!(bytes(|r| r.datetime64_ms(-1, 0)), (-1i64).to_le_bytes());
    }
}
