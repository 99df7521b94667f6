//! Reading a chunk: whole log entries (routing each record to be applied now, to the
//! historical lane, to the overflow lane if its distinct id is spiking, or to the
//! quarantine if it does not decode), or a few records of a slower lane.

use sled::IVec;

use super::overflow::Limiter;
use crate::log::{self, record::decode_frame, Record};

/// Log records per realtime step: large enough to amortise a transaction, small
/// enough that one step stays in the low milliseconds.
const REALTIME_CHUNK: usize = 1024;
/// Records per step from each slower lane: they progress even while realtime is
/// saturated, at a quarter of its pace.
const LANE_CHUNK: usize = 256;

/// Which tree a chunk was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    Log,
    Historical,
    Overflow,
}

/// What happens to one record of a chunk. The slower lanes and the quarantine keep
/// the record's bytes.
pub(super) enum Action {
    Apply(Box<Record>),
    ToHistorical(Vec<u8>),
    ToOverflow(Vec<u8>),
    Quarantine(Vec<u8>),
}

pub(super) struct Item {
    /// The record's key in a lane tree: its log entry's sequence number, then its
    /// index in the entry, so lanes keep log order.
    pub(super) lane_key: [u8; 12],
    pub(super) action: Action,
}

/// Records read from the log or a lane tree, and what to remove or advance once they
/// are applied.
#[derive(Default)]
pub(super) struct Chunk {
    /// Keys to remove from the tree read (a lane, or the log tree of earlier versions).
    pub(super) consumed: Vec<IVec>,
    /// The first and last log entries in the chunk: where to read again if it
    /// fails, and the checkpoint if it is applied.
    pub(super) first_seq: Option<u64>,
    pub(super) last_seq: Option<u64>,
    pub(super) items: Vec<Item>,
}

impl Chunk {
    pub(super) fn is_empty(&self) -> bool {
        self.consumed.is_empty() && self.last_seq.is_none()
    }
}

fn lane_key(entry: &[u8], index: usize) -> [u8; 12] {
    let mut k = [0u8; 12];
    let n = entry.len().min(8);
    k[..n].copy_from_slice(&entry[..n]);
    k[8..].copy_from_slice(&(index as u32).to_be_bytes());
    k
}

/// The log's reading end: the reader, the overflow limiter that routes what it reads,
/// and the arrival of the last record read.
pub(super) struct Intake {
    pub(super) log: log::Reader,
    /// Arrival time of the last record read from the log, for the lag.
    pub(super) last_received: Option<i64>,
    pub(super) limiter: Limiter,
    /// The limiter's keys of an entry's records, kept for the next entry.
    pub(super) keys: Vec<u64>,
}

impl Intake {
    /// Whole log entries, up to about [`REALTIME_CHUNK`] records, each routed: its own
    /// lane if historical, overflow if its distinct id is spiking, else applied now.
    /// Entries left in `wal`, the log tree of an earlier version, come first.
    pub(super) fn read(&mut self, wal: &sled::Tree) -> Result<Chunk, sled::Error> {
        let mut chunk = Chunk::default();
        for entry in wal.iter() {
            let (key, value) = entry?;
            self.route_entry(&mut chunk, &key, &value);
            chunk.consumed.push(key);
            if chunk.items.len() >= REALTIME_CHUNK {
                return Ok(chunk);
            }
        }
        if !chunk.is_empty() {
            return Ok(chunk);
        }
        self.read_files()
    }

    /// [`Intake::read`] from the log's files only.
    pub(super) fn read_files(&mut self) -> Result<Chunk, sled::Error> {
        let mut chunk = Chunk::default();
        let mut records = 0usize;
        let entries = self
            .log
            .next_entries(|entry| {
                records += log::record::frame_len(&entry.bytes).unwrap_or(1);
                records >= REALTIME_CHUNK
            })
            .map_err(io)?;
        for entry in entries {
            let key = entry.seq.to_be_bytes();
            if entry.intact {
                self.route_entry(&mut chunk, &key, &entry.bytes);
            } else {
                chunk.items.push(Item {
                    lane_key: lane_key(&key, 0),
                    action: Action::Quarantine(entry.bytes),
                });
            }
            chunk.first_seq.get_or_insert(entry.seq);
            chunk.last_seq = Some(entry.seq);
        }
        Ok(chunk)
    }

    /// Decode one log entry into the chunk's items.
    fn route_entry(&mut self, chunk: &mut Chunk, key: &[u8], value: &[u8]) {
        let Ok(records) = decode_frame(value) else {
            chunk.items.push(Item {
                lane_key: lane_key(key, 0),
                action: Action::Quarantine(value.to_vec()),
            });
            return;
        };
        // The entry's records decoded first, then their buckets looked up together
        // (Limiter::warm), then routed in order.
        let first = chunk.items.len();
        let mut keys = std::mem::take(&mut self.keys);
        keys.clear();
        for (index, bytes) in records.iter().enumerate() {
            let action = decode(bytes);
            if let Action::Apply(r) = &action {
                self.last_received = Some(r.received_at);
                if !r.historical {
                    keys.push(self.limiter.key(r.project, &r.distinct_id));
                }
            }
            chunk.items.push(Item {
                lane_key: lane_key(key, index),
                action,
            });
        }
        std::hint::black_box(self.limiter.warm(&keys));
        let mut keys_in_order = keys.iter();
        for (item, bytes) in chunk.items[first..].iter_mut().zip(&records) {
            let Action::Apply(r) = &item.action else {
                continue;
            };
            if r.historical {
                item.action = Action::ToHistorical(bytes.to_vec());
            } else if let Some(&k) = keys_in_order.next() {
                if !self.limiter.take(k, r.received_at) {
                    item.action = Action::ToOverflow(bytes.to_vec());
                }
            }
        }
        self.keys = keys;
    }
}

fn decode(value: &[u8]) -> Action {
    match Record::decode(value) {
        Ok(r) => Action::Apply(Box::new(r)),
        Err(_) => Action::Quarantine(value.to_vec()),
    }
}

/// Up to [`LANE_CHUNK`] records of a slower lane, in order.
pub(super) fn read_lane(tree: &sled::Tree) -> Result<Chunk, sled::Error> {
    let mut chunk = Chunk::default();
    for entry in tree.iter().take(LANE_CHUNK) {
        let (key, value) = entry?;
        // Lane keys are already (entry, index); keep them for the quarantine.
        let mut lane_key = [0u8; 12];
        let n = key.len().min(12);
        lane_key[..n].copy_from_slice(&key[..n]);
        chunk.items.push(Item {
            lane_key,
            action: decode(&value),
        });
        chunk.consumed.push(key);
    }
    Ok(chunk)
}

/// A log file error, as the storage error a step returns.
pub(super) fn io(e: std::io::Error) -> sled::Error {
    sled::Error::Io(e)
}
