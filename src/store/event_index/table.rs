//! A run's block table ([`BlockRef`]: each block's id, project, newest and oldest
//! time), the varints it and the run's entries are written with, and the table's
//! order by time ([`ByNewest`]), which a read walking a run newest first follows, and
//! each block's place in it.

/// A block a run names: its id, project and its newest and oldest event's times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BlockRef {
    pub id: u64,
    pub project: u64,
    pub newest: i64,
    pub oldest: i64,
}

/// The blocks of `table` (ascending by id) whose ids are in `ids` (ascending), added
/// to `out`. Ids asking for a good share of the table are found in one walk along it
/// rather than a search each.
pub fn resolve(table: &[BlockRef], ids: &[u64], out: &mut Vec<BlockRef>) {
    if ids.len() * 8 < table.len() {
        out.extend(
            ids.iter()
                .filter_map(|&id| table.binary_search_by_key(&id, |b| b.id).ok())
                .map(|i| table[i]),
        );
        return;
    }
    let mut rows = table.iter().peekable();
    for &id in ids {
        while rows.next_if(|b| b.id < id).is_some() {}
        if let Some(b) = rows.next_if(|b| b.id == id) {
            out.push(*b);
        }
    }
}

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The varint at `*at`, moving past it; None past the end or for more than 64 bits.
pub fn get_varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at)?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

pub fn encode_table(blocks: &[BlockRef]) -> Vec<u8> {
    let mut out = Vec::with_capacity(blocks.len() * 6 + 8);
    put_varint(&mut out, blocks.len() as u64);
    let (mut id, mut newest) = (0u64, 0i64);
    for b in blocks {
        put_varint(&mut out, b.id - id);
        put_varint(&mut out, b.project);
        put_varint(&mut out, zigzag(b.newest.wrapping_sub(newest)));
        put_varint(&mut out, zigzag(b.newest.wrapping_sub(b.oldest)));
        (id, newest) = (b.id, b.newest);
    }
    out
}

pub fn decode_table(bytes: &[u8]) -> Option<Vec<BlockRef>> {
    let mut at = 0;
    let n = get_varint(bytes, &mut at)?;
    // Each block takes at least four bytes: a count claiming more is damage.
    if n > bytes.len() as u64 / 4 {
        return None;
    }
    let mut out = Vec::with_capacity(n as usize);
    let (mut id, mut newest) = (0u64, 0i64);
    for _ in 0..n {
        id = id.checked_add(get_varint(bytes, &mut at)?)?;
        let project = get_varint(bytes, &mut at)?;
        newest = newest.wrapping_add(unzigzag(get_varint(bytes, &mut at)?));
        let oldest = newest.wrapping_sub(unzigzag(get_varint(bytes, &mut at)?));
        out.push(BlockRef {
            id,
            project,
            newest,
            oldest,
        });
    }
    Some(out)
}

/// A run's blocks in read order: by newest time, then id, descending, as the `events`
/// tree's keys sort them (within a project); and the widest span of any block, so a
/// read below a time starts at the first block that may reach down to it.
pub struct ByNewest {
    /// Places in the block table, newest first.
    pub order: Vec<u32>,
    /// Each block's place in `order`, by its place in the table.
    pub rank: Vec<u32>,
    /// The largest newest less oldest of the run's blocks.
    pub widest: i64,
}

impl ByNewest {
    /// The order of `blocks` (a run's table, fewer than 2^32 blocks).
    pub fn of(blocks: &[BlockRef]) -> ByNewest {
        let mut order: Vec<u32> = (0..blocks.len() as u32).collect();
        // Blocks are mostly stored in time order, so this is mostly reversing a run.
        order.sort_unstable_by_key(|&i| {
            let b = &blocks[i as usize];
            std::cmp::Reverse((b.newest, b.id))
        });
        let widest = blocks
            .iter()
            .map(|b| b.newest.saturating_sub(b.oldest))
            .max()
            .unwrap_or(0);
        let mut rank = vec![0u32; order.len()];
        for (place, &row) in order.iter().enumerate() {
            rank[row as usize] = place as u32;
        }
        ByNewest {
            order,
            rank,
            widest,
        }
    }

    /// The bytes it holds.
    pub fn bytes(&self) -> usize {
        (self.order.capacity() + self.rank.capacity()) * 4
    }

    /// The first place in `order` whose block may hold an event at or before
    /// `newest`: blocks before it are newer than `newest` by more than any span.
    pub fn start(&self, blocks: &[BlockRef], newest: Option<i64>) -> usize {
        let Some(newest) = newest else {
            return 0;
        };
        let reach = newest.saturating_add(self.widest);
        self.order
            .partition_point(|&i| blocks[i as usize].newest > reach)
    }
}
