//! The blocks a read names, newest first and lazily ([`Newest`]): a page stops after
//! the few blocks it needs, however many blocks the question names. Each part of the
//! index gives a stream of its blocks in read order (by newest time, then id,
//! descending): the recent parts and a run naming few blocks for a person list them,
//! sorted; a run answers a name (and a person in many of its blocks) with the key's
//! places in its read order ([`Places`]), taken from where the read's range starts.
//! So a page of a name costs its own few blocks a run, whether the name is in every
//! block or stopped being sent long ago, not a sorted list or a walk of every block.
//! The streams are merged by their heads.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;

use super::names::Places;
use super::run::{BlockRef, Run};

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

/// One part's blocks, in read order.
#[derive(Clone)]
pub enum Stream {
    /// Sorted oldest first; taken from the end.
    Listed(Vec<BlockRef>),
    /// A run's blocks at `places` in its read order, from the place `at` on.
    Places {
        run: Arc<Run>,
        places: Arc<Places>,
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

    /// `run`'s blocks at `places` in `range`, from the first that may be in it.
    pub fn places(run: Arc<Run>, places: Arc<Places>, range: &Range) -> Stream {
        let at = run.by_newest().start(&run.blocks, range.newest);
        Stream::Places { run, places, at }
    }

    fn next(&mut self, range: &Range) -> Option<BlockRef> {
        match self {
            Stream::Listed(blocks) => blocks.pop(),
            Stream::Places { run, places, at } => {
                let order = &run.by_newest().order;
                while let Some(place) = places.next_from(*at) {
                    *at = place + 1;
                    let row = *order.get(place)?;
                    let b = *run.blocks.get(row as usize)?;
                    if b.newest < range.oldest {
                        // Every block after it is older still.
                        *at = order.len();
                        return None;
                    }
                    if range.holds(&b) {
                        return Some(b);
                    }
                }
                *at = order.len();
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

    /// How many parts answered with bits and how many with a list.
    #[cfg(test)]
    pub fn ways(&self) -> (usize, usize) {
        let bits = self
            .streams
            .iter()
            .filter(|s| matches!(s, Stream::Places { places, .. } if places.is_bits()))
            .count();
        (bits, self.streams.len() - bits)
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
