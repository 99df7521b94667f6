//! flagpost: a single-binary edge server for product analytics that PostHog's client
//! libraries talk to unchanged.
//!
//! How a request flows through the modules:
//!
//! ```text
//! client ─HTTP─> http::server (accept, limits) ─> http::router
//!   ├─ intake paths ─> http::capture: http::body (size, deadline, memory budget)
//!   │     ─> http::decode (data=, form, gzip | lz64 | base64) ─> capture::parse (simd-json)
//!   │     ─> key check (projects) ─> capture::normalise ─> store::wal (group-commit fsync) ─> 200
//!   └─ /_liveness, /_readiness, /metrics (metrics)
//! ```
//!
//! `app::App` is the state they share; `config::Config` is everything the binary's
//! flags decide. The binary (`main.rs`) only parses flags and calls [`run`].

pub mod app;
pub mod capture;
pub mod config;
pub mod flags;
pub mod http;
pub mod metrics;
pub mod persons;
pub mod projects;
pub mod store;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

pub use config::Config;

/// Why the server could not start or stop cleanly.
#[derive(Debug)]
pub enum Error {
    Projects(projects::Error),
    Store(store::Error),
    Io(std::io::Error),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Projects(e) => write!(f, "projects: {e}"),
            Error::Store(e) => write!(f, "{e}"),
            Error::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

/// Bind the configured address and serve until SIGTERM or SIGINT; SIGHUP reloads
/// the projects file.
pub async fn run(config: Config) -> Result<(), Error> {
    let listener = TcpListener::bind(config.listen).await?;
    serve(config, listener, shutdown_signal()).await
}

/// Serve on an already-bound listener until `shutdown` resolves, then finish
/// in-flight requests, write everything acknowledged and close the store.
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let projects = projects::Projects::load(&config.projects_file()).map_err(Error::Projects)?;
    let projects = Arc::new(arc_swap::ArcSwap::from_pointee(projects));
    let (db_dir, shared, settings) = (
        config.db_dir.clone(),
        projects.clone(),
        config.compactor.clone(),
    );
    let store = tokio::task::spawn_blocking(move || store::Store::open(&db_dir, shared, settings))
        .await
        .map_err(|e| Error::Io(std::io::Error::other(e)))?
        .map_err(Error::Store)?;
    let flags_dir = config.flags_dir();
    let (rules, report) = tokio::task::spawn_blocking(move || flags::Rules::load(&flags_dir))
        .await
        .map_err(|e| Error::Io(std::io::Error::other(e)))?;
    log_reload(&report);
    let app = Arc::new(app::App::new(config, projects, rules, &store));
    let reloader = tokio::spawn(reload_on_sighup(app.clone()));
    let watcher = tokio::spawn(watch_flags(app.clone()));

    tracing::info!(
        projects = app.projects.load().len(),
        db = %app.config.db_dir.display(),
        "listening on {}",
        listener.local_addr()?
    );
    http::server::run(listener, app.clone(), shutdown).await;

    reloader.abort();
    watcher.abort();
    drop(app);
    tokio::task::spawn_blocking(move || store.close())
        .await
        .map_err(|e| Error::Io(std::io::Error::other(e)))?
        .map_err(Error::Store)?;
    tracing::info!("stopped cleanly");
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
}

async fn reload_on_sighup(app: Arc<app::App>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot install the SIGHUP handler; reload by restarting");
        return;
    };
    while hup.recv().await.is_some() {
        tracing::info!("SIGHUP received: reloading");
        if let Err(e) = app.reload_projects() {
            tracing::warn!(error = %e, "projects not reloaded; keeping the previous ones");
        }
        let (app, dir) = (app.clone(), app.config.flags_dir());
        if let Ok(report) = tokio::task::spawn_blocking(move || app.rules.reload(&dir)).await {
            log_reload(&report);
        }
    }
}

/// How often the flag files are checked for changes: well within the promised second.
const FLAGS_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// Reload the flag rules whenever a file in the flags directory changes.
async fn watch_flags(app: Arc<app::App>) {
    loop {
        tokio::time::sleep(FLAGS_POLL).await;
        let (app, dir) = (app.clone(), app.config.flags_dir());
        if let Ok(Some(report)) =
            tokio::task::spawn_blocking(move || app.rules.reload_if_changed(&dir)).await
        {
            log_reload(&report);
        }
    }
}

fn log_reload(report: &flags::ReloadReport) {
    for error in &report.errors {
        tracing::warn!("flag rules not loaded, previous rules kept: {error}");
    }
    for warning in &report.warnings {
        tracing::warn!("flag disabled: {warning}");
    }
    tracing::info!(
        version = report.version,
        projects = report.loaded.len(),
        "flag rules published"
    );
}
