//! Where the forwarder is, durably, in the outbox's `forward` reader.
//!
//! Each project moves on its own, so a project upstream refuses (401) or throttles
//! does not hold the others back: its state (`p` + project id) says up to which
//! entry its events were delivered (`done`) and which run of entries it is sending
//! now (its [`Window`]: first and last entry, the cutoff that made its events
//! historical, and how many of its requests upstream already took). A window is
//! fixed, and flushed to disk, before its first request, so after a crash it is
//! rebuilt into the same requests of the same events. The reader's own checkpoint
//! follows behind every project: it moves past an entry once each project with
//! events in it is done with it, which is when the outbox may drop the entry.
//!
//! What each entry holds is read once (its blocks' projects, event counts and sizes
//! from their pointers) and kept in a [`Cache`], since the entries never change.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::batch::Lines;
use crate::store::block::{self, files::Pointer};
use crate::store::keys;
use crate::store::outbox::Reader;

/// A window gathers at least this many of a project's events when the outbox has
/// them: ten requests, so a window's fsyncs are few next to its requests.
pub const WINDOW_EVENTS: u64 = 10_000;

/// A run of entries one project sends now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    pub first: u64,
    pub last: u64,
    /// Events before this time (unix ms) go as `historical_migration`.
    pub cutoff: i64,
    /// Requests of the window upstream has taken, in order.
    pub part: usize,
}

/// One project's progress.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// Every event of this project in entries up to this seq was delivered.
    pub done: u64,
    pub window: Option<Window>,
}

/// One event block an entry names.
#[derive(Debug, Clone)]
pub struct BlockInfo {
    pub project: u64,
    pub key: Vec<u8>,
    pub events: u64,
    /// Bytes it takes on disk (compressed), for the backlog's size.
    pub bytes: u64,
}

/// What an entry holds, as the forwarder needs it.
#[derive(Debug, Clone)]
pub struct EntryInfo {
    pub at: i64,
    pub blocks: Vec<BlockInfo>,
}

/// Entries read so far, by seq, from the reader's checkpoint on.
pub type Cache = BTreeMap<u64, EntryInfo>;

/// What remains to forward, and the windows to send.
#[derive(Debug, Default)]
pub struct Plan {
    /// Each project with a window, and its state.
    pub windows: Vec<(u64, State)>,
    pub backlog_events: u64,
    pub backlog_bytes: u64,
    /// Commit time of the oldest entry with events still to deliver.
    pub oldest_ms: Option<i64>,
}

fn key(project: u64) -> Vec<u8> {
    [&b"p"[..], &project.to_be_bytes()].concat()
}

/// Every project's stored state.
pub fn states(reader: &Reader) -> sled::Result<HashMap<u64, State>> {
    let mut out = HashMap::new();
    for (k, v) in reader.scan(b"p")? {
        let Some(id) = k.get(1..9).and_then(|b| b.try_into().ok()) else {
            continue;
        };
        let state = serde_json::from_slice(&v).unwrap_or_else(|_| {
            tracing::error!("forwarder: a project's state does not decode; starting it over");
            State::default()
        });
        out.insert(u64::from_be_bytes(id), state);
    }
    Ok(out)
}

pub fn save(reader: &Reader, project: u64, state: &State, durable: bool) -> sled::Result<()> {
    // Plain data of known types: serialising cannot fail.
    reader.put(
        &key(project),
        &serde_json::to_vec(state).unwrap_or_default(),
    )?;
    if durable {
        reader.outbox().tree().flush()?;
    }
    Ok(())
}

