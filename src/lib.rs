//! flagpost: a single-binary edge server for product analytics that PostHog's client
//! libraries talk to unchanged.
//!
//! How an event and a flag request flow through the modules:
//!
//! ```text
//! client ─HTTP─> http::server (accept, limits) ─> http::router
//!   ├─ intake paths ─> http::capture: http::body (size, deadline, memory::Budget)
//!   │     ─> http::decode (data=, form, gzip | lz64 | base64) ─> capture::parse (simd-json)
//!   │     ─> key check (projects) ─> capture::normalise ─> log::Wal (group commit into
//!   │        the log's segment files, one fdatasync per group) ─> 200
//!   │                                   │
//!   │        compactor (its own thread): log ─> persons, groups, GeoIP, dedup, lanes
//!   │                                   ─> store (sled: event blocks, persons, groups,
//!   │                                      and the outbox of each chunk's changes)
//!   │                                        ^
//!   │        sink (its own task, with --clickhouse-url): reads the store's outbox
//!   │                                   ─> ClickHouse (PostHog's tables), then acknowledges
//!   ├─ /decide, /flags ─> http::decide ─> flags (snapshot, evaluate) + store::person_cache
//!   ├─ /api/... ─> http::api ─> store::query
//!   ├─ /api/projects/<id>/feature_flags/, cohorts/ ─> http::flags_api ─> manage (the
//!   │     flag file, rewritten atomically, then published by the flag reloader)
//!   ├─ /console/ ─> http::console (page, assets, session cookie from `session`) ─> the
//!   │     same flags_api, api and decide code as above
//!   ├─ /api/surveys/, /api/early_access_features/ ─> http::surveys ─> surveys, early_access
//!   ├─ /array/<key>/config(.js), /static/ ─> http::remote_config (client_config), http::assets
//!   └─ /_liveness, /_readiness, /metrics (metrics)
//! ```
//!
//! The tree, one folder or file per stage or concern:
//!
//! ```text
//! http/       server, routing, body decoding, every response; errors -> statuses (error.rs)
//! capture/    the event model: parse, validate, normalise into a log record
//! log/        the write-ahead log: record format, segment files, group-commit writer,
//!             disk-space guard
//! compactor/  log -> events, persons, groups: its thread (worker.rs), one step, apply
//!             and splice, enrichment, lanes, retention
//! store/      the sled trees: key layouts, event blocks, dedup window, queries, the
//!             person cache, migration of older formats, the outbox (what each
//!             compactor chunk changed, committed with it) and its retention hold
//! sink/       the ClickHouse sink: reads the store's outbox and sends PostHog's
//!             tables over HTTP; the compactor does not know it exists
//! pipeline    opens the store, the log and its writer, and the compactor; closes them
//! backup/     `flagpost backup` (taken by the running server through its admin socket,
//!             or from a stopped database) and `flagpost restore`
//! flags/ persons/ geoip/ projects    flag rules, person rules, GeoIP, project keys
//! surveys/ early_access  catalog     per-project surveys and early access features, and
//!             the loader both share (`catalog`); a survey's targeting flags join its
//!             project's flag rules
//! manage      flags and cohorts changed through PostHog's REST API: the file rewrite,
//!             PostHog's validation, the activity log, the failed-authentication limit
//! session     the console's signed-in browsers: ids, tokens, idle expiry
//! client_config  what a project tells posthog-js at start (its `remote_config` switches)
//! app  config  metrics  admin        shared state, settings, Prometheus, offline commands
//! clock  memory  lz64  sync  idle  notify  watch    small helpers every layer may use
//!             (`watch`: the reload lock and change detection of the files the server
//!             reloads by itself)
//! ```
//!
//! Dependencies run one way, down this list (each module uses only modules below it;
//! none reaches up into `http`, and `config` knows no worker). The pipeline reads
//! log -> compactor -> store <- sink: the compactor and the sink share the store and
//! never name each other. The layers, that rule, and "no two files import each other"
//! are checked by `tests/integration/layers.rs`:
//!
//! ```text
//! http      -> app capture client_config clock compactor early_access flags geoip log lz64
//!              manage memory metrics persons projects session store surveys
//! app       -> catalog compactor config early_access flags geoip log manage memory metrics
//!              pipeline projects session store surveys sync watch
//! pipeline  -> compactor config geoip log projects store
//! admin     -> catalog early_access flags geoip projects store surveys watch
//! backup    -> config log store sync
//! metrics   -> capture sink sync
//! compactor -> clock config geoip idle log persons projects store
//! sink      -> clock config persons store sync
//! store     -> clock config notify persons sync
//! persons   -> capture
//! capture   -> clock log (and lz64 in its tests)
//! log       -> idle sync
//! config    -> geoip
//! surveys   -> catalog flags
//! early_access -> catalog
//! catalog   -> watch
//! manage    -> flags sync watch
//! flags     -> sync watch
//! geoip     -> sync
//! session   -> sync
//! projects  -> client_config
//! watch     -> sync
//! client_config, clock, memory, lz64, sync, idle, notify -> nothing of the crate
//! ```
//!
//! The same test keeps every source file to 500 lines or fewer: a longer one is split
//! by concern.
//!
//! `app::App` is the state the handlers share; `config::Config` is everything the
//! binary's flags decide; `notify` tells systemd when serving starts, reloads and
//! stops. The binary (`main.rs`) only parses flags and calls [`run`].

