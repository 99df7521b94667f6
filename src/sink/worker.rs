//! The sink's background worker: a loop around [`Worker::step`], which does exactly
//! one pass (connect and create tables if needed, choose the next batch, build its
//! rows, insert every table, then acknowledge it in the outbox). Nothing is removed
//! from the outbox until ClickHouse took every table of the batch, so a crash, a
//! ClickHouse restart or a network error loses nothing; the batch is re-sent whole
//! and its rows collapse. Failures are retried with a doubling backoff, and the log
//! says when ClickHouse stops or starts taking rows, once each, not per retry.
//!
//! Only what is durable is sent: sled makes a committed transaction durable at its
//! next flush, and a `kill -9` before it rolls the chunk back, to be applied again
//! from the log, with new person ids. Rows read from such a chunk and sent would stay
//! in ClickHouse as persons that never were, so after reading a batch the worker
//! flushes (one fsync per batch of 50k rows) and only then sends it.
//!
//! Storage calls run on the blocking pool, so a slow disk never stalls the reactor
//! that serves capture and decide.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::backfill::{self, Progress};
use super::batch::{self, Batch, Sources};
use super::destination::Destination;
use super::stats::Stats;
use super::Error;
use crate::config;
use crate::store::outbox::Outbox;
use crate::support::sync::Gate;

/// How often an empty or young outbox is looked at again.
const POLL: Duration = Duration::from_millis(200);
/// The first retry after a failure comes this soon...
const MIN_BACKOFF: Duration = Duration::from_millis(250);
/// ...and retries slow down to this, so a long outage costs little.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The backfill says how far it got at most this often.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// What a pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// A batch went into every table and was acknowledged.
    Sent { rows: u64 },
    /// Nothing to send yet.
    Idle,
}

/// Whether ClickHouse is taking rows, for logging changes once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    Starting,
    Up,
    Down,
}

pub struct Worker {
    settings: config::Sink,
    outbox: Outbox,
    sources: Sources,
    node: Uuid,
    /// The server, ready; dropped after any failure so the next pass checks its
    /// version and tables again (it may have been upgraded or wiped meanwhile).
    destination: Option<Destination>,
    stats: Stats,
    health: Health,
    /// The backfill's progress; None once it is done.
    backfill: Option<Progress>,
    /// Outbox and backfill batches take turns, so neither starves the other.
    backfill_next: bool,
    /// When the backfill last logged its progress.
    reported: Instant,
    /// Rows a batch from the outbox waits for ([`batch::MIN_ROWS`]).
    batch_rows: u64,
}

impl Worker {
    /// A worker over the store's outbox and trees. Blocking (reads the node id).
    pub fn new(settings: config::Sink, outbox: Outbox, sources: Sources) -> Result<Worker, Error> {
        // Bad settings are refused now rather than retried forever.
        settings.authority()?;
        let node = outbox.node().map_err(Error::Store)?;
        // Saved at once: where the outbox's blocks begin is known only now.
        let backfill = Progress::resume(&outbox, &sources).map_err(Error::Store)?;
        if !backfill.is_done() {
            tracing::info!(phase = ?backfill.phase, "sink: backfilling what was stored before");
        }
        Ok(Worker {
            settings,
            outbox,
            sources,
            node,
            destination: None,
            stats: Stats::default(),
            health: Health::Starting,
            backfill: (!backfill.is_done()).then_some(backfill),
            backfill_next: false,
            reported: Instant::now(),
            batch_rows: batch::MIN_ROWS,
        })
    }

    pub fn stats(&self) -> Stats {
        self.stats.clone()
    }

    /// Report into `stats` (the ones `/metrics` registered) instead of its own.
    pub fn with_stats(mut self, stats: Stats) -> Worker {
        self.stats = stats;
        self
    }

