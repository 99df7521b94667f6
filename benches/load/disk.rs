//! Disk at rest: what a volume of typical web events leaves on disk once the compactor
//! has caught up. The harness sends `--disk-events` `$pageview`s (the memory scenario's
//! person batches) from `--disk-persons` persons to a flagpost of its own, waits until
//! the log is empty, measures the database directory with the server running, stops it
//! cleanly (SIGTERM), measures again, then opens the stopped database with sled itself
//! and counts, per tree, its keys and their key and value bytes. The stored bytes per
//! tree beside the size of sled's file say whether the bytes go to what flagpost stores
//! or to space sled has not reclaimed; the log's segments are counted on their own.
//! With `--baseline`, the other build goes through the same, on its own database.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::target::Target;
use crate::{client, memory, payloads, person_events};

/// The scenario's name on the command line.
pub const NAME: &str = "disk";
/// How long the compactor may take to empty the log after the ingest.
const DRAIN_LIMIT: Duration = Duration::from_secs(600);
/// After the log is empty, sled's own flusher (every 500 ms) and the compactor's
/// last writes settle before the running server's files are measured.
const SETTLE: Duration = Duration::from_secs(3);

pub struct Settings {
    pub events: usize,
    pub persons: usize,
    pub connections: usize,
}

/// Sizes of one kind of file under the database directory.
#[derive(Default, Clone, Copy)]
pub struct Files {
    pub count: u64,
    /// Sum of the files' lengths.
    pub len: u64,
    /// Sum of the blocks the file system allocated to them (what `du` counts).
    pub allocated: u64,
}

impl Files {
    fn add(&mut self, meta: &std::fs::Metadata) {
        use std::os::unix::fs::MetadataExt;
        self.count += 1;
        self.len += meta.len();
        self.allocated += meta.blocks() * 512;
    }
}

/// The database directory by kind of file.
#[derive(Default, Clone, Copy)]
pub struct Dir {
    /// sled's file, `db`.
    pub sled_db: Files,
    /// sled's `blobs/` (values too large for a page) and its snapshots (`snap.*`).
    pub sled_other: Files,
    /// The write-ahead log's segments and spares (`wal/`).
    pub log: Files,
    /// The event blocks' bytes (`blocks/`).
    pub blocks: Files,
    /// The persons' and distinct ids' runs (`tables/`).
    pub tables: Files,
    /// The event index's runs and manifest (`event_index/`).
    pub event_index: Files,
    /// Anything else (`conf`, the log's marks).
    pub other: Files,
}

impl Dir {
    pub fn total(&self) -> Files {
        let mut t = Files::default();
        for f in [
            self.sled_db,
            self.sled_other,
            self.log,
            self.blocks,
            self.tables,
            self.event_index,
            self.other,
        ] {
            t.count += f.count;
            t.len += f.len;
            t.allocated += f.allocated;
        }
        t
    }
}

/// One tree's keys and what they hold.
pub struct Tree {
    pub name: String,
    pub keys: u64,
    pub key_bytes: u64,
    pub value_bytes: u64,
}

impl Tree {
    fn new(name: String) -> Tree {
        Tree {
            name,
            keys: 0,
            key_bytes: 0,
            value_bytes: 0,
        }
    }

    fn count(&mut self, key: &[u8], value: &[u8]) {
        self.keys += 1;
        self.key_bytes += key.len() as u64;
        self.value_bytes += value.len() as u64;
    }
}

/// The stored events' blocks, decoded.
#[derive(Default)]
pub struct Blocks {
    pub blocks: u64,
    pub events: u64,
    /// Bytes of the blocks' values as stored (compressed).
    pub stored: u64,
    /// Bytes of the events' properties JSON, decoded.
    pub properties: u64,
    /// Bytes of the events' names and distinct ids, decoded.
    pub texts: u64,
}

pub struct Report {
    /// flagpost or the baseline.
    pub name: &'static str,
    pub events: usize,
    pub persons: usize,
    pub ingest_seconds: f64,
    pub drain_seconds: f64,
    pub running: Dir,
    pub stopped: Dir,
    pub trees: Vec<Tree>,
    /// The layered tables (persons, distinct ids): run and delta merged.
    pub tables: Vec<Tree>,
    pub blocks: Blocks,
    /// sled's own figure for the stopped database, opened again.
    pub size_on_disk: u64,
    /// A person's events through the read API, before the stop.
    /// A person's events through the read API; the scale scenario times its own.
    pub lookups: Option<person_events::Latencies>,
}

