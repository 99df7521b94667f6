//! The bytes shared by the block layouts: a cursor over fixed-width columns, and the
//! packing of the uuids written as text in the properties to their 16 bytes.
//!
//! Version 4 adds varints ([`put_varint`], [`Cursor::varint`]) and uuid columns laid
//! out byte by byte ([`put_uuids`], [`Cursor::uuids`]).
//!
//! Packing ([`pack`]) is reversible for any bytes, not only JSON: a lowercase,
//! hyphenated uuid between two `"` becomes [`UUID`] and its 16 bytes, and the bytes
//! [`UUID`] and [`LITERAL`] themselves (which compact JSON never holds: control
//! characters are escaped inside strings) are kept as [`LITERAL`] and the byte.

use uuid::Uuid;

/// A quoted uuid's 16 bytes follow.
const UUID: u8 = 0x01;
/// The byte that follows stands for itself.
const LITERAL: u8 = 0x02;
/// `"`, 36 characters, `"`.
const QUOTED_UUID_LEN: usize = 38;

/// Reads fixed-width columns off the front of a body.
pub(super) struct Cursor<'a> {
    pub(super) rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub(super) fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        if len > self.rest.len() {
            return None;
        }
        let (head, rest) = self.rest.split_at(len);
        self.rest = rest;
        Some(head)
    }

    /// `n` items of `width` bytes.
    pub(super) fn column(
        &mut self,
        n: usize,
        width: usize,
    ) -> Option<std::slice::ChunksExact<'a, u8>> {
        Some(self.take(n.checked_mul(width)?)?.chunks_exact(width))
    }

    /// A [`put_varint`]; None if cut short or over 64 bits.
    pub(super) fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for (i, &byte) in self.rest.iter().enumerate().take(MAX_VARINT_LEN) {
            let bits = u64::from(byte & 0x7f);
            if i == MAX_VARINT_LEN - 1 && bits > 1 {
                return None;
            }
            v |= bits << (7 * i);
            if byte & 0x80 == 0 {
                self.rest = &self.rest[i + 1..];
                return Some(v);
            }
        }
        None
    }

    /// A varint that must fit in a u32, as a usize (counts, lengths, indexes).
    pub(super) fn small(&mut self) -> Option<usize> {
        usize::try_from(u32::try_from(self.varint()?).ok()?).ok()
    }

    /// A [`put_signed`].
    pub(super) fn signed(&mut self) -> Option<i64> {
        let v = self.varint()?;
        Some((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    /// `n` uuids written by [`put_uuids`], added to `out`.
    pub(super) fn uuids(&mut self, n: usize, out: &mut Vec<[u8; 16]>) -> Option<()> {
        let bytes = self.take(n.checked_mul(16)?)?;
        out.reserve(n);
        for i in 0..n {
            let mut id = [0u8; 16];
            for (b, byte) in id.iter_mut().enumerate() {
                *byte = bytes[b * n + i];
            }
            out.push(id);
        }
        Some(())
    }
}

/// A u64 takes at most this many 7-bit groups.
const MAX_VARINT_LEN: usize = 10;

/// `v` in 7-bit groups, low first, the high bit saying another follows: small counts,
/// lengths and time differences take a byte or two instead of four or eight.
pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// `v` as a varint, zigzagged so that small negative numbers are small too.
pub(super) fn put_signed(out: &mut Vec<u8>, v: i64) {
    put_varint(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// `ids` byte by byte: every first byte, then every second, ...: uuids made at about
/// the same time (version 7) share their first bytes, which then lie side by side.
pub(super) fn put_uuids(out: &mut Vec<u8>, ids: &[[u8; 16]]) {
    for b in 0..16 {
        out.extend(ids.iter().map(|id| id[b]));
    }
}

pub(super) fn le32(b: &[u8]) -> Option<usize> {
    Some(u32::from_le_bytes(b.try_into().ok()?) as usize)
}

/// `text` with its quoted lowercase uuids packed, added to `out` (see the module docs).
pub fn pack(text: &[u8], out: &mut Vec<u8>) {
    let mut at = 0;
    while let Some(found) = memchr::memchr3(b'"', UUID, LITERAL, &text[at..]) {
        let i = at + found;
        out.extend_from_slice(&text[at..i]);
        match text[i] {
            b'"' => match text.get(i..i + QUOTED_UUID_LEN).and_then(quoted_uuid) {
                Some(id) => {
                    out.push(UUID);
                    out.extend_from_slice(id.as_bytes());
                    at = i + QUOTED_UUID_LEN;
                    continue;
                }
                None => out.push(b'"'),
            },
            byte => out.extend_from_slice(&[LITERAL, byte]),
        }
        at = i + 1;
    }
    out.extend_from_slice(&text[at..]);
}

/// The packed `bytes` as they were, added to `out`; None if they are damaged.
pub fn unpack(bytes: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let mut at = 0;
    while let Some(found) = memchr::memchr2(UUID, LITERAL, &bytes[at..]) {
        let i = at + found;
        out.extend_from_slice(&bytes[at..i]);
        if bytes[i] == LITERAL {
            out.push(*bytes.get(i + 1)?);
            at = i + 2;
            continue;
        }
        let id = Uuid::from_slice(bytes.get(i + 1..i + 17)?).ok()?;
        let mut text = [0u8; 36];
        out.push(b'"');
        out.extend_from_slice(id.hyphenated().encode_lower(&mut text).as_bytes());
        out.push(b'"');
        at = i + 17;
    }
    out.extend_from_slice(&bytes[at..]);
    Some(())
}

/// Whether [`unpack`] takes each of the packed items that lie back to back in
/// `region`, which starts at offset `start`, item `i` at `items[i]` (offsets too):
/// one pass over the markers, so a block is checked without unpacking it.
pub fn check_packed(region: &[u8], start: usize, items: &[(u32, u32)]) -> bool {
    let mut item = items.iter().map(|&(_, to)| to as usize - start);
    let mut end = 0;
    let mut at = 0;
    while let Some(found) = memchr::memchr2(UUID, LITERAL, &region[at..]) {
        let i = at + found;
        // The item the marker is in; its payload must be in it too.
        while end <= i {
            match item.next() {
                Some(to) => end = to,
                None => return false,
            }
        }
        at = i + if region[i] == LITERAL { 2 } else { 17 };
        if at > end {
            return false;
        }
    }
    true
}

/// The uuid in `"xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"`, lowercase only, so that
/// unpacking writes back the same text.
pub(super) fn quoted_uuid(quoted: &[u8]) -> Option<Uuid> {
    if quoted.len() != QUOTED_UUID_LEN || quoted[0] != b'"' || quoted[QUOTED_UUID_LEN - 1] != b'"' {
        return None;
    }
    bare_uuid(&quoted[1..QUOTED_UUID_LEN - 1])
}

/// The uuid in `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lowercase only. Every value of
/// every block is tried, so the digits are read by table, not one test at a time.
pub(super) fn bare_uuid(text: &[u8]) -> Option<Uuid> {
    let text: &[u8; QUOTED_UUID_LEN - 2] = text.try_into().ok()?;
    if [8, 13, 18, 23].iter().any(|&i| text[i] != b'-') {
        return None;
    }
    // Where each byte's two digits start, past the dashes.
    const AT: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];
    let mut bytes = [0u8; 16];
    let mut bad = 0;
    for (b, &at) in bytes.iter_mut().zip(&AT) {
        let (hi, lo) = (HEX[usize::from(text[at])], HEX[usize::from(text[at + 1])]);
        bad |= hi | lo;
        *b = (hi << 4) | (lo & 0x0f);
    }
    (bad & 0xf0 == 0).then(|| Uuid::from_bytes(bytes))
}

/// Each byte's value as a lowercase hex digit, or 0xff.
const HEX: [u8; 256] = {
    let mut t = [0xff; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(text: &[u8]) -> Vec<u8> {
        let mut packed = Vec::new();
        pack(text, &mut packed);
        let mut back = Vec::new();
        unpack(&packed, &mut back).unwrap();
        assert_eq!(back, text, "{}", String::from_utf8_lossy(text));
        packed
    }

    #[test]
    fn quoted_lowercase_uuids_pack_to_their_bytes() {
        let id = "01a216c2-1c6c-7536-a8b3-bcbfd45bc4b1";
        let json = format!(r#"{{"$device_id":"{id}","n":1}}"#);
        let packed = round_trip(json.as_bytes());
        let mut want = br#"{"$device_id":"#.to_vec();
        want.push(UUID);
        want.extend_from_slice(Uuid::parse_str(id).unwrap().as_bytes());
        want.extend_from_slice(br#","n":1}"#);
        assert_eq!(packed, want);
        assert_eq!(packed.len(), json.len() - 21);
    }

    #[test]
    fn anything_else_is_kept_as_it_is() {
        let upper = r#"{"a":"01A216C2-1C6C-7536-A8B3-BCBFD45BC4B1"}"#;
        assert_eq!(round_trip(upper.as_bytes()), upper.as_bytes());
        for text in [
            &br#"{"a":"01a216c2-1c6c-7536-a8b3-bcbfd45bc4b"}"#[..],
            br#"{"a":"01a216c2-1c6c-7536-a8b3-bcbfd45bc4b12"}"#,
            br#"{"a":"01a216c2x1c6c-7536-a8b3-bcbfd45bc4b1"}"#,
            br#"{"a":"01a216c2-1c6c-7536-a8b3-bcbfd45bc4g1"}"#,
            br#""01a216c2-1c6c-7536-a8b3-bcbfd45bc4b1"#,
            b"",
            b"\"",
        ] {
            assert_eq!(round_trip(text), text);
        }
        // The marker bytes themselves, alone, at the end, before a uuid.
        let id = "\"01a216c2-1c6c-7536-a8b3-bcbfd45bc4b1\"";
        let tricky = [
            b"\x01".to_vec(),
            b"\x02\x02".to_vec(),
            id.as_bytes().to_vec(),
            b"\x01".to_vec(),
        ]
        .concat();
        let packed = round_trip(&tricky);
        assert_eq!(&packed[..5], [LITERAL, UUID, LITERAL, LITERAL, LITERAL]);
        assert_eq!(packed[5], LITERAL);
        assert_eq!(packed[6], UUID);
        assert_eq!(packed.len(), 2 + 4 + 17 + 2);
        // Two uuids back to back share no quote: the second is not packed.
        let two = format!("{id}{}", &id[1..]);
        assert_eq!(round_trip(two.as_bytes()).len(), 17 + 37);
    }

    #[test]
    fn check_packed_says_what_unpack_would() {
        let id = [UUID]
            .iter()
            .chain(&[7u8; 16])
            .copied()
            .collect::<Vec<u8>>();
        let pieces: [&[u8]; 6] = [b"ab", &[LITERAL, UUID], &id, &[LITERAL], &[UUID, 1, 2], b""];
        // Every run of four pieces, cut into items every way three cuts allow.
        for a in 0..pieces.len() {
            for b in 0..pieces.len() {
                let region = [pieces[a], pieces[b], pieces[(a + b) % 6], b"x"].concat();
                for cut in 0..region.len() {
                    for cut2 in cut..=region.len() {
                        let ends = [cut, cut2, region.len()];
                        let mut from = 0;
                        let mut items = Vec::new();
                        let mut each = true;
                        for &to in &ends {
                            each &= unpack(&region[from..to], &mut Vec::new()).is_some();
                            items.push((100 + from as u32, 100 + to as u32));
                            from = to;
                        }
                        assert_eq!(
                            check_packed(&region, 100, &items),
                            each,
                            "{region:?} {ends:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn damaged_packing_is_refused() {
        let mut out = Vec::new();
        assert_eq!(unpack(&[LITERAL], &mut out), None);
        assert_eq!(unpack(&[b'a', UUID, 1, 2, 3], &mut out), None);
    }
}
