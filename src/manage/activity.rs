//! The activity log of changes made through the management API: one JSON line per
//! change in `<db dir>/flag_activity/<project id>.jsonl`, each already in the shape of
//! PostHog's activity log entries (`id`, `user`, `activity`, `scope`, `item_id`,
//! `detail.changes[].before/after`, `created_at`). A line is appended and fsync'd after
//! the flag file is replaced, so the log never claims a change the file does not hold;
//! a crash between the two loses that one line, and a line cut short by a crash is
//! skipped when read. The key's label names who changed what; the key never appears.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::error::Error;

pub struct Log {
    dir: PathBuf,
}

/// One change to record.
pub struct Entry<'a> {
    pub scope: &'static str,
    pub activity: &'static str,
    pub item_id: i64,
    pub name: Option<&'a str>,
    pub label: &'a str,
    pub changes: Vec<Value>,
    pub at: &'a str,
}

/// Which entries to read.
pub struct Query {
    pub scope: &'static str,
    pub item_id: Option<i64>,
    pub limit: usize,
    /// 1-based, as PostHog's activity pages are.
    pub page: usize,
}

impl Log {
    pub fn new(dir: PathBuf) -> Log {
        Log { dir }
    }

    fn path(&self, project: u64) -> PathBuf {
        self.dir.join(format!("{project}.jsonl"))
    }

    /// Appends one entry and makes it durable before returning.
    pub fn append(&self, project: u64, e: Entry<'_>) -> Result<(), Error> {
        let line = json!({
            "id": uuid::Uuid::new_v4().to_string(),
            "user": {"first_name": e.label, "email": null},
            "activity": e.activity,
            "scope": e.scope,
            "item_id": e.item_id.to_string(),
            "detail": {
                "id": e.item_id.to_string(),
                "changes": e.changes,
                "merge": null,
                "trigger": null,
                "name": e.name,
                "short_id": null,
                "type": null,
            },
            "created_at": e.at,
        });
        let mut bytes = serde_json::to_vec(&line).map_err(|e| Error::Io(e.to_string()))?;
        bytes.push(b'\n');
        let io = |e: std::io::Error| Error::Io(format!("activity log: {e}"));
        fs::create_dir_all(&self.dir).map_err(io)?;
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(project))
            .map_err(io)?;
        file.write_all(&bytes).map_err(io)?;
        file.sync_data().map_err(io)
    }

    /// The page of matching entries, newest first, and how many match in all.
    pub fn read(&self, project: u64, q: &Query) -> Result<(usize, Vec<Value>), Error> {
        let text = match fs::read_to_string(self.path(project)) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(Error::Io(format!("activity log: {e}"))),
        };
        let item = q.item_id.map(|id| id.to_string());
        let mut matching: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["scope"] == q.scope)
            .filter(|v| item.as_deref().is_none_or(|id| v["item_id"] == id))
            .collect();
        matching.reverse();
        let total = matching.len();
        let skip = q.limit.saturating_mul(q.page.saturating_sub(1));
        let page = matching.into_iter().skip(skip).take(q.limit).collect();
        Ok((total, page))
    }
}

/// The directory of the activity logs under the database directory.
pub fn dir(db_dir: &Path) -> PathBuf {
    db_dir.join("flag_activity")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(item_id: i64, label: &str) -> Entry<'_> {
        Entry {
            scope: "FeatureFlag",
            activity: "updated",
            item_id,
            name: Some("k"),
            label,
            changes: vec![json!({"field": "active", "before": true, "after": false})],
            at: "2026-01-01T00:00:00.000Z",
        }
    }

    #[test]
    fn entries_read_back_newest_first_by_item_and_page() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::new(dir.path().join("a"));
        for (id, label) in [(1, "ci"), (2, "ops"), (1, "ops")] {
            log.append(5, entry(id, label)).unwrap();
        }
        // A line cut short by a crash is skipped.
        let path = dir.path().join("a/5.jsonl");
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"scope\": \"Feat").unwrap();
        let q = |item_id, limit, page| Query {
            scope: "FeatureFlag",
            item_id,
            limit,
            page,
        };
        let (total, page) = log.read(5, &q(Some(1), 10, 1)).unwrap();
        assert_eq!(total, 2);
        let users: Vec<&Value> = page.iter().map(|e| &e["user"]["first_name"]).collect();
        assert_eq!(users, [&json!("ops"), &json!("ci")]);
        assert_eq!(page[0]["detail"]["changes"][0]["after"], json!(false));
        assert_eq!(page[0]["item_id"], "1");
        let (total, page) = log.read(5, &q(None, 2, 2)).unwrap();
        assert_eq!((total, page.len()), (3, 1));
        assert_eq!(page[0]["user"]["first_name"], "ci");
        assert_eq!(log.read(6, &q(None, 10, 1)).unwrap(), (0, vec![]));
    }
}
