//! A block's pointer: where its bytes are in the block files, the value sled's
//! `event_blocks` tree holds under the block's key (see [`super::files`]). Fixed width,
//! tagged so a tree value tells a pointer from a block stored inline by an older
//! database.

/// A tree value holding a pointer instead of a block starts with this byte.
pub const TAG: u8 = 0xB0;
/// tag, event count, file, offset, length, CRC-32 of the bytes.
pub const POINTER_LEN: usize = 1 + 4 + 4 + 8 + 4 + 4;

/// Where a block's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pointer {
    pub count: u32,
    pub file: u32,
    pub offset: u64,
    pub len: u32,
    pub crc: u32,
}

impl Pointer {
    pub fn encode(&self) -> [u8; POINTER_LEN] {
        let mut out = [0u8; POINTER_LEN];
        out[0] = TAG;
        out[1..5].copy_from_slice(&self.count.to_le_bytes());
        out[5..9].copy_from_slice(&self.file.to_le_bytes());
        out[9..17].copy_from_slice(&self.offset.to_le_bytes());
        out[17..21].copy_from_slice(&self.len.to_le_bytes());
        out[21..25].copy_from_slice(&self.crc.to_le_bytes());
        out
    }

    /// `None` for a value that is not a whole pointer.
    pub fn decode(value: &[u8]) -> Option<Pointer> {
        if value.len() != POINTER_LEN || value[0] != TAG {
            return None;
        }
        let u32_at =
            |i: usize| u32::from_le_bytes([value[i], value[i + 1], value[i + 2], value[i + 3]]);
        let mut offset = [0u8; 8];
        offset.copy_from_slice(&value[9..17]);
        Some(Pointer {
            count: u32_at(1),
            file: u32_at(5),
            offset: u64::from_le_bytes(offset),
            len: u32_at(17),
            crc: u32_at(21),
        })
    }
}
