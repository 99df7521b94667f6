//! Running the service: [`run`] binds the configured address and serves until SIGTERM
//! or SIGINT; [`serve`] does the rest on a listener already bound (as tests do). In
//! order it loads projects, GeoIP and the flag rules, opens the write pipeline
//! ([`crate::pipeline`], with the ClickHouse sink when configured), starts the admin
//! socket and the background loops (`loops`), and serves HTTP; at shutdown it stops the
//! same things in reverse and waits for each. Startup failures an operator can fix
//! come back as an [`Error`] that says how (`error`).

mod error;
mod loops;
mod sync;

use std::future::Future;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;

use crate::config::Config;
use crate::pipeline::Pipeline;
use crate::support::notify;
use crate::{app, backup, flags, geoip, http, log, metrics, projects, store};

pub use error::Error;
use error::{database_error, prepare_db_dir};
use loops::Loops;

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
/// in-flight requests, stop the background loops and workers, write everything
/// acknowledged and close the store.
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    // Tests bind port 0: the links `http::links` falls back to name the real port.
    let mut config = config;
    if let Ok(bound) = listener.local_addr() {
        config.listen = bound;
    }
    let projects_file = app::Watched::default();
    let projects =
        app::read_projects(&config.projects_file(), &projects_file).map_err(Error::Projects)?;
    let projects = Arc::new(ArcSwap::from_pointee(projects));
    let geoip = Arc::new(open_geoip(&config).await?);
    check_static_dir(&config)?;
    let metrics = metrics::Metrics::new();
    let pipeline = open_pipeline(config.clone(), projects.clone(), geoip.clone(), &metrics).await?;
    // `flagpost backup` asks through this socket (src/backup).
    let admin = backup::socket::listen(backup::Running {
        db_dir: config.db_dir.clone(),
        store: pipeline.store.clone(),
        log: pipeline.log.clone(),
        compactor_gate: pipeline.compactor_gate.clone(),
        sink_gate: pipeline.sink_gate.clone(),
    })?;
    let flags_dir = config.flags_dir();
    let default_flags = config.data_dir.join("flags");
    for problem in [
        crate::manage::place::unwritable(&flags_dir),
        crate::manage::place::left_behind(&default_flags, &flags_dir),
    ]
    .into_iter()
    .flatten()
    {
        tracing::warn!("{problem}");
    }
    // The rules module logs what it loaded and every file it could not.
    let (rules, _report) = blocking(move || flags::Rules::load(&flags_dir)).await?;
    let upstream = match &config.upstream {
        Some(u) => Some(crate::edge::Client::new(&u.url).map_err(Error::Upstream)?),
        None => None,
    };
    let mut app = app::App::new(config, projects, rules, geoip, metrics, &pipeline);
    if let Some(client) = &upstream {
        let dir = app.config.db_dir.join("upstream");
        app.recordings = Some(Arc::new(crate::edge::recordings::Spool::new(&dir)));
        app.upstream_cache = Some(Arc::new(crate::edge::cache::Cache::new(
            client.clone(),
            dir.join("cache"),
            app.metrics.upstream.clone(),
        )));
    }
    app.upstream = upstream;
    let app = Arc::new(app.with_projects_file(projects_file));
    // Surveys and early access features, then the flags the surveys add to the rules.
    let loader = app.clone();
    blocking(move || {
        if loader.reload_surveys_and_features(true) {
            loader.rules.reload(&loader.config.flags_dir());
        }
    })
    .await?;
    let sync = sync::start(&app).await;
    let loops = Loops::start(&app, sync)?;

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

    loops.stop().await;
    admin.close();
    drop(app);
    blocking(move || pipeline.close())
        .await?
        .map_err(Error::Store)?;
    tracing::info!("stopped cleanly");
    Ok(())
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

/// Run blocking work (reading files, opening or closing the store) on the blocking
/// pool. The one place where a blocking task that failed (panicked) becomes an error.
async fn blocking<T, F>(work: F) -> Result<T, Error>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::Io(std::io::Error::other(e)))
}

/// Open the database directory and the pipeline on it (the store, the log and its
/// writer, the compactor), then start the ClickHouse sink when one is configured.
async fn open_pipeline(
    config: Config,
    projects: Arc<ArcSwap<projects::Projects>>,
    geoip: Arc<geoip::Database>,
    metrics: &metrics::Metrics,
) -> Result<Pipeline, Error> {
    let flushes = metrics.wal_flush_seconds.clone();
    let on_flush: log::writer::FlushObserver = Box::new(move |d| flushes.observe(d.as_secs_f64()));
    store::check::report_sled_panics(&config.db_dir);
    let sink = config.sink.clone();
    let upstream = config.upstream.is_some();
    let mut pipeline = blocking(move || {
        prepare_db_dir(&config.db_dir)?;
        Pipeline::open(&config, projects, geoip, on_flush)
            .map_err(|e| database_error(&config.db_dir, e))
    })
    .await??;
    // The outbox's readers: an entry goes once each of these has passed it.
    let readers: Vec<&str> = [
        (sink.is_some(), store::outbox::SINK),
        (upstream, store::outbox::FORWARD),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect();
    if let (false, Some(open)) = (readers.is_empty(), pipeline.store.get()) {
        let outbox = store::outbox::Outbox::from_tree(open.trees.outbox.clone());
        blocking(move || outbox.set_readers(&readers))
            .await?
            .map_err(|e| Error::Store(e.into()))?;
    }
    if let Some(settings) = sink {
        pipeline
            .start_sink(settings, metrics.sink.clone())
            .map_err(Error::Sink)?;
    }
    Ok(pipeline)
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
    let db = blocking(move || geoip::Database::open(&path))
        .await?
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
