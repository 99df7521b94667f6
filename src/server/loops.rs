//! The server's background loops: reloading on SIGHUP, polling the files the server
//! reloads by itself, measuring free disk space, and feeding systemd's watchdog. They
//! share one stop signal; [`Loops::stop`] raises it and waits for each loop, so none is
//! left running (or half-way through a reload) while the store closes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::app::App;
use crate::support::notify;

/// The forwarder starts over this long after its storage failed.
const FORWARD_RETRY: Duration = Duration::from_secs(1);

/// How often free disk space is measured.
const SPACE_POLL: Duration = Duration::from_secs(1);

/// How often the flag files are checked for changes: well within the promised second.
const FLAGS_POLL: Duration = Duration::from_millis(250);

/// The running loops and the signal that stops them.
pub(super) struct Loops {
    stop: watch::Sender<bool>,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
}

impl Loops {
    /// Start every loop over `app`. The SIGHUP handler is installed here, before the
    /// server says it is ready, so an early SIGHUP reloads rather than kills.
    pub(super) fn start(
        app: &Arc<App>,
        sync: Option<Arc<crate::edge::sync::Syncer>>,
    ) -> std::io::Result<Loops> {
        let hangup = signal(SignalKind::hangup())?;
        let (stop, _) = watch::channel(false);
        let mut loops = Loops {
            stop,
            tasks: Vec::new(),
        };
        let stopping = loops.stopping();
        loops.spawn(
            "SIGHUP reload",
            reload_on_sighup(app.clone(), sync.clone(), hangup, stopping),
        );
        let stopping = loops.stopping();
        loops.spawn(
            "file watch",
            watch_files(app.clone(), sync.clone(), stopping),
        );
        let stopping = loops.stopping();
        loops.spawn("disk space", watch_space(app.clone(), stopping));
        if let (Some(spool), Some(client)) = (&app.recordings, &app.upstream) {
            let (spool, client) = (spool.clone(), client.clone());
            let worker = crate::edge::recordings::worker::run(
                spool,
                client,
                app.metrics.upstream.clone(),
                loops.stop.subscribe(),
            );
            loops.spawn("recordings forward", worker);
        }
        if app.upstream.is_some() {
            let stopping = loops.stopping();
            loops.spawn("upstream forwarder", forward_events(app.clone(), stopping));
        }
        if let Some(sync) = sync {
            let stop = loops.stop.subscribe();
            loops.spawn("flag sync", sync.run(stop));
        }
        if let Some(every) = notify::watchdog_interval() {
            let stopping = loops.stopping();
            loops.spawn("watchdog", watchdog(app.clone(), every, stopping));
        }
        Ok(loops)
    }

    fn stopping(&self) -> Stopping {
        Stopping(self.stop.subscribe())
    }

    fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks.push((name, tokio::spawn(task)));
    }

    /// Tell every loop to stop and wait until each has: a loop ends between passes,
    /// so a reload under way finishes first.
    pub(super) async fn stop(self) {
        self.stop.send_replace(true);
        for (name, task) in self.tasks {
            if let Err(e) = task.await {
                tracing::error!(task = name, error = %e, "background loop failed");
            }
        }
    }
}

/// A loop's side of the stop signal.
struct Stopping(watch::Receiver<bool>);

impl Stopping {
    /// `work`'s output, or None once the server is stopping (which wins when both are
    /// ready, so a loop never starts another pass after the signal).
    async fn unless_stopped<T>(&mut self, work: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            biased;
            // An error means the sender is gone, which only happens at shutdown too.
            _ = self.0.wait_for(|stop| *stop) => None,
            out = work => Some(out),
        }
    }

    /// Wait `pause`; false if the server began stopping meanwhile.
    async fn rest(&mut self, pause: Duration) -> bool {
        self.unless_stopped(tokio::time::sleep(pause))
            .await
            .is_some()
    }
}

/// The flag sync, if any, told that `projects.json` was just read again.
type Sync = Option<Arc<crate::edge::sync::Syncer>>;

async fn reload_on_sighup(app: Arc<App>, sync: Sync, mut hup: Signal, mut stopping: Stopping) {
    while let Some(Some(())) = stopping.unless_stopped(hup.recv()).await {
        tracing::info!("SIGHUP received: reloading");
        notify::reloading();
        reload_files(&app, &sync, true).await;
        notify::ready();
    }
}

/// Reload the projects when `projects.json` changes, the flag rules whenever a file in
/// the flags directory does, the surveys and early access features when theirs do,
/// and the GeoIP database when its file does.
async fn watch_files(app: Arc<App>, sync: Sync, mut stopping: Stopping) {
    while stopping.rest(FLAGS_POLL).await {
        reload_files(&app, &sync, false).await;
    }
}

