//! The blocks a read names, newest first and lazily ([`Newest`]): a page stops after
//! the few blocks it needs, however many blocks the question names. Each part of the
//! index gives a stream of its blocks in read order (by newest time, then id,
//! descending): a part naming few blocks lists them, sorted; a run in which the key
//! names a good share of the blocks ([`WALK_SHARE`]) is walked in its table's time
//! order instead, passing over the blocks the key does not name by one bit each. So a
//! name in every block costs its page of blocks plus a bit per block of the key's
//! entry, not a sorted list of every block, and a name that stopped being sent long
//! ago costs a walk of bits down to its newest block, not a read of every block
//! above it. The streams are merged by their heads.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;

use super::run::{BlockRef, Run};

/// A run is walked rather than listed when the key names at least one in this many of
/// its blocks: a walk costs a bit test for each block it passes, a list a sort of the
/// key's blocks, so the walk is cheaper once the key is in more than about one block
/// in the logarithm of their count, and the walk stops at the page's end.
pub const WALK_SHARE: usize = 8;

/// Which blocks a read may need: those of a project with an event from `oldest` to
/// `newest` (both included; no upper bound when None).
#[derive(Debug, Clone, Copy)]
pub struct Range {
    pub project: u64,
    pub oldest: i64,
    pub newest: Option<i64>,
}

impl Range {
    fn holds(&self, b: &BlockRef) -> bool {
        b.project == self.project
            && b.newest >= self.oldest
            && self.newest.is_none_or(|n| b.oldest <= n)
    }
}

/// Block ids as bits, from the lowest id a run names.
#[derive(Clone)]
pub struct Bits {
    base: u64,
    words: Vec<u64>,
}

impl Bits {
    /// Room for the ids of `blocks` (ascending by id); None when they are so sparse
    /// that the bits would take more than a word a block.
    pub fn over(blocks: &[BlockRef]) -> Option<Bits> {
        let (base, top) = match (blocks.first(), blocks.last()) {
            (Some(f), Some(l)) => (f.id, l.id),
            _ => (0, 0),
        };
        let words = usize::try_from((top - base) / 64 + 1).ok()?;
        (words <= blocks.len().max(1)).then(|| Bits {
            base,
            words: vec![0; words],
        })
    }

    /// An id outside the room is not kept: no block of the run has it.
    pub fn set(&mut self, id: u64) {
        let Some(at) = id.checked_sub(self.base) else {
            return;
        };
        if let Some(w) = usize::try_from(at / 64)
            .ok()
            .and_then(|w| self.words.get_mut(w))
        {
            *w |= 1 << (at % 64);
        }
    }

    fn has(&self, id: u64) -> bool {
        let Some(at) = id.checked_sub(self.base) else {
            return false;
        };
        usize::try_from(at / 64)
            .ok()
            .and_then(|w| self.words.get(w))
            .is_some_and(|w| w & (1 << (at % 64)) != 0)
    }
}

/// One part's blocks, in read order.
#[derive(Clone)]
pub enum Stream {
    /// Sorted oldest first; taken from the end.
    Listed(Vec<BlockRef>),
    /// A run's table walked in time order from `at`, keeping the blocks `named`.
    Walk {
        run: Arc<Run>,
        named: Bits,
        at: usize,
    },
}

impl Stream {
    /// The blocks `blocks` in `range`, listed.
    pub fn listed(mut blocks: Vec<BlockRef>, range: &Range) -> Stream {
        blocks.retain(|b| range.holds(b));
        blocks.sort_unstable_by_key(|b| (b.newest, b.id));
        Stream::Listed(blocks)
    }

    /// `run`'s blocks `named` in `range`, walked.
    pub fn walk(run: Arc<Run>, named: Bits, range: &Range) -> Stream {
        let at = run.by_newest().start(&run.blocks, range.newest);
        Stream::Walk { run, named, at }
    }

    fn next(&mut self, range: &Range) -> Option<BlockRef> {
        match self {
            Stream::Listed(blocks) => blocks.pop(),
            Stream::Walk { run, named, at } => {
                let order = &run.by_newest().order;
                while let Some(&i) = order.get(*at) {
                    *at += 1;
                    let b = run.blocks[i as usize];
                    if b.newest < range.oldest {
                        // Every block after it is older still.
                        *at = order.len();
                        return None;
                    }
                    if named.has(b.id) && range.holds(&b) {
                        return Some(b);
                    }
                }
                None
            }
        }
    }
}

/// A stream's next block, ordered by place in the read order.
struct Head {
    block: BlockRef,
    stream: usize,
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Head {}

impl Ord for Head {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.block.newest, self.block.id, other.stream).cmp(&(
            other.block.newest,
            other.block.id,
            self.stream,
        ))
    }
}

impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The blocks that answer a read, newest first, each once (a block two parts name,
/// after a crash had it indexed twice, comes out of both in a row).
pub struct Newest {
    range: Range,
    streams: Vec<Stream>,
    heads: BinaryHeap<Head>,
    /// The id taken last.
    last: Option<u64>,
}

impl Newest {
    pub fn new(range: Range, mut streams: Vec<Stream>) -> Newest {
        let mut heads = BinaryHeap::with_capacity(streams.len());
        for (i, s) in streams.iter_mut().enumerate() {
            if let Some(block) = s.next(&range) {
                heads.push(Head { block, stream: i });
            }
        }
        Newest {
            range,
            streams,
            heads,
            last: None,
        }
    }

    /// The next block, without taking it.
    pub fn peek(&self) -> Option<&BlockRef> {
        self.heads.peek().map(|h| &h.block)
    }

    pub fn pop(&mut self) -> Option<BlockRef> {
        loop {
            let Head { block, stream } = self.heads.pop()?;
            if let Some(next) = self.streams[stream].next(&self.range) {
                self.heads.push(Head {
                    block: next,
                    stream,
                });
            }
            if self.last.replace(block.id) != Some(block.id) {
                return Some(block);
            }
        }
    }

    /// How many parts were walked and how many listed.
    #[cfg(test)]
    pub fn ways(&self) -> (usize, usize) {
        let walked = self
            .streams
            .iter()
            .filter(|s| matches!(s, Stream::Walk { .. }))
            .count();
        (walked, self.streams.len() - walked)
    }

    /// How many blocks are left to take (counted on a copy).
    #[cfg(test)]
    pub fn count(&self) -> usize {
        let mut copy = Newest {
            range: self.range,
            streams: self.streams.clone(),
            heads: self
                .heads
                .iter()
                .map(|h| Head {
                    block: h.block,
                    stream: h.stream,
                })
                .collect(),
            last: self.last,
        };
        std::iter::from_fn(|| copy.pop()).count()
    }
}
