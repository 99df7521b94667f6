//! Edge mode: a project whose flags are synced from upstream shows upstream's
//! definitions through the management API's reads (and the console), not its flag
//! file, which the edge ignores. Writes never get here: the API refuses them first,
//! naming the upstream.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::file::FlagFile;
use super::{Error, Store};

impl Store {
    /// Show `definitions` (upstream's, for a synced project) instead of the project's
    /// file; `None` shows the file again.
    pub fn show_synced(&self, project: u64, definitions: Option<Map<String, Value>>) {
        let mut synced = crate::support::sync::lock(&self.synced);
        match definitions {
            Some(doc) => synced.insert(project, Arc::new(doc)),
            None => synced.remove(&project),
        };
    }

    /// What reads of `project` show: its synced definitions, else its file.
    pub(super) fn read_shown(&self, project: u64) -> Result<FlagFile, Error> {
        let synced = crate::support::sync::lock(&self.synced)
            .get(&project)
            .cloned();
        match synced {
            Some(doc) => Ok(FlagFile {
                doc: (*doc).clone(),
                digest: None,
            }),
            None => FlagFile::read(&self.flags_dir, project),
        }
    }
}
