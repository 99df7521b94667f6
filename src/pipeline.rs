//! The write side put together, and every worker it runs: [`Pipeline::open`] opens the
//! sled database (migrating an older format), the write-ahead log's files, the log's
//! group-commit writer thread, the compactor's thread and, for a database without
//! current rollups or without the persons' first-seen index, the threads that build
//! them, and the event index's worker; [`Pipeline::start_sink`] adds the
//! ClickHouse sink's task when one is configured. [`Pipeline::close`] stops them all,
//! waits for each and flushes. It sits above [`crate::log`], [`crate::compactor`],
//! [`crate::store`] and [`crate::sink`] because it is the one place that needs them all.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::compactor;
use crate::config::Config;
use crate::log::{self, writer as wal, Wal};
use crate::projects::Projects;
use crate::store::check as store_check;
use crate::store::live::{Live, Open};
use crate::store::rollup::{self, backfill::Step};
use crate::store::{by_property, first_seen, keys, person_cache, Error, Trees};
use crate::support::sync::Gate;

/// The open database, its log writer, its compactor and, when configured, its sink.
pub struct Pipeline {
    /// The database, reopened in place by the compactor after a write failure.
    pub store: Arc<Live>,
    pub wal: Wal,
    /// The log's positions, for its depth.
    pub log: Arc<log::Shared>,
    /// Persons for `/decide`, forgotten by the compactor as it changes them.
    pub persons: Arc<person_cache::PersonCache>,
    pub compactor: Arc<compactor::Stats>,
    /// Held by the compactor for each step; a backup takes it to pause the compactor.
    pub compactor_gate: Arc<Gate>,
    /// Held by the sink for each pass, when there is a sink; a backup takes it to
    /// pause the sink.
    pub sink_gate: Option<Arc<Gate>>,
    writer: wal::Writer,
    compactor_thread: compactor::Handle,
    /// Building the console's rollups from stored events, and the persons' first-seen
    /// index from stored persons, when they were missing.
    backfills: Vec<Backfill>,
    /// Folds, merges and builds the event index ([`crate::store::event_index`]).
    event_index: (std::thread::JoinHandle<()>, Arc<AtomicBool>),
    sink: Option<Sink>,
}

/// The ClickHouse sink's task and the runtime it runs on: [`Pipeline::close`] blocks
/// (it joins threads), so it waits for the task through that runtime.
struct Sink {
    task: crate::sink::worker::Handle,
    runtime: tokio::runtime::Handle,
}

impl Pipeline {
    /// Open the database in `config.db_dir` and start the log writer and the
    /// compactor. Blocking. From `config` come sled's page cache
    /// ([`crate::config::DEFAULT_CACHE_BYTES`]), the size of the log's files
    /// ([`crate::config::DEFAULT_LOG_SEGMENT_BYTES`]) and the compactor's settings.
    pub fn open(
        config: &Config,
        projects: Arc<ArcSwap<Projects>>,
        geoip: Arc<crate::geoip::Database>,
        on_flush: wal::FlushObserver,
    ) -> Result<Pipeline, Error> {
        let (dir, cache_bytes) = (config.db_dir.as_path(), config.cache_bytes);
        let db = store_check::open(dir, cache_bytes)?;
        // A damaged database can make sled panic rather than fail: turned into an
        // error that names the database.
        let read = catch_unwind(AssertUnwindSafe(|| -> Result<_, Error> {
            let trees = Trees::open(&db, dir)?;
            let checkpoint = trees
                .meta
                .get(keys::CHECKPOINT_KEY)?
                .and_then(|v| keys::seq(&v));
            let floor = first_seq(&db, &trees.wal, checkpoint)?;
            Ok((trees, checkpoint, floor))
        }));
        let (trees, checkpoint, floor) = match read {
            Ok(read) => read?,
            Err(panic) => {
                let why = store_check::panic_text(&*panic);
                return Err(Error::Damaged(store_check::damaged(dir, &why)));
            }
        };
        let io = |e| Error::from(sled::Error::Io(e));
        let (appender, reader, preparer) = log::open(
            &dir.join(log::DIR_NAME),
            floor,
            checkpoint,
            config.log_segment_bytes,
        )
        .map_err(io)?;
        let shared = appender.shared().clone();
        let (wal, writer) = Wal::start(appender, preparer, on_flush).map_err(io)?;
        let persons = Arc::new(person_cache::PersonCache::new(person_cache::DEFAULT_BYTES));
        let settings = config.compactor.clone();
        let compactor = compactor::Compactor::new(trees.clone(), reader, projects, settings, geoip)
            .with_person_cache(persons.clone());
        let stats = compactor.stats();
        let trees_meta = trees.meta.clone();
        let store = Arc::new(Live::new(dir, cache_bytes, Open { db, trees }));
        let compactor_gate = Arc::new(Gate::default());
        let compactor_thread =
            compactor::spawn(compactor, store.clone(), compactor_gate.clone()).map_err(io)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (live, flag) = (store.clone(), stop.clone());
        let index_thread = std::thread::Builder::new()
            .name("event-index".into())
            .spawn(move || crate::store::event_index::worker::work(&live, &flag))
            .map_err(io)?;
        let mut backfills = Vec::new();
        if let rollup::Status::Building(_) = rollup::status(&trees_meta)? {
            let job = Job::Rollups;
            backfills
                .push(Backfill::spawn(job, store.clone(), compactor_gate.clone()).map_err(io)?);
        }
        let builds = [
            (Job::FirstSeen, first_seen::building(&trees_meta)?),
            (Job::ByProperty, by_property::building(&trees_meta)?),
        ];
        for (job, _) in builds.into_iter().filter(|b| b.1) {
            backfills
                .push(Backfill::spawn(job, store.clone(), compactor_gate.clone()).map_err(io)?);
        }
        Ok(Pipeline {
            store,
            wal,
            log: shared,
            persons,
            compactor: stats,
            compactor_gate,
            sink_gate: None,
            writer,
            compactor_thread,
            backfills,
            event_index: (index_thread, stop),
            sink: None,
        })
    }

