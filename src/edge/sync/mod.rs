//! Edge mode's flag sync: every project with an `upstream_secret_key` takes its flag
//! rules from upstream's definitions feed instead of its `flags/<id>.json`. One task
//! per project polls upstream every `--upstream-poll` with the last ETag, installs a
//! 200's definitions in the published rules and on disk, and keeps the last good
//! rules through 401, 403, 429, 5xx and silence, backing off; a 402 clears them (the
//! flags then answer `quota_limited`, as upstream's do). A supervisor starts and stops
//! those tasks as `projects.json` changes (woken at once by its reload), and keeps the
//! definitions' age current for `/metrics`. A project that gains its key while the
//! server runs serves its flag file's rules until upstream's first answer. The handler layer drives it through [`Host`]; [`Board`] is what the
//! console's health page reads.

pub mod disk;
mod follow;
pub mod poll;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use serde_json::{json, Value};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use super::client::Client;
use super::stats::{ProjectLabels, Stats};
use crate::flags::Rules;
use crate::projects::Projects;

/// How often the supervisor looks at `projects.json`'s projects and refreshes the
/// definitions' age: the metric promises to be at most this stale.
const SUPERVISE_EVERY: Duration = Duration::from_secs(1);

/// What the sync needs from the server it runs in.
pub trait Host: Send + Sync + 'static {
    fn rules(&self) -> &Rules;
    /// Read the flag files again (a project no longer synced gets its file's rules
    /// back). Blocks on file reads.
    fn reload_flag_files(&self);
    /// A synced project's rules were published (or it stopped being synced): what
    /// shows its flags follows. Blocks briefly.
    fn published(&self, project: u64);
}

/// One synced project's state, as the health page shows it.
#[derive(Debug, Clone, Default)]
pub struct Status {
    pub endpoint: &'static str,
    /// The last answer's status (`200`, `304`, `503`, `timeout`, ...), or `disk` after
    /// the start's load.
    pub last_status: String,
    /// When upstream last answered 200 or 304.
    pub last_success: Option<SystemTime>,
    /// When the rules served were last confirmed (a 200, a 304, or the stored answer's
    /// write time).
    pub confirmed: Option<SystemTime>,
    pub failures_in_a_row: u32,
    pub etag: Option<String>,
    pub quota_limited: bool,
    /// Definitions compiled and published since start (a 304 compiles nothing).
    pub compiles: u64,
    /// Where the rules served come from.
    pub serving: Serving,
}

/// Where a synced project's served rules come from, as the health page says it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Serving {
    /// Nothing yet: no answer from upstream, none on disk.
    #[default]
    Nothing,
    /// The project's flag file, as it was when the project gained its upstream key,
    /// until upstream's first answer.
    FlagFile,
    /// The answer kept on disk, loaded at start, until upstream confirms or replaces it.
    Stored,
    /// Upstream's answer.
    Upstream,
    /// None: upstream said the flag quota is used up.
    QuotaLimited,
}

impl Serving {
    pub fn as_str(self) -> &'static str {
        match self {
            Serving::Nothing => "nothing",
            Serving::FlagFile => "flag file",
            Serving::Stored => "stored",
            Serving::Upstream => "upstream",
            Serving::QuotaLimited => "quota limited",
        }
    }
}

/// Every synced project's [`Status`], shared with the health page.
#[derive(Clone, Default)]
pub struct Board(Arc<Mutex<HashMap<u64, Status>>>);

impl Board {
    fn update(&self, project: u64, change: impl FnOnce(&mut Status)) {
        let mut map = crate::support::sync::lock(&self.0);
        change(map.entry(project).or_default());
    }

    fn remove(&self, project: u64) {
        crate::support::sync::lock(&self.0).remove(&project);
    }

    pub fn get(&self, project: u64) -> Option<Status> {
        crate::support::sync::lock(&self.0).get(&project).cloned()
    }