/// Read new entries into `cache`, move the reader's checkpoint past those every
/// project is done with, add up the backlog and fix a window for each project that
/// has events to send and none yet.
pub fn plan(
    reader: &Reader,
    events: &sled::Tree,
    cache: &mut Cache,
    now_ms: i64,
    historical_after_ms: i64,
) -> sled::Result<Plan> {
    let mut checkpoint = reader.checkpoint()?;
    let mut states = states(reader)?;
    let from = cache
        .keys()
        .next_back()
        .map_or(checkpoint, |s| *s.max(&checkpoint))
        + 1;
    for entry in reader.outbox().entries(Some(from))? {
        let entry = entry?;
        cache.insert(entry.seq, read_entry(events, &entry.committed)?);
    }
    let done = |states: &HashMap<u64, State>, p: u64, c: u64| states.get(&p).map_or(c, |s| s.done);
    let passed = cache
        .iter()
        .take_while(|(seq, e)| {
            e.blocks
                .iter()
                .all(|b| done(&states, b.project, checkpoint) >= **seq)
        })
        .last()
        .map(|(seq, _)| *seq);
    if let Some(to) = passed {
        // Projects no further on than the new checkpoint need no state of their own.
        let idle: Vec<u64> = states
            .iter()
            .filter(|(_, s)| s.done <= to && s.window.is_none())
            .map(|(p, _)| *p)
            .collect();
        let clear: Vec<Vec<u8>> = idle.iter().map(|p| key(*p)).collect();
        let clear: Vec<&[u8]> = clear.iter().map(Vec::as_slice).collect();
        reader.advance(to, &clear, true)?;
        for p in idle {
            states.remove(&p);
        }
        checkpoint = to;
    }
    cache.retain(|seq, _| *seq > checkpoint);

    let mut plan = Plan::default();
    let mut pending: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for (seq, e) in cache.iter() {
        for b in &e.blocks {
            if done(&states, b.project, checkpoint) < *seq {
                plan.backlog_events += b.events;
                plan.backlog_bytes += b.bytes;
                plan.oldest_ms = Some(plan.oldest_ms.map_or(e.at, |o: i64| o.min(e.at)));
                pending.entry(b.project).or_default().push((*seq, b.events));
            }
        }
    }
    let mut fixed = false;
    for (project, blocks) in pending {
        let state = states.entry(project).or_insert_with(|| State {
            done: checkpoint,
            window: None,
        });
        if state.window.is_none() {
            let first = blocks[0].0;
            let (mut last, mut n) = (first, 0);
            for (seq, events) in blocks {
                if n >= WINDOW_EVENTS && seq != last {
                    break;
                }
                (last, n) = (seq, n + events);
            }
            state.window = Some(Window {
                first,
                last,
                cutoff: now_ms - historical_after_ms,
                part: 0,
            });
            save(reader, project, state, false)?;
            fixed = true;
        }
        if state.window.is_some() {
            plan.windows.push((project, state.clone()));
        }
    }
    if fixed {
        // Also makes the events durable: only what survives a crash is sent.
        reader.outbox().tree().flush()?;
    }
    Ok(plan)
}

fn read_entry(
    events: &sled::Tree,
    committed: &crate::store::outbox::Committed,
) -> sled::Result<EntryInfo> {
    let mut blocks = Vec::with_capacity(committed.blocks.len());
    for k in &committed.blocks {
        let Some((project, _)) = keys::split_block(k) else {
            continue;
        };
        let value = events.get(k)?;
        let (n, bytes) = match value.as_deref() {
            Some(v) => match Pointer::decode(v) {
                Some(p) => (u64::from(p.count), u64::from(p.len)),
                None => (block::count(v).map_or(0, u64::from), v.len() as u64),
            },
            // Deleted already (retention); the window finds it missing.
            None => (0, 0),
        };
        blocks.push(BlockInfo {
            project,
            key: k.clone(),
            events: n,
            bytes,
        });
    }
    Ok(EntryInfo {
        at: committed.at,
        blocks,
    })
}

/// The window's events of `project`, in entry and block order, and how many of its
/// blocks are gone.
pub fn window_lines(
    cache: &Cache,
    events: &sled::Tree,
    files: &block::Files,
    project: u64,
    window: &Window,
) -> sled::Result<(Lines, u64)> {
    let blocks: Vec<&BlockInfo> = cache
        .range(window.first..=window.last)
        .flat_map(|(_, e)| e.blocks.iter().filter(|b| b.project == project))
        .collect();
    let total: u64 = blocks.iter().map(|b| b.events).sum();
    let mut lines = Lines::new();
    let mut missing = 0;
    for (n, b) in blocks.iter().enumerate() {
        let value = events.get(&b.key)?;
        // Past the block cache: a window reads each block once, and other reads come
        // back to the blocks it holds.
        match value.and_then(|v| files.rows_uncached(&b.key, &v)) {
            Some(rows) => lines.push_rows(&rows),
            None => missing += 1,
        }
        if n == 0 {
            lines.reserve_like(total.saturating_sub(lines.len() as u64) as usize);
        }
    }
    Ok((lines, missing))
}