pub fn run(
    runtime: &tokio::runtime::Runtime,
    settings: &Settings,
    name: &'static str,
    binary: &Path,
    data_dir: &Path,
    db: &Path,
) -> Result<Report, String> {
    let mut flagpost = Target::flagpost_at(name, binary, data_dir, db)?;
    let batches = (settings.persons / payloads::BATCH_EVENTS).max(1);
    let bodies: Arc<[Bytes]> = payloads::person_batches(batches).into();
    let requests = settings.events.div_ceil(payloads::BATCH_EVENTS);
    let (ingest_seconds, drain_seconds) = runtime.block_on(async {
        let started = Instant::now();
        memory::ingest(flagpost.addr, &bodies, requests, settings.connections).await?;
        let ingest = started.elapsed().as_secs_f64();
        println!(
            "disk: {name} ingested {} events in {ingest:.1} s; waiting for the compactor",
            requests * payloads::BATCH_EVENTS
        );
        let drain = client::wait_for_empty_log(flagpost.addr, DRAIN_LIMIT)
            .await
            .map_err(|e| format!("after the ingest: {e}"))?;
        tokio::time::sleep(SETTLE).await;
        Ok::<_, String>((ingest, drain.as_secs_f64()))
    })?;
    let lookups = runtime.block_on(person_events::measure(flagpost.addr, settings.persons))?;
    let running = measure_dir(db)?;
    flagpost.stop()?;
    let stopped = measure_dir(db)?;
    let (trees, tables, blocks, size_on_disk) = read_trees(db)?;

    Ok(Report {
        name,
        events: requests * payloads::BATCH_EVENTS,
        persons: batches * payloads::BATCH_EVENTS,
        ingest_seconds,
        drain_seconds,
        running,
        stopped,
        trees,
        tables,
        blocks,
        size_on_disk,
        lookups: Some(lookups),
    })
}

/// Every file under the database directory, by kind.
pub fn measure_dir(db: &Path) -> Result<Dir, String> {
    let mut dir = Dir::default();
    let mut pending = vec![db.to_path_buf()];
    while let Some(path) = pending.pop() {
        let entries =
            std::fs::read_dir(&path).map_err(|e| format!("cannot list {}: {e}", path.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("cannot list {}: {e}", path.display()))?;
            let meta = match entry.metadata() {
                Ok(meta) => meta,
                // Removed since the listing (a journal rotated, a run folded away).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(format!("cannot stat {}: {e}", entry.path().display())),
            };
            if meta.is_dir() {
                pending.push(entry.path());
                continue;
            }
            let relative = entry.path();
            let relative = relative.strip_prefix(db).unwrap_or(&relative);
            let top = relative
                .components()
                .next()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .unwrap_or_default();
            let kind = match top.as_str() {
                "db" => &mut dir.sled_db,
                "blobs" => &mut dir.sled_other,
                "blocks" => &mut dir.blocks,
                "tables" => &mut dir.tables,
                "event_index" => &mut dir.event_index,
                t if t.starts_with("snap.") => &mut dir.sled_other,
                "wal" if relative.components().count() > 1 => {
                    let name = entry.file_name();
                    let name = name.to_string_lossy();
                    match name.ends_with(".log") || name.ends_with(".tmp") {
                        true => &mut dir.log,
                        false => &mut dir.other,
                    }
                }
                _ => &mut dir.other,
            };
            kind.add(&meta);
        }
    }
    Ok(dir)
}

/// Per tree and per layered table, keys and bytes; the event blocks decoded; sled's
/// size on disk.
pub fn read_trees(db: &Path) -> Result<(Vec<Tree>, Vec<Tree>, Blocks, u64), String> {
    let sled_err = |e: sled::Error| format!("reading the stopped database: {e}");
    let opened = sled::Config::new().path(db).open().map_err(sled_err)?;
    let mut trees = Vec::new();
    let mut blocks = Blocks::default();
    let files = flagpost::store::block::Files::open(db)
        .map_err(|e| format!("reading the block files: {e}"))?;
    for name in opened.tree_names() {
        let tree = opened.open_tree(&name).map_err(sled_err)?;
        let mut t = Tree::new(String::from_utf8_lossy(&name).into_owned());
        for entry in tree.iter() {
            let (k, v) = entry.map_err(sled_err)?;
            t.count(&k, &v);
            if t.name == flagpost::store::EVENTS_TREE {
                let bytes = files
                    .resolve(&v)
                    .map_err(|e| format!("reading an event block: {e}"))?;
                count_block(&mut blocks, &bytes);
            }
        }
        trees.push(t);
    }
    let mut tables = Vec::new();
    for name in [
        flagpost::store::PERSONS_TREE,
        flagpost::store::DISTINCT_IDS_TREE,
    ] {
        let table = flagpost::store::layered::Layered::open(&opened, db, name)
            .map_err(|e| format!("reading the table {name}: {e}"))?;
        let mut t = Tree::new(name.to_owned());
        for entry in table.iter() {
            let (k, v) = entry.map_err(sled_err)?;
            t.count(&k, &v);
        }
        tables.push(t);
    }
    let size = opened.size_on_disk().map_err(sled_err)?;
    Ok((trees, tables, blocks, size))
}