    /// Batches of at least `rows` rows from the outbox, when it has them, instead of
    /// [`batch::MIN_ROWS`] (for tests and measuring).
    pub fn with_batch_rows(mut self, rows: u64) -> Worker {
        self.batch_rows = rows;
        self
    }

    /// One pass: send the next batch if there is one.
    pub async fn step(&mut self) -> Result<Pass, Error> {
        let result = self.try_step().await;
        if result.is_err() {
            self.destination = None;
            self.stats.errors.inc();
        }
        self.refresh_lag().await;
        result
    }

    async fn try_step(&mut self) -> Result<Pass, Error> {
        if self.destination.is_none() {
            let dest = Destination::open(self.settings.clone()).await?;
            tracing::info!(
                version = %dest.version(),
                shape = ?dest.shape(),
                database = %self.settings.database,
                "sink: ClickHouse tables ready"
            );
            self.destination = Some(dest);
        }
        self.backfill_next = !self.backfill_next && self.backfill.is_some();
        let sent = match self.backfill_next {
            true => self.backfill_step().await?,
            false => self.outbox_step().await?,
        };
        let sent = match sent {
            Some(pass) => Some(pass),
            None if self.backfill_next => self.outbox_step().await?,
            None => self.backfill_step().await?,
        };
        Ok(sent.unwrap_or(Pass::Idle))
    }

    fn shape(&self) -> Result<super::Shape, Error> {
        let shape = self.destination.as_ref().map(Destination::shape);
        shape.ok_or_else(|| Error::Answer("no destination".into()))
    }

    /// Send the outbox's next batch, if it has one ready.
    async fn outbox_step(&mut self) -> Result<Option<Pass>, Error> {
        let (outbox, sources, shape) = (self.outbox.clone(), self.sources.clone(), self.shape()?);
        let (now, min_rows) = (crate::support::clock::now_ms(), self.batch_rows);
        let ready = move || batch::ready(&outbox, &sources, now, min_rows, shape);
        let Some(batch) = blocking(ready).await? else {
            return Ok(None);
        };
        self.send(batch).await.map(Some)
    }

    /// Send the backfill's next run, if it is not done.
    async fn backfill_step(&mut self) -> Result<Option<Pass>, Error> {
        let Some(from) = self.backfill.clone() else {
            return Ok(None);
        };
        let (sources, shape, start) = (self.sources.clone(), self.shape()?, from.clone());
        let step = blocking(move || backfill::ready(&sources, &start, shape)).await?;
        let token = step.token(self.node, &from);
        if step.count > 0 {
            let dest = self
                .destination
                .as_mut()
                .ok_or_else(|| Error::Answer("no destination".into()))?;
            dest.insert(step.table, step.rows, &token).await?;
            self.stats.sent(step.table, step.count);
        }
        let (outbox, then) = (self.outbox.clone(), step.then.clone());
        blocking(move || then.save(&outbox)).await?;
        let mut then = step.then;
        if then.is_done() {
            tracing::info!(rows = then.rows, "sink: backfill done");
            // Blocks written while the sink was off, noted meanwhile, come next.
            let (outbox, sources) = (self.outbox.clone(), self.sources.clone());
            then = blocking(move || Progress::resume(&outbox, &sources)).await?;
        } else if then.phase != from.phase || self.reported.elapsed() >= PROGRESS_EVERY {
            self.reported = Instant::now();
            tracing::info!(phase = ?then.phase, rows = then.rows, "sink: backfilling");
        }
        self.backfill = (!then.is_done()).then_some(then);
        Ok(Some(Pass::Sent { rows: step.count }))
    }