    /// Start the ClickHouse sink over the open database, reporting into `stats`. It
    /// holds the database for its life, so with it a database that failed writing is
    /// healed by a restart (the reopen gives up and /_liveness fails) rather than in
    /// place. Call inside the runtime, which runs the sink's task.
    pub fn start_sink(
        &mut self,
        settings: crate::config::Sink,
        stats: crate::sink::Stats,
    ) -> Result<(), crate::sink::Error> {
        let open = self.store.get().ok_or_else(|| {
            crate::sink::Error::Store(sled::Error::Io(std::io::Error::other("database closed")))
        })?;
        let gate = Arc::new(Gate::default());
        let task =
            crate::sink::worker::spawn(settings, &open.db, &open.trees, stats, gate.clone())?;
        self.sink_gate = Some(gate);
        self.sink = Some(Sink {
            task,
            runtime: tokio::runtime::Handle::current(),
        });
        Ok(())
    }

    /// Stop the sink, write what the log has queued, stop the writer and the
    /// compactor, and flush; each worker is waited for. Appends after this fail as
    /// closed. Blocking: call off the reactor (on the blocking pool when there is a
    /// sink, whose task it waits for on the runtime).
    pub fn close(self) -> Result<(), Error> {
        let Pipeline {
            store,
            writer,
            compactor_thread,
            backfills,
            event_index,
            sink,
            ..
        } = self;
        if let Some(Sink { task, runtime }) = sink {
            runtime.block_on(task.stop());
        }
        for b in backfills {
            b.stop();
        }
        writer.stop();
        compactor_thread.stop();
        // After the compactor: it writes out the recent part the compactor filled.
        event_index.1.store(true, Ordering::SeqCst);
        event_index.0.thread().unpark();
        if event_index.0.join().is_err() {
            tracing::error!("the event index's thread panicked");
        }
        // Stopped in the middle of a reopen: nothing open to flush; the log holds
        // everything acknowledged.
        if let Some(open) = store.get() {
            open.db.flush()?;
        }
        Ok(())
    }
}

/// A thread that builds what an older database lacks while the server runs (the
/// console's rollups from stored events, [`rollup::backfill`]; the persons' indexes by
/// first seen, [`first_seen`], and by property, [`by_property`]): a batch at a time, each on the database as it is then
/// (so a reopen never waits long for it), resting as long as each batch took so
/// capture and the compactor keep most of the machine.
struct Backfill {
    thread: std::thread::JoinHandle<()>,
    stop: Arc<AtomicBool>,
}

/// What a [`Backfill`] builds.
#[derive(Debug, Clone, Copy)]
enum Job {
    Rollups,
    FirstSeen,
    ByProperty,
}

/// A build's plan, made on its first step.
enum Plan {
    Rollups(rollup::backfill::Backfill),
    FirstSeen(first_seen::Build),
    ByProperty(by_property::Build),
}

impl Job {
    /// The thread's name, what the log says as it goes, and when it is done.
    fn names(self) -> [&'static str; 3] {
        match self {
            Job::Rollups => [
                "rollups",
                "building rollups from stored events",
                "rollups built: the console reads them from now on",
            ],
            Job::FirstSeen => [
                "first-seen",
                "indexing persons by first seen",
                "persons indexed by first seen: the console lists them from the index",
            ],
            Job::ByProperty => [
                "by-property",
                "indexing persons by property",
                "persons indexed by property: the console searches them through the index",
            ],
        }
    }