fn count_block(blocks: &mut Blocks, value: &[u8]) {
    use flagpost::store::block::Block;
    blocks.blocks += 1;
    blocks.stored += value.len() as u64;
    let Some(block) = Block::decode(value) else {
        return;
    };
    for h in block.heads() {
        blocks.events += 1;
        blocks.properties += block.properties(h).len() as u64;
        blocks.texts += (block.event(h).len() + block.distinct_id(h).len()) as u64;
    }
}

pub fn report(r: &Report) {
    let per = |bytes: u64| bytes as f64 / r.events as f64;
    let mb = |bytes: u64| bytes as f64 / 1e6;
    println!();
    println!(
        "disk, {}: {} events from {} persons ingested in {:.1} s, compacted {:.1} s later",
        r.name, r.events, r.persons, r.ingest_seconds, r.drain_seconds
    );
    println!(
        "{:<34} {:>6} {:>12} {:>12} {:>10}",
        "files (allocated; length)", "files", "MB alloc", "MB length", "B/event"
    );
    for (when, dir) in [("running, log empty", &r.running), ("stopped", &r.stopped)] {
        for (what, f) in [
            ("sled db", dir.sled_db),
            ("sled blobs+snapshots", dir.sled_other),
            ("log segments", dir.log),
            ("event block files", dir.blocks),
            ("person and id runs", dir.tables),
            ("event index runs", dir.event_index),
            ("other", dir.other),
            ("total", dir.total()),
        ] {
            println!(
                "{:<34} {:>6} {:>12.2} {:>12.2} {:>10.1}",
                format!("{when}: {what}"),
                f.count,
                mb(f.allocated),
                mb(f.len),
                per(f.allocated)
            );
        }
    }
    println!(
        "sled size_on_disk (stopped, reopened): {:.2} MB, {:.1} B/event",
        mb(r.size_on_disk),
        per(r.size_on_disk)
    );
    println!();
    println!(
        "{:<16} {:>9} {:>12} {:>12} {:>10}",
        "tree", "keys", "key bytes", "value bytes", "B/event"
    );
    let (mut keys, mut bytes) = (0, 0);
    for t in &r.trees {
        keys += t.keys;
        bytes += t.key_bytes + t.value_bytes;
        println!(
            "{:<16} {:>9} {:>12} {:>12} {:>10.1}",
            t.name,
            t.keys,
            t.key_bytes,
            t.value_bytes,
            per(t.key_bytes + t.value_bytes)
        );
    }
    println!(
        "{:<16} {:>9} {:>25} {:>10.1}",
        "all trees",
        keys,
        bytes,
        per(bytes)
    );
    for t in &r.tables {
        println!(
            "{:<16} {:>9} {:>12} {:>12} {:>10.1}  (table: run and delta)",
            t.name,
            t.keys,
            t.key_bytes,
            t.value_bytes,
            per(t.key_bytes + t.value_bytes)
        );
    }
    let b = &r.blocks;
    if b.events > 0 {
        println!(
            "event blocks: {} blocks holding {} events ({:.1} a block); stored {:.1} B/event; \
             decoded properties {:.1} B/event, name and distinct id {:.1} B/event",
            b.blocks,
            b.events,
            b.events as f64 / b.blocks.max(1) as f64,
            b.stored as f64 / b.events as f64,
            b.properties as f64 / b.events as f64,
            b.texts as f64 / b.events as f64,
        );
    }
    if let Some(l) = r.lookups.as_ref().filter(|l| !l.sorted.is_empty()) {
        println!(
            "a person's events (?distinct_id=, limit 100), {} lookups returning {} events: \
             p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (target p99 < 20)",
            l.sorted.len(),
            l.events,
            l.percentile_ms(0.5),
            l.percentile_ms(0.99),
            l.percentile_ms(1.0),
        );
    }
    let stopped = r.stopped.total().allocated;
    println!(
        "disk, {}: at rest (stopped) {:.2} MB for {} events: {:.1} bytes an event (target <= 120)",
        r.name,
        mb(stopped),
        r.events,
        per(stopped)
    );
}