    /// The health page's view, one entry per synced project, by id.
    pub fn to_json(&self) -> Value {
        let map = crate::support::sync::lock(&self.0);
        let mut ids: Vec<&u64> = map.keys().collect();
        ids.sort_unstable();
        let secs = |t: Option<SystemTime>| {
            t.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                .map(|d| d.as_secs())
        };
        let list: Vec<Value> = ids
            .into_iter()
            .map(|id| {
                let s = &map[id];
                json!({
                    "project": id,
                    "endpoint": s.endpoint,
                    "last_status": s.last_status,
                    "last_success": secs(s.last_success),
                    "age_seconds": age(s.confirmed).map(|a| a.as_secs()),
                    "failures_in_a_row": s.failures_in_a_row,
                    "etag": s.etag,
                    "quota_limited": s.quota_limited,
                    "compiles": s.compiles,
                    "serving": s.serving.as_str(),
                })
            })
            .collect();
        Value::Array(list)
    }
}

fn age(confirmed: Option<SystemTime>) -> Option<Duration> {
    confirmed.map(|t| SystemTime::now().duration_since(t).unwrap_or_default())
}

/// What a project's sync is keyed on: a change of either restarts it.
#[derive(Clone, PartialEq, Eq)]
struct Wanted {
    token: String,
    key: String,
}

/// The sync of every project with an upstream key.
pub struct Syncer {
    pub(super) client: Client,
    pub(super) poll: Duration,
    pub(super) db_dir: PathBuf,
    flags_dir: PathBuf,
    projects: Arc<ArcSwap<Projects>>,
    pub(super) stats: Stats,
    pub(super) board: Board,
    pub(super) host: Arc<dyn Host>,
    running: Mutex<HashMap<u64, (Wanted, JoinHandle<()>)>>,
    /// Set after the first pass: a project started later began while serving.
    serving: AtomicBool,
    /// Rings when `projects.json` was reloaded, so a new key starts its sync at once.
    wake: Notify,
}

