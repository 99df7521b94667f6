//! The state every request handler and background task shares.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::sync::Semaphore;

use crate::compactor;
use crate::config::Config;
use crate::log::Wal;
use crate::metrics::Metrics;
use crate::projects::catalog::Catalog;
use crate::projects::early_access::ProjectFeatures;
use crate::projects::surveys::ProjectSurveys;
use crate::projects::Projects;
use crate::store::live::Live;
use crate::support::memory::Budget;
use crate::support::watch::Pass;
pub(crate) use crate::support::watch::Watched;

/// Large or compressed payloads are decoded and parsed on the blocking pool, at most
/// this many at once (one per core of the small VMs this runs on): each can hold up
/// to a few times the decompressed cap in memory while it works.
const HEAVY_DECODES: usize = 2;

pub struct App {
    pub config: Config,
    /// Replaced whole when `projects.json` changes (or on SIGHUP); readers take a
    /// cheap snapshot per request.
    pub projects: Arc<ArcSwap<Projects>>,
    /// What the last read of `projects.json` saw; also serialises its reloads.
    projects_file: Watched,
    /// Why the last reload of `projects.json` kept the previous projects, if it did.
    pub projects_problem: Mutex<Option<String>>,
    pub wal: Wal,
    /// The log's positions, for its depth.
    pub log: Arc<crate::log::Shared>,
    /// Persons for `/decide`, kept current by the compactor.
    pub persons: Arc<crate::store::person_cache::PersonCache>,
    /// The database; empty for a moment while the compactor reopens it.
    pub store: Arc<Live>,
    pub compactor: Arc<compactor::Stats>,
    /// Free disk space, measured every second by a background task.
    pub space: crate::log::space::Space,
    /// The log's size against its bound, measured at each capture request.
    pub backlog: crate::log::backlog::Backlog,
    pub metrics: Metrics,
    /// The published flag rules; swapped whole by the reloader.
    pub rules: crate::flags::Rules,
    /// Shared with the compactor; swaps its reader internally on reload.
    pub geoip: Arc<crate::geoip::Database>,
    /// Surveys and early access features by project; each swapped whole on reload.
    pub surveys: Catalog<ProjectSurveys>,
    pub early_access: Catalog<ProjectFeatures>,
    pub budget: Budget,
    pub heavy_decodes: Arc<Semaphore>,
    /// The definitions feed's bodies, rebuilt when a project's rules change.
    pub feed: crate::flags::feed::Cache,
    /// Flags and cohorts changed through the management API.
    pub manage: crate::manage::Store,
    /// Failed authentications with personal API keys, on any endpoint, by client address.
    pub failed_auth: crate::manage::FailedAuth,
    /// The console's signed-in browsers.
    pub sessions: crate::manage::session::Sessions,
    /// Edge mode's connection to upstream (`--upstream`); `None` when off.
    pub upstream: Option<crate::edge::Client>,
    /// What the forwarder still owes upstream, which bounds capture in edge mode.
    pub upstream_backlog: crate::edge::Backlog,
    /// Edge mode's spool of session recordings (`/s/`); `None` when off.
    pub recordings: Option<Arc<crate::edge::recordings::Spool>>,
    /// Edge mode's copies of upstream's remote config, surveys and early access.
    pub upstream_cache: Option<Arc<crate::edge::cache::Cache>>,
    /// The forwarder's latest figures (backlog, lag, paused projects), for the console.
    pub upstream_figures: Arc<Mutex<crate::edge::forward::Figures>>,
    /// The flags upstream answers beyond its definitions feed, learned per project.
    pub upstream_flags: crate::edge::fallback::Learned,
    /// Each synced project's flag sync state, for the health page.
    pub flag_sync: crate::edge::sync::Board,
    /// When serving started, for the console's uptime.
    pub started: std::time::Instant,
    /// Set at shutdown: readiness turns 503 so load balancers stop sending.
    draining: AtomicBool,
}