pub mod admin;
pub mod app;
pub mod backup;
pub mod capture;
pub mod catalog;
pub mod client_config;
pub mod clock;
pub mod compactor;
pub mod config;
pub mod early_access;
pub mod flags;
pub mod geoip;
pub mod http;
pub mod idle;
pub mod log;
pub mod lz64;
pub mod manage;
pub mod memory;
pub mod metrics;
pub mod notify;
pub mod persons;
pub mod pipeline;
pub mod projects;
pub mod session;
pub mod sink;
pub mod store;
pub mod surveys;
pub mod sync;
mod watch;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::TcpListener;

pub use config::Config;

/// Why the server could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("projects: {0}")]
    Projects(projects::Error),
    #[error("{0}")]
    GeoIp(geoip::Error),
    #[error("{0}")]
    Store(store::Error),
    #[error("{0}")]
    Io(std::io::Error),
    /// The listen address could not be bound.
    #[error("cannot listen on {0}: {1}; {advice}", advice = listen_advice(.1))]
    Listen(std::net::SocketAddr, std::io::Error),
    /// The database directory could not be created, written or locked.
    #[error("database {}: {problem}; {advice}", dir.display())]
    Database {
        dir: PathBuf,
        problem: String,
        advice: &'static str,
    },
}

/// What to do about an address that could not be bound.
fn listen_advice(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            "another process (another flagpost?) is listening there: stop it, or choose another address with --listen"
        }
        std::io::ErrorKind::PermissionDenied => {
            "ports below 1024 need privileges: listen on a higher port behind nginx"
        }
        std::io::ErrorKind::AddrNotAvailable => {
            "this machine has no such address: choose one of its own with --listen"
        }
        _ => "choose another address with --listen",
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

/// Bind the configured address and serve until SIGTERM or SIGINT; SIGHUP reloads
/// projects, flag rules and the GeoIP database.
pub async fn run(config: Config) -> Result<(), Error> {
    // Handlers are installed before anything is announced, so a signal sent as soon
    // as the server says it is listening is never met by the default action.
    let shutdown = shutdown_signal()?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| Error::Listen(config.listen, e))?;
    serve(config, listener, shutdown).await
}