    fn plan(self, trees: &Trees) -> Result<Plan, sled::Error> {
        Ok(match self {
            Job::Rollups => Plan::Rollups(rollup::backfill::Backfill::new(trees)?),
            Job::FirstSeen => Plan::FirstSeen(first_seen::Build::new(trees)),
            Job::ByProperty => Plan::ByProperty(by_property::Build::new(trees)),
        })
    }
}

impl Plan {
    fn step(&self, trees: &Trees) -> Result<Step, sled::Error> {
        match self {
            Plan::Rollups(b) => b.step(trees),
            Plan::FirstSeen(b) => b.step(trees),
            Plan::ByProperty(b) => b.step(trees),
        }
    }
}

/// After a failed batch, wait before the next.
const BACKFILL_BACKOFF: Duration = Duration::from_secs(1);
/// The progress is logged each time it passes a multiple of this many percent.
const BACKFILL_LOG_PERCENT: u8 = 5;

impl Backfill {
    /// `gate` is the compactor's: each batch holds it as a compactor step does, so a
    /// backup never copies the rollups and the backfill's position from either side
    /// of one batch.
    fn spawn(job: Job, live: Arc<Live>, gate: Arc<Gate>) -> std::io::Result<Backfill> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(job.names()[0].into())
            .spawn(move || backfill(job, &live, &gate, &flag))?;
        Ok(Backfill { thread, stop })
    }

    fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.thread().unpark();
        if self.thread.join().is_err() {
            tracing::error!("a backfill thread panicked");
        }
    }
}

fn backfill(job: Job, live: &Live, gate: &Gate, stop: &AtomicBool) {
    let [what, going, done] = job.names();
    let started = Instant::now();
    let mut plan: Option<Plan> = None;
    let mut logged = 0u8;
    while !stop.load(Ordering::SeqCst) {
        let Some(open) = live.get() else {
            std::thread::park_timeout(BACKFILL_BACKOFF);
            continue;
        };
        let t = Instant::now();
        let pass = gate.blocking_read();
        let step = match &plan {
            Some(plan) => plan.step(&open.trees),
            None => job.plan(&open.trees).map(|p| {
                plan = Some(p);
                Step::Progress(0)
            }),
        };
        drop(open);
        drop(pass);
        match step {
            Ok(Step::Done) => {
                tracing::info!(seconds = started.elapsed().as_secs(), "{done}");
                return;
            }
            Ok(Step::Progress(percent)) => {
                if percent >= logged.saturating_add(BACKFILL_LOG_PERCENT) {
                    logged = percent - percent % BACKFILL_LOG_PERCENT;
                    tracing::info!(percent, "{going}");
                }
                std::thread::park_timeout(t.elapsed());
            }
            Err(e) => {
                tracing::warn!(error = %e, "{what}: a batch failed; retrying");
                std::thread::park_timeout(BACKFILL_BACKOFF);
            }
        }
    }
}

/// The lowest sequence number the log's next entry may take: above every entry still
/// in the log tree of earlier versions, above `checkpoint` (the last entry the
/// compactor applied) and above sled's id generator, which numbered entries before,
/// so the log stays in arrival order across restarts and upgrades.
fn first_seq(
    db: &sled::Db,
    tree: &sled::Tree,
    checkpoint: Option<u64>,
) -> Result<u64, sled::Error> {
    let last = match tree.last()? {
        Some((key, _)) => keys::seq(&key),
        None => None,
    };
    let generated = db.generate_id()?;
    let highest = [last, checkpoint].into_iter().flatten().max().unwrap_or(0);
    Ok(highest.saturating_add(1).max(generated))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_starts_above_the_log_and_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path()).unwrap();
        let tree = db.open_tree("wal").unwrap();
        tree.insert(1_000u64.to_be_bytes(), &b"x"[..]).unwrap();
        tree.insert(2_000u64.to_be_bytes(), &b"x"[..]).unwrap();
        assert!(first_seq(&db, &tree, None).unwrap() > 2_000);
        assert!(first_seq(&db, &tree, Some(5_000)).unwrap() > 5_000);
        // The compactor emptied the log: its checkpoint still counts.
        tree.clear().unwrap();
        assert!(first_seq(&db, &tree, Some(5_000)).unwrap() > 5_000);
        // Nothing left anywhere: still above every id sled generated before.
        let generated = db.generate_id().unwrap();
        assert!(first_seq(&db, &tree, None).unwrap() > generated);
    }
}

/// The edge forwarder over a store the compactor filled: a test of the two together,
/// so it sits here, above both.
#[cfg(test)]
#[path = "pipeline/tests/forward_acknowledged/mod.rs"]
mod forward_acknowledged;
