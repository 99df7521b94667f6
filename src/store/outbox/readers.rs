//! The outbox's named readers: the ClickHouse sink (`sink`) and edge mode's forwarder
//! (`forward`) read one outbox, each from its own checkpoint, and an entry is removed
//! only once every active reader has passed it. One feed, however many readers: the
//! compactor writes each entry once.
//!
//! The sink keeps the keys it had as the only reader (`c`, `f`), so a database written
//! before readers had names opens unchanged; any other reader's keys are `r` + its
//! name + `/` + what (`c` its checkpoint, anything else its own state). Which readers
//! are active is stored under `a` + name, set at each start from the configuration
//! ([`Outbox::set_readers`]); a database with none recorded has the sink alone, as
//! before. A reader dropped from the configuration stops holding entries back.
//!
//! The sink switched off while the forwarder keeps the feed on would then miss the
//! entries written and passed meanwhile, and unlike a feed switched off entirely, the
//! block ids leave no gap to notice. So when the sink leaves, the first event block it
//! had not sent is noted (`l`), and when it comes back, the blocks from there to the
//! first one the outbox still names are recorded as the gap its backfill sends, with
//! the persons, distinct ids and groups whole again, as after any time off. Any other
//! reader back after a time off starts again from its checkpoint, its own state
//! dropped: what it missed meanwhile is not sent, and nothing still in the outbox is
//! skipped.

use std::convert::Infallible;

use sled::transaction::ConflictableTransactionError;

use super::{
    be64, entry_key, pair, pair_bytes, storage, Entry, Outbox, CHECKPOINT, GAP, HIGHEST, IN_FLIGHT,
};

/// The ClickHouse sink's name; its keys are the outbox's original ones.
pub const SINK: &str = "sink";
/// Edge mode's forwarder's name.
pub const FORWARD: &str = "forward";
/// Prefix of the active readers' keys.
const ACTIVE: u8 = b'a';
/// Prefix of every named reader's keys but the sink's.
const READER: u8 = b'r';
/// The first event block the sink had not sent when it was switched off while
/// another reader kept the feed on.
const SINK_LEFT: &[u8] = b"l";

/// One reader's side of the outbox: its checkpoint and its own state keys.
#[derive(Clone)]
pub struct Reader {
    outbox: Outbox,
    name: String,
}

impl Reader {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// The key of this reader's `what` (`b"c"` is its checkpoint).
    fn key(&self, what: &[u8]) -> Vec<u8> {
        if self.name == SINK {
            return match what {
                b"c" => CHECKPOINT.to_vec(),
                b"f" => IN_FLIGHT.to_vec(),
                other => [b"s/", other].concat(),
            };
        }
        [&[READER], self.name.as_bytes(), b"/", what].concat()
    }

    /// The last seq this reader passed, 0 before the first.
    pub fn checkpoint(&self) -> sled::Result<u64> {
        let v = self.outbox.tree.get(self.key(b"c"))?;
        Ok(v.and_then(|v| be64(&v)).unwrap_or(0))
    }

    /// Entries this reader has not passed yet, in order.
    pub fn entries(&self) -> sled::Result<impl Iterator<Item = sled::Result<Entry>>> {
        self.outbox.entries(Some(self.checkpoint()? + 1))
    }

    /// A state value of this reader's own (`what` is not `c`).
    pub fn get(&self, what: &[u8]) -> sled::Result<Option<sled::IVec>> {
        self.outbox.tree.get(self.key(what))
    }

    pub fn put(&self, what: &[u8], value: &[u8]) -> sled::Result<()> {
        self.outbox.tree.insert(self.key(what), value)?;
        Ok(())
    }

    /// Every state value of this reader whose name starts with `prefix`.
    pub fn scan(&self, prefix: &[u8]) -> sled::Result<Vec<(Vec<u8>, sled::IVec)>> {
        let key = self.key(prefix);
        let skip = key.len() - prefix.len();
        self.outbox
            .tree
            .scan_prefix(&key)
            .map(|kv| kv.map(|(k, v)| (k[skip..].to_vec(), v)))
            .collect()
    }

    /// Move the checkpoint to `to` (never back) and remove the state values named in
    /// `clear`, in one transaction; then remove the entries every active reader has
    /// passed. With `durable`, flushed to disk before returning.
    pub fn advance(&self, to: u64, clear: &[&[u8]], durable: bool) -> sled::Result<()> {
        let checkpoint = self.key(b"c");
        let clear: Vec<Vec<u8>> = clear.iter().map(|w| self.key(w)).collect();
        self.outbox
            .tree
            .transaction(|tx| {
                for k in &clear {
                    tx.remove(k.as_slice())?;
                }
                let current = tx.get(&checkpoint)?.and_then(|v| be64(&v)).unwrap_or(0);
                tx.insert(checkpoint.as_slice(), &current.max(to).to_be_bytes()[..])?;
                Ok::<_, ConflictableTransactionError<Infallible>>(())
            })
            .map_err(storage)?;
        self.outbox.release()?;
        if durable {
            self.outbox.tree.flush()?;
        }
        Ok(())
    }
}