/// Serve on an already-bound listener until `shutdown` resolves, then finish
/// in-flight requests, write everything acknowledged and close the store.
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let projects_file = app::Watched::default();
    let projects =
        app::read_projects(&config.projects_file(), &projects_file).map_err(Error::Projects)?;
    let projects = Arc::new(arc_swap::ArcSwap::from_pointee(projects));
    let geoip = Arc::new(open_geoip(&config).await?);
    check_static_dir(&config)?;
    let metrics = metrics::Metrics::new();
    let sink_stats = metrics.sink.clone();
    let flushes = metrics.wal_flush_seconds.clone();
    let on_flush: log::writer::FlushObserver = Box::new(move |d| flushes.observe(d.as_secs_f64()));
    let (db_dir, cache, segment, shared, settings, enrich) = (
        config.db_dir.clone(),
        config.cache_bytes,
        config.log_segment_bytes,
        projects.clone(),
        config.compactor.clone(),
        geoip.clone(),
    );
    store::check::report_sled_panics(&config.db_dir);
    let pipeline = tokio::task::spawn_blocking(move || {
        prepare_db_dir(&db_dir)?;
        pipeline::Pipeline::open(&db_dir, cache, segment, shared, settings, enrich, on_flush)
            .map_err(|e| database_error(&db_dir, e))
    })
    .await
    .map_err(|e| Error::Io(std::io::Error::other(e)))??;
    // The ClickHouse sink, when configured (src/sink). It holds the database for its
    // life, so with it a database that failed writing is healed by a restart (the
    // reopen gives up and /_liveness fails) rather than in place.
    let open = pipeline
        .store
        .get()
        .ok_or_else(|| Error::Io(std::io::Error::other("database closed")))?;
    let sink_gate = config
        .sink
        .as_ref()
        .map(|_| Arc::new(sync::Gate::default()));
    let sink = match (config.sink.clone(), &sink_gate) {
        (Some(s), Some(gate)) => Some(
            sink::worker::spawn(s, &open.db, &open.trees, sink_stats, gate.clone())
                .map_err(|e| Error::Io(std::io::Error::other(e.to_string())))?,
        ),
        _ => None,
    };
    drop(open);
    // `flagpost backup` asks through this socket (src/backup).
    let admin = backup::socket::listen(backup::Running {
        db_dir: config.db_dir.clone(),
        store: pipeline.store.clone(),
        log: pipeline.log.clone(),
        compactor_gate: pipeline.compactor_gate.clone(),
        sink_gate,
    })?;
    let flags_dir = config.flags_dir();
    // The rules module logs what it loaded and every file it could not.
    let (rules, _report) = tokio::task::spawn_blocking(move || flags::Rules::load(&flags_dir))
        .await
        .map_err(|e| Error::Io(std::io::Error::other(e)))?;
    let app = app::App::new(config, projects, rules, geoip, metrics, &pipeline);
    let app = Arc::new(app.with_projects_file(projects_file));
    // Surveys and early access features, then the flags the surveys add to the rules.
    let loader = app.clone();
    tokio::task::spawn_blocking(move || {
        if loader.reload_surveys_and_features(true) {
            loader.rules.reload(&loader.config.flags_dir());
        }
    })
    .await
    .map_err(|e| Error::Io(std::io::Error::other(e)))?;
    let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let reloader = tokio::spawn(reload_on_sighup(app.clone(), hangup));
    let watcher = tokio::spawn(watch_flags(app.clone()));
    let space = tokio::spawn(watch_space(app.clone()));
    let watchdog =
        notify::watchdog_interval().map(|every| tokio::spawn(watchdog(app.clone(), every)));

    tracing::info!(
        projects = app.projects.load().len(),
        db = %app.config.db_dir.display(),
        "listening on {}",
        listener.local_addr()?
    );
    notify::ready();
    let shutdown = async {
        shutdown.await;
        notify::stopping();
    };
    http::server::run(listener, app.clone(), shutdown).await;

    reloader.abort();
    watcher.abort();
    space.abort();
    if let Some(watchdog) = watchdog {
        watchdog.abort();
    }
    admin.close();
    if let Some(sink) = sink {
        sink.stop().await;
    }
    drop(app);
    tokio::task::spawn_blocking(move || pipeline.close())
        .await
        .map_err(|e| Error::Io(std::io::Error::other(e)))?
        .map_err(Error::Store)?;
    tracing::info!("stopped cleanly");
    Ok(())
}

/// What to do when the database directory cannot be created or written.
const DB_DIR_ADVICE: &str =
    "the server's user must be able to create and write it: fix its permissions, or choose another --db";

/// Create the database directory if needed and make sure it can be written, so that a
/// failure names the directory rather than surfacing from inside the store.
fn prepare_db_dir(dir: &Path) -> Result<(), Error> {
    let problem = |what: &str, e: std::io::Error| Error::Database {
        dir: dir.to_owned(),
        problem: format!("{what}: {e}"),
        advice: DB_DIR_ADVICE,
    };
    std::fs::create_dir_all(dir).map_err(|e| problem("cannot create it", e))?;
    let probe = dir.join(".flagpost-write-test");
    std::fs::write(&probe, b"")
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| problem("cannot write in it", e))
}

/// A store that would not open, with the directory and what to do.
fn database_error(dir: &Path, e: store::Error) -> Error {
    if e.is_locked() {
        return Error::Database {
            dir: dir.to_owned(),
            problem: "already in use by another flagpost".into(),
            advice: "stop that server first, or give this one its own --db",
        };
    }
    if store::live::is_disk_full(&e) {
        return Error::Database {
            dir: dir.to_owned(),
            problem: "the disk is full".into(),
            advice: "free space on its disk and start again (under systemd the service is \
                     restarted by itself); nothing acknowledged is lost",
        };
    }
    Error::Database {
        dir: dir.to_owned(),
        problem: e.to_string(),
        advice:
            "it must be a flagpost database the server's user can write (or an empty directory)",
    }
}