impl App {
    pub fn new(
        config: Config,
        projects: Arc<ArcSwap<Projects>>,
        rules: crate::flags::Rules,
        geoip: Arc<crate::geoip::Database>,
        metrics: Metrics,
        pipeline: &crate::pipeline::Pipeline,
    ) -> App {
        let budget = Budget::new(config.limits.max_inflight_body_bytes);
        let space = crate::log::space::Space::new(config.min_free_disk_bytes);
        // Measured once before serving: a start on a full disk refuses from the first
        // request, not from the first of the watcher's measurements.
        space.check(&config.db_dir);
        let backlog = crate::log::backlog::Backlog::new(config.max_log_bytes);
        backlog.check(pipeline.log.bytes());
        let manage = crate::manage::Store::new(config.flags_dir(), &config.db_dir);
        let upstream_backlog =
            crate::edge::Backlog::new(config.upstream.as_ref().and_then(|u| u.max_backlog_bytes));
        App {
            config,
            projects,
            projects_file: Watched::default(),
            projects_problem: Mutex::new(None),
            wal: pipeline.wal.clone(),
            log: pipeline.log.clone(),
            persons: pipeline.persons.clone(),
            store: pipeline.store.clone(),
            compactor: pipeline.compactor.clone(),
            space,
            backlog,
            metrics,
            rules,
            geoip,
            surveys: Catalog::default(),
            early_access: Catalog::default(),
            budget,
            heavy_decodes: Arc::new(Semaphore::new(HEAVY_DECODES)),
            feed: Default::default(),
            manage,
            failed_auth: Default::default(),
            sessions: Default::default(),
            upstream: None,
            upstream_backlog,
            recordings: None,
            upstream_cache: None,
            upstream_figures: Arc::default(),
            upstream_flags: Default::default(),
            flag_sync: Default::default(),
            started: std::time::Instant::now(),
            draining: AtomicBool::new(false),
        }
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Whether new events may be acknowledged: the log accepts writes, the compactor
    /// is not failing (acknowledging into a log nobody drains would only grow the
    /// backlog) nor too far behind, and the disk has room.
    pub fn accepts_writes(&self) -> bool {
        self.wal.stats().writable.load(Ordering::Relaxed) && !self.refuses_events()
    }

    /// Whether capture refuses new events up front: the compactor is failing or too
    /// far behind the log, or the disk is nearly full. A failed log write is not
    /// among them: the next append retries it. Measures the log, so capture's own
    /// requests keep the backlog's state current between scrapes.
    pub fn refuses_events(&self) -> bool {
        self.backlog.check(self.log.bytes());
        !self.compactor.healthy.load(Ordering::Relaxed)
            || !self.space.is_ok()
            || !self.backlog.is_ok()
    }

    /// Whether capture answers 503 to new events: [`App::refuses_events`], or in edge
    /// mode the upstream backlog past `--upstream-max-backlog`. Readiness does not
    /// look at the latter: an edge whose upstream is behind still serves flags.
    pub fn refuses_capture(&self) -> bool {
        self.refuses_events() || self.upstream_backlog.over()
    }

    /// Alive: every component is working or recovering by itself. False once one
    /// cannot (the compactor panicked, the database cannot be reopened): only a
    /// restart helps, and `/_liveness` and the systemd watchdog ask for one.
    pub fn is_live(&self) -> bool {
        self.store.is_live()
    }

    /// A lookup in the database; while it is being reopened, an error the callers
    /// already treat as a failed lookup.
    pub fn with_trees<T>(
        &self,
        lookup: impl FnOnce(&crate::store::Trees) -> Result<T, sled::Error>,
    ) -> Result<T, sled::Error> {
        let open = self
            .store
            .get()
            .ok_or_else(|| sled::Error::Unsupported("the database is being reopened".into()))?;
        lookup(&open.trees)
    }

    /// Ready to take traffic: not draining and accepting writes.
    pub fn is_ready(&self) -> bool {
        !self.is_draining() && self.accepts_writes()
    }

    /// Re-read the surveys and early access files, always or only what changed, and
    /// hand the surveys' targeting flags to the flag rules. True when those flags
    /// changed: the rules then need a reload (`reload_if_changed` does it by itself).
    /// Blocks on file reads. Each catalog logs its own failures.
    pub fn reload_surveys_and_features(&self, always: bool) -> bool {
        let (surveys, features) = (self.config.surveys_dir(), self.config.early_access_dir());
        if always {
            self.early_access.reload(&features);
            self.surveys.reload(&surveys);
        } else {
            self.early_access.reload_if_changed(&features);
            self.surveys.reload_if_changed(&surveys);
        }
        // Handed over on every pass, not only after a change: of two reloads racing
        // (SIGHUP and the poller), the later hand-over is then always of the newest file.
        self.rules
            .set_generated(crate::projects::surveys::generated(&self.surveys))
    }

    /// Re-read `projects.json`; a bad file keeps the current projects.
    pub fn reload_projects(&self) -> Result<(), crate::projects::Error> {
        let file = vec![self.config.projects_file()];
        self.projects_file
            .reload(Ok(file), |pass| self.reload_projects_locked(pass))
    }

    /// Re-read `projects.json` if it changed since the last read (as the flag files
    /// are); `None` when it did not. Blocks on file reads.
    pub fn reload_projects_if_changed(&self) -> Option<Result<(), crate::projects::Error>> {
        let file = vec![self.config.projects_file()];
        self.projects_file
            .reload_if_changed(Ok(file), |pass| self.reload_projects_locked(pass))
    }

    fn reload_projects_locked(
        &self,
        pass: &mut Pass<'_, ()>,
    ) -> Result<(), crate::projects::Error> {
        let read = parse_projects(&self.config.projects_file(), pass);
        *crate::support::sync::lock(&self.projects_problem) =
            read.as_ref().err().map(|e| e.to_string());
        let projects = read?;
        tracing::info!(projects = projects.len(), "projects reloaded");
        self.projects.store(Arc::new(projects));
        Ok(())
    }

    /// The same state with `file` as what the first read of `projects.json` saw (see
    /// [`read_projects`]), so the poller does not read an unchanged file again.
    pub(crate) fn with_projects_file(self, file: Watched) -> App {
        App {
            projects_file: file,
            ..self
        }
    }
}

/// Read `projects.json`, recording what was read in `file`, even when the file is bad:
/// it is not read again until it changes.
pub(crate) fn read_projects(
    path: &Path,
    file: &Watched,
) -> Result<Projects, crate::projects::Error> {
    file.reload(Ok(vec![path.to_path_buf()]), |pass| {
        parse_projects(path, pass)
    })
}

fn parse_projects(
    path: &Path,
    pass: &mut Pass<'_, ()>,
) -> Result<Projects, crate::projects::Error> {
    let read = Projects::load_bytes(path);
    if let Ok(bytes) = &read {
        pass.read(path, bytes);
    }
    Projects::parse_file(path, &read?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An app over a fresh pipeline for `config`, with no projects, rules or GeoIP.
    fn open(config: Config) -> (App, crate::pipeline::Pipeline) {
        let projects = Arc::new(ArcSwap::from_pointee(Projects::default()));
        let geoip = Arc::new(crate::geoip::Database::disabled());
        let pipeline = crate::pipeline::Pipeline::open(
            &config,
            projects.clone(),
            geoip.clone(),
            Box::new(|_| {}),
        )
        .unwrap();
        let app = App::new(
            config,
            projects,
            crate::flags::Rules::new(),
            geoip,
            Metrics::new(),
            &pipeline,
        );
        (app, pipeline)
    }

    #[test]
    fn readiness_follows_the_log_the_compactor_the_disk_and_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::new(dir.path().join("data"), dir.path().join("db"));
        let (mut app, pipeline) = open(config);
        assert!(app.is_ready() && app.accepts_writes());
        // The live compactor thread sets its health after every step; stats of its own
        // let the test hold the failing state without racing it.
        app.compactor = Arc::new(compactor::Stats {
            healthy: AtomicBool::new(true),
            ..compactor::Stats::default()
        });
        assert!(app.is_ready() && app.accepts_writes());
        // A failing compactor: no new writes, not ready.
        app.compactor.healthy.store(false, Ordering::SeqCst);
        assert!(!app.accepts_writes() && !app.is_ready());
        app.compactor.healthy.store(true, Ordering::SeqCst);
        // A failing log write.
        app.wal.stats().writable.store(false, Ordering::SeqCst);
        assert!(!app.accepts_writes() && !app.is_ready());
        app.wal.stats().writable.store(true, Ordering::SeqCst);
        // Draining at shutdown: not ready, though writes in flight still finish.
        app.start_draining();
        assert!(!app.is_ready() && app.accepts_writes());
        drop(app);
        pipeline.close().unwrap();
    }

    #[test]
    fn the_upstream_backlog_bounds_capture_not_readiness() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::new(dir.path().join("data"), dir.path().join("db"));
        let mut upstream = crate::config::Upstream::new("http://127.0.0.1:9");
        upstream.max_backlog_bytes = Some(1000);
        config.upstream = Some(upstream);
        let (app, pipeline) = open(config);
        assert!(!app.refuses_capture());
        app.upstream_backlog.set(1000, 7);
        assert!(app.refuses_capture() && !app.refuses_events());
        // The edge keeps serving flags while upstream is behind.
        assert!(app.is_ready());
        // Drained below the bound: capture accepts again by itself.
        app.upstream_backlog.set(999, 6);
        assert!(!app.refuses_capture() && app.is_ready());
        drop(app);
        pipeline.close().unwrap();
    }
}