impl Reader {
    /// Back after a time off the readers: the entries it had not passed may be gone,
    /// so its own state, which may name them (the forwarder's windows), goes too, and
    /// it starts again from its checkpoint. What it sent past there goes again.
    fn start_over(&self) -> sled::Result<()> {
        let state = self.scan(b"")?;
        let stale: Vec<&Vec<u8>> = state
            .iter()
            .map(|(k, _)| k)
            .filter(|k| *k != b"c")
            .collect();
        if !stale.is_empty() {
            tracing::info!(
                reader = %self.name,
                "outbox: a reader back after a time off starts again from its checkpoint"
            );
        }
        for what in stale {
            self.outbox.tree.remove(self.key(what))?;
        }
        Ok(())
    }
}

impl Outbox {
    /// The reader called `name` (the sink's is [`SINK`]).
    pub fn reader(&self, name: &str) -> Reader {
        Reader {
            outbox: self.clone(),
            name: name.to_string(),
        }
    }

    /// The names of the active readers; the sink alone when none were ever recorded.
    pub fn readers(&self) -> sled::Result<Vec<String>> {
        let names: Vec<String> = self
            .tree
            .scan_prefix([ACTIVE])
            .keys()
            .map(|k| k.map(|k| String::from_utf8_lossy(&k[1..]).into_owned()))
            .collect::<sled::Result<_>>()?;
        Ok(match names.is_empty() {
            true => vec![SINK.to_string()],
            false => names,
        })
    }

    /// Record which readers are active (at start, from the configuration). A reader
    /// new to the outbox starts at the oldest entry still kept.
    pub fn set_readers(&self, names: &[&str]) -> sled::Result<()> {
        let before = self.readers()?;
        let (was, is) = (before.iter().any(|n| n == SINK), names.contains(&SINK));
        // Only a sink that ran (and so saved its backfill) has a place to resume from.
        if was && !is && !names.is_empty() && self.backfill()?.is_some() {
            let from = self.first_unsent_block()?;
            self.tree.insert(SINK_LEFT, &from.to_be_bytes()[..])?;
        }
        if is && !was {
            self.note_sink_back()?;
        }
        for old in &before {
            if !names.contains(&old.as_str()) {
                self.tree.remove([&[ACTIVE], old.as_bytes()].concat())?;
            }
        }
        for name in names {
            if !before.iter().any(|b| b == name) && *name != SINK {
                self.reader(name).start_over()?;
            }
            self.tree
                .insert([&[ACTIVE], name.as_bytes()].concat(), &[][..])?;
        }
        self.release()?;
        Ok(())
    }

    /// The lowest event block id the sink has not passed: the first one an entry
    /// after its checkpoint names, or the next one to be written.
    fn first_unsent_block(&self) -> sled::Result<u64> {
        for entry in self.reader(SINK).entries()? {
            let blocks = entry?.committed.blocks;
            if let Some(id) = blocks
                .iter()
                .filter_map(|k| k.get(16..24).and_then(be64))
                .min()
            {
                return Ok(id);
            }
        }
        let highest = self.tree.get(HIGHEST)?.and_then(|v| be64(&v));
        Ok(highest.map_or(0, |h| h + 1))
    }

    /// The sink is back after [`SINK_LEFT`] was noted: the blocks between there and
    /// those the outbox still holds for it become the gap its backfill sends.
    fn note_sink_back(&self) -> sled::Result<()> {
        let Some(from) = self.tree.get(SINK_LEFT)?.and_then(|v| be64(&v)) else {
            return Ok(());
        };
        let end = self.first_unsent_block()?;
        if end > from {
            let (first, end) = match self.tree.get(GAP)?.and_then(|v| pair(&v)) {
                Some((f, e)) => (from.min(f), end.max(e)),
                None => (from, end),
            };
            tracing::warn!(
                blocks = end - first,
                "sink: switched off while the forwarder went on; what it missed is sent again"
            );
            self.tree.insert(GAP, pair_bytes(first, end))?;
        }
        self.tree.remove(SINK_LEFT)?;
        Ok(())
    }

    /// Whether the sink is one of the active readers.
    pub fn sink_reads(&self) -> sled::Result<bool> {
        Ok(self.readers()?.iter().any(|n| n == SINK))
    }

    /// Remove the entries every active reader has passed. Entries are removed from
    /// the oldest, so one left behind by a crash between a reader's checkpoint and
    /// this goes the next time.
    pub fn release(&self) -> sled::Result<()> {
        let mut passed = u64::MAX;
        for name in self.readers()? {
            passed = passed.min(self.reader(&name).checkpoint()?);
        }
        let seqs: Vec<u64> = self
            .entries(None)?
            .map(|e| e.map(|e| e.seq))
            .take_while(|s| s.as_ref().map_or(true, |s| *s <= passed))
            .collect::<sled::Result<_>>()?;
        if seqs.is_empty() {
            return Ok(());
        }
        self.tree
            .transaction(|tx| {
                for seq in &seqs {
                    tx.remove(&entry_key(*seq)[..])?;
                }
                Ok::<_, ConflictableTransactionError<Infallible>>(())
            })
            .map_err(storage)
    }
}
