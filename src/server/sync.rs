//! Starting edge mode's flag sync (`--upstream` with projects that have an
//! `upstream_secret_key`): the server is the sync's [`Host`], giving it the published
//! rules and a way to read the flag files again.

use std::sync::Arc;

use crate::app::App;
use crate::edge::sync::{Host, Syncer};
use crate::flags::Rules;

struct AppHost(Arc<App>);

impl Host for AppHost {
    fn rules(&self) -> &Rules {
        &self.0.rules
    }

    fn reload_flag_files(&self) {
        self.0.rules.reload(&self.0.config.flags_dir());
    }

    fn published(&self, project: u64) {
        let app = &self.0;
        let synced =
            i64::try_from(project).is_ok_and(|id| app.rules.synced_projects().contains(&id));
        let shown = synced.then(|| {
            let rules = i64::try_from(project)
                .ok()
                .and_then(|id| app.rules.current().project(id).cloned());
            match rules.map(|r| r.definitions_json().clone()) {
                Some(serde_json::Value::Object(doc)) => doc,
                _ => serde_json::Map::from_iter([
                    ("flags".to_string(), serde_json::json!([])),
                    ("group_type_mapping".to_string(), serde_json::json!({})),
                    ("cohorts".to_string(), serde_json::json!({})),
                ]),
            }
        });
        app.manage.show_synced(project, shown);
    }
}

/// The sync, with its first pass done (each synced project's stored answer installed,
/// its poll task started), or `None` when edge mode is off.
pub(super) async fn start(app: &Arc<App>) -> Option<Arc<Syncer>> {
    let client = app.upstream.clone()?;
    let poll = app.config.upstream.as_ref()?.poll;
    let syncer = Syncer::new(
        client,
        poll,
        app.config.db_dir.clone(),
        app.config.flags_dir(),
        app.projects.clone(),
        app.metrics.upstream.clone(),
        app.flag_sync.clone(),
        Arc::new(AppHost(app.clone())),
    );
    syncer.pass().await;
    Some(syncer)
}