/// Install the SIGTERM and SIGINT handlers now; the future resolves on either.
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    })
}

async fn reload_on_sighup(app: Arc<app::App>, mut hup: tokio::signal::unix::Signal) {
    while hup.recv().await.is_some() {
        tracing::info!("SIGHUP received: reloading");
        notify::reloading();
        reload_files(&app, true).await;
        notify::ready();
    }
}

/// Open the GeoIP database. A file the operator named must open; the default file
/// is optional, and without it GeoIP is off (said once, here).
async fn open_geoip(config: &Config) -> Result<geoip::Database, Error> {
    let (path, named) = config.geoip_file();
    if !named && !path.exists() {
        tracing::info!(
            "GeoIP is off: no database at {} (docs/operating.md, GeoIP, says how to add one)",
            path.display()
        );
        return Ok(geoip::Database::disabled());
    }
    let db = tokio::task::spawn_blocking(move || geoip::Database::open(&path))
        .await
        .map_err(|e| Error::Io(std::io::Error::other(e)))?
        .map_err(Error::GeoIp)?;
    tracing::info!(file = ?db.path(), "GeoIP is on");
    Ok(db)
}

/// A static directory the operator named must exist; the default one is optional
/// (without it `/static/` answers 404 and the first such request logs a hint).
fn check_static_dir(config: &Config) -> Result<(), Error> {
    let (dir, named) = config.static_dir();
    if dir.is_dir() {
        tracing::info!(dir = %dir.display(), "serving posthog-js's files at /static/");
    } else if named {
        return Err(Error::Io(std::io::Error::other(format!(
            "--static-dir {} is not a directory",
            dir.display()
        ))));
    }
    Ok(())
}

/// How often free disk space is measured.
const SPACE_POLL: std::time::Duration = std::time::Duration::from_secs(1);

async fn watch_space(app: Arc<app::App>) {
    loop {
        let (a, dir) = (app.clone(), app.config.db_dir.clone());
        let _ = tokio::task::spawn_blocking(move || a.space.check(&dir)).await;
        tokio::time::sleep(SPACE_POLL).await;
    }
}

/// Tell systemd's watchdog the server is alive, twice per interval, for as long as
/// every component is working or recovering by itself ([`app::App::is_live`]); once one
/// cannot, stop, so systemd restarts the service (`WatchdogSec=` with `Restart=`).
async fn watchdog(app: Arc<app::App>, every: std::time::Duration) {
    let mut said_dead = false;
    loop {
        if app.is_live() {
            notify::watchdog();
        } else if !said_dead {
            said_dead = true;
            tracing::error!(
                "not alive: the systemd watchdog is no longer fed, so the service is restarted"
            );
        }
        tokio::time::sleep(every / 2).await;
    }
}

/// How often the flag files are checked for changes: well within the promised second.
const FLAGS_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// Reload the projects when `projects.json` changes, the flag rules whenever a file in
/// the flags directory does, the surveys and early access features when theirs do,
/// and the GeoIP database when its file does.
async fn watch_flags(app: Arc<app::App>) {
    loop {
        tokio::time::sleep(FLAGS_POLL).await;
        reload_files(&app, false).await;
    }
}

/// Reload `projects.json`, the flag rules (after the surveys and early access files,
/// whose surveys add flags) and the GeoIP database, always or only what changed, on the
/// blocking pool (all read files). Each keeps its previous version when its file is bad.
async fn reload_files(app: &Arc<app::App>, always: bool) {
    let (app, dir) = (app.clone(), app.config.flags_dir());
    let _ = tokio::task::spawn_blocking(move || {
        let projects = match always {
            true => Some(app.reload_projects()),
            false => app.reload_projects_if_changed(),
        };
        if let Some(Err(e)) = projects {
            tracing::warn!(error = %e, "projects not reloaded; keeping the previous ones");
        }
        let geoip = if always {
            app.geoip.reload()
        } else {
            app.geoip.reload_if_changed().map(|_| ())
        };
        if let Err(e) = geoip {
            tracing::warn!("GeoIP database not reloaded, previous one kept: {e}");
        }
        app.reload_surveys_and_features(always);
        if always {
            app.rules.reload(&dir);
        } else {
            app.rules.reload_if_changed(&dir);
        }
    })
    .await;
}