async fn watch_space(app: Arc<App>, mut stopping: Stopping) {
    loop {
        let (a, dir) = (app.clone(), app.config.db_dir.clone());
        let _ = tokio::task::spawn_blocking(move || a.space.check(&dir)).await;
        if !stopping.rest(SPACE_POLL).await {
            return;
        }
    }
}

/// Edge mode's event forwarder ([`crate::edge::forward`]), built over the store as
/// it is now and built again after a storage error (the compactor may have reopened
/// the database); its figures feed capture's backlog bound.
async fn forward_events(app: Arc<App>, mut stopping: Stopping) {
    let mut forwarder = None;
    loop {
        if forwarder.is_none() {
            forwarder = new_forwarder(&app);
        }
        let wait = match &mut forwarder {
            None => FORWARD_RETRY,
            Some(f) => match stopping.unless_stopped(f.step()).await {
                None => return,
                Some(Ok(wait)) => wait,
                Some(Err(e)) => {
                    tracing::error!(error = %e, "forwarder: storage failed; starting over");
                    forwarder = None;
                    FORWARD_RETRY
                }
            },
        };
        let figures = crate::support::sync::lock(&app.upstream_figures).clone();
        app.upstream_backlog
            .set(figures.backlog_bytes, figures.backlog_events);
        if !stopping.rest(wait).await {
            return;
        }
    }
}

fn new_forwarder(app: &App) -> Option<crate::edge::forward::Forwarder> {
    let (client, settings, open) = (
        app.upstream.clone()?,
        app.config.upstream.as_ref()?,
        app.store.get()?,
    );
    let forwarder = crate::edge::forward::Forwarder::new(
        client,
        crate::store::outbox::Outbox::from_tree(open.trees.outbox.clone()),
        open.trees.events.clone(),
        open.trees.blocks.clone(),
        app.projects.clone(),
        app.metrics.upstream.clone(),
        app.config.db_dir.clone(),
        settings.historical_after,
    );
    let forwarder = forwarder.with_nice(app.config.compactor.nice);
    Some(forwarder.with_figures(app.upstream_figures.clone()))
}

/// Tell systemd's watchdog the server is alive, twice per interval, for as long as
/// every component is working or recovering by itself ([`App::is_live`]); once one
/// cannot, stop, so systemd restarts the service (`WatchdogSec=` with `Restart=`).
async fn watchdog(app: Arc<App>, every: Duration, mut stopping: Stopping) {
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
        if !stopping.rest(every / 2).await {
            return;
        }
    }
}

/// Reload `projects.json`, the flag rules (after the surveys and early access files,
/// whose surveys add flags) and the GeoIP database, always or only what changed, on the
/// blocking pool (all read files). Each keeps its previous version when its file is bad.
/// New projects wake the flag sync, so a project given an upstream key syncs at once.
async fn reload_files(app: &Arc<App>, sync: &Sync, always: bool) {
    let (app, dir) = (app.clone(), app.config.flags_dir());
    let reloaded = tokio::task::spawn_blocking(move || {
        let projects = match always {
            true => Some(app.reload_projects()),
            false => app.reload_projects_if_changed(),
        };
        if let Some(Err(e)) = &projects {
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
        matches!(projects, Some(Ok(())))
    })
    .await;
    if let (Ok(true), Some(sync)) = (reloaded, sync) {
        sync.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// A loop resting between passes ends as soon as the stop signal is raised, and
    /// `stop` returns once it has, without waiting out the rest.
    #[tokio::test]
    async fn a_resting_loop_stops_at_the_signal() {
        let (stop, _) = watch::channel(false);
        let mut stopping = Stopping(stop.subscribe());
        let (ended, passes) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let (end, pass) = (ended.clone(), passes.clone());
        let task = tokio::spawn(async move {
            while stopping.rest(Duration::from_secs(3600)).await {
                pass.fetch_add(1, Ordering::SeqCst);
            }
            end.store(true, Ordering::SeqCst);
        });
        let loops = Loops {
            stop,
            tasks: vec![("test", task)],
        };
        tokio::time::timeout(Duration::from_secs(5), loops.stop())
            .await
            .expect("the loop stopped within its rest");
        assert!(ended.load(Ordering::SeqCst));
        assert_eq!(passes.load(Ordering::SeqCst), 0);
    }

    /// Before the signal the work's output comes through; after it, none, even from
    /// work that is ready at once.
    #[tokio::test]
    async fn the_signal_wins_over_work() {
        let (stop, _) = watch::channel(false);
        let mut stopping = Stopping(stop.subscribe());
        assert_eq!(stopping.unless_stopped(async { 7 }).await, Some(7));
        stop.send_replace(true);
        assert_eq!(stopping.unless_stopped(async { 7 }).await, None);
        assert_eq!(
            stopping.unless_stopped(std::future::pending::<()>()).await,
            None
        );
    }
}