    /// Insert every table of `batch`, then acknowledge it. A failure part-way leaves
    /// the batch in flight, to be rebuilt and sent whole with the same tokens.
    async fn send(&mut self, batch: Batch) -> Result<Pass, Error> {
        let rows = batch.rows();
        let dest = self
            .destination
            .as_mut()
            .ok_or_else(|| Error::Answer("no destination".into()))?;
        let tokens: Vec<String> = batch
            .tables
            .iter()
            .map(|t| batch.token(self.node, t.0))
            .collect();
        for ((table, encoded, n), token) in batch.tables.into_iter().zip(tokens) {
            dest.insert(table, encoded, &token).await?;
            self.stats.sent(table, n);
        }
        let (outbox, first, last) = (self.outbox.clone(), batch.first, batch.last);
        blocking(move || outbox.acknowledge(first, last)).await?;
        if batch.missing_blocks > 0 {
            self.stats.missing_blocks.inc_by(batch.missing_blocks);
            tracing::error!(
                blocks = batch.missing_blocks,
                "sink: event blocks were deleted before they were sent to ClickHouse"
            );
        }
        Ok(Pass::Sent { rows })
    }

    async fn refresh_lag(&self) {
        let outbox = self.outbox.clone();
        if let Ok(oldest) = blocking(move || outbox.oldest()).await {
            let now = crate::support::clock::now_ms();
            let lag = oldest.map_or(0, |t| (now - t).max(0));
            self.stats.lag_seconds.set(lag as f64 / 1000.0);
        }
    }

    /// Send until `shutdown` resolves. A batch cut short by shutdown is sent again
    /// on the next start. Each pass holds `gate` for reading, so a backup that takes it
    /// for writing finds the outbox between passes and keeps it so.
    pub async fn run(mut self, gate: Arc<Gate>, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut backoff = MIN_BACKOFF;
        loop {
            let pass = tokio::select! {
                _ = &mut shutdown => return,
                pass = async {
                    let _pass = gate.read().await;
                    self.step().await
                } => pass,
            };
            let wait = match pass {
                Ok(Pass::Sent { .. }) => Duration::ZERO,
                Ok(Pass::Idle) => POLL,
                Err(_) => backoff,
            };
            backoff = match &pass {
                Ok(_) => MIN_BACKOFF,
                Err(_) => (backoff * 2).min(MAX_BACKOFF),
            };
            self.note(&pass);
            if !wait.is_zero() {
                tokio::select! {
                    _ = &mut shutdown => return,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
    }

    /// Log a change between taking rows and not, once.
    fn note(&mut self, pass: &Result<Pass, Error>) {
        let now = if pass.is_ok() {
            Health::Up
        } else {
            Health::Down
        };
        match (self.health, now, pass) {
            (Health::Down, Health::Up, _) => {
                tracing::info!("sink: ClickHouse takes rows again; catching up")
            }
            (Health::Starting | Health::Up, Health::Down, Err(e)) => tracing::warn!(
                error = %e,
                "sink: ClickHouse unavailable; changes wait in the outbox, retrying with backoff"
            ),
            (_, _, Err(e)) => tracing::debug!(error = %e, "sink: still unavailable"),
            _ => {}
        }
        self.health = now;
    }
}

/// Run a storage call on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> sled::Result<T> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(Error::Task)?
        .map_err(Error::Store)
}

/// A running worker, stopped with [`Handle::stop`].
pub struct Handle {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Handle {
    /// Stop after the current step's insert or wait, and wait for it.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Start the worker over `db`'s outbox and `trees`, reporting into `stats`, each pass
/// holding `gate` (see [`Worker::run`]). Call inside the runtime, after the store is open.
pub fn spawn(
    settings: config::Sink,
    db: &sled::Db,
    trees: &crate::store::Trees,
    stats: Stats,
    gate: Arc<Gate>,
) -> Result<Handle, Error> {
    let outbox = Outbox::open(db).map_err(Error::Store)?;
    let worker = Worker::new(settings, outbox, Sources::of(trees))?.with_stats(stats);
    tracing::info!(
        url = %worker.settings.url,
        database = %worker.settings.database,
        "sink: sending to ClickHouse"
    );
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(worker.run(gate, async {
        let _ = stopped.await;
    }));
    Ok(Handle { stop, task })
}