impl Syncer {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        poll: Duration,
        db_dir: PathBuf,
        flags_dir: PathBuf,
        projects: Arc<ArcSwap<Projects>>,
        stats: Stats,
        board: Board,
        host: Arc<dyn Host>,
    ) -> Arc<Syncer> {
        Arc::new(Syncer {
            client,
            poll,
            db_dir,
            flags_dir,
            projects,
            stats,
            board,
            host,
            running: Mutex::default(),
            serving: AtomicBool::new(false),
            wake: Notify::new(),
        })
    }

    /// `projects.json` was reloaded: look at it now rather than at the next tick.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Start and stop projects' syncs to match `projects.json`, and refresh the
    /// definitions' age. The first pass, before serving, installs each synced
    /// project's stored answer. Blocks on file reads: call it where that is allowed.
    pub async fn pass(self: &Arc<Self>) {
        let wanted: HashMap<u64, Wanted> = self
            .projects
            .load()
            .iter()
            .filter_map(|p| {
                let key = p.upstream_secret_key.as_ref()?.expose().to_string();
                Some((
                    p.id,
                    Wanted {
                        token: p.api_key.clone(),
                        key,
                    },
                ))
            })
            .collect();
        let mut stale = Vec::new();
        let mut fresh = Vec::new();
        {
            let running = crate::support::sync::lock(&self.running);
            for (id, (was, task)) in running.iter() {
                if wanted.get(id) != Some(was) || task.is_finished() {
                    stale.push(*id);
                }
            }
            for (id, w) in &wanted {
                if !running.contains_key(id) || stale.contains(id) {
                    fresh.push((*id, w.clone()));
                }
            }
        }
        for id in stale {
            self.stop_project(id, wanted.contains_key(&id)).await;
        }
        let while_serving = self.serving.swap(true, Ordering::SeqCst);
        for (id, w) in fresh {
            self.start_project(id, w, while_serving).await;
        }
        let board = crate::support::sync::lock(&self.board.0).clone();
        for (id, status) in board {
            if let Some(age) = age(status.confirmed) {
                let labels = ProjectLabels { project: id };
                self.stats
                    .definitions_age_seconds
                    .get_or_create(&labels)
                    .set(age.as_secs_f64());
            }
        }
    }

    /// Run [`Syncer::pass`] every second until `stop` turns true, then end every
    /// project's task.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        while !*stop.borrow() {
            tokio::select! {
                biased;
                // An error means the sender is gone, which only happens at shutdown.
                changed = stop.changed() => if changed.is_err() { break },
                _ = tokio::time::sleep(SUPERVISE_EVERY) => self.pass().await,
                _ = self.wake.notified() => self.pass().await,
            }
        }
        let running = std::mem::take(&mut *crate::support::sync::lock(&self.running));
        for (_, (_, task)) in running {
            task.abort();
        }
    }

    /// Start `id`'s poll task, its stored answer installed first; `while_serving`, a
    /// project without one keeps the rules it serves now until upstream answers.
    async fn start_project(self: &Arc<Self>, id: u64, wanted: Wanted, while_serving: bool) {
        let Ok(rules_id) = i64::try_from(id) else {
            return;
        };
        let this = self.clone();
        let stored = tokio::task::spawn_blocking(move || {
            let file = this.flags_dir.join(format!("{id}.json"));
            if file.exists() {
                tracing::warn!(project = id, file = %file.display(), "flag file ignored: this project's flags are synced from upstream");
            }
            this.host.rules().sync_begin(rules_id, while_serving);
            let stored = disk::load(&disk::dir(&this.db_dir, id)).and_then(|stored| {
                match this.host.rules().sync_install(rules_id, &stored.body) {
                    Ok(_) => Some(stored),
                    Err(error) => {
                        tracing::warn!(project = id, %error, "stored flag definitions not usable; waiting for upstream");
                        None
                    }
                }
            });
            this.host.published(id);
            stored
        })
        .await
        .ok()
        .flatten();
        let held = stored
            .as_ref()
            .map(|s| crate::support::watch::digest(&s.body));
        let etag = match &stored {
            Some(s) => {
                tracing::info!(
                    project = id,
                    "flags served from the stored definitions until upstream answers"
                );
                self.board.update(id, |st| {
                    st.last_status = "disk".into();
                    st.confirmed = s.written;
                    st.etag = s.etag.clone();
                    st.compiles += 1;
                    st.serving = Serving::Stored;
                });
                s.etag.clone()
            }
            None => {
                let kept = i64::try_from(id)
                    .is_ok_and(|id| self.host.rules().current().project(id).is_some());
                let serving = match while_serving && kept {
                    true => {
                        tracing::info!(
                            project = id,
                            "the project's flag file serves until upstream answers"
                        );
                        Serving::FlagFile
                    }
                    false => Serving::Nothing,
                };
                self.board.update(id, |st| {
                    st.last_status = "waiting".into();
                    st.serving = serving;
                });
                None
            }
        };
        tracing::info!(project = id, upstream = %self.client.base(), "flag sync started");
        let task = tokio::spawn(follow::follow(self.clone(), id, wanted.clone(), etag, held));
        crate::support::sync::lock(&self.running).insert(id, (wanted, task));
    }

    /// End a project's sync; unless it is restarting, it gets its file's rules again.
    async fn stop_project(self: &Arc<Self>, id: u64, restarting: bool) {
        if let Some((_, task)) = crate::support::sync::lock(&self.running).remove(&id) {
            task.abort();
        }
        if restarting {
            return;
        }
        tracing::info!(
            project = id,
            "flag sync stopped; the project's flag file serves again"
        );
        self.board.remove(id);
        self.stats
            .definitions_age_seconds
            .remove(&ProjectLabels { project: id });
        let Ok(rules_id) = i64::try_from(id) else {
            return;
        };
        let host = self.host.clone();
        let _ = tokio::task::spawn_blocking(move || {
            host.rules().sync_end(rules_id);
            host.reload_flag_files();
            host.published(id);
        })
        .await;
    }
}
