//! The dead-letter file, `<db>/upstream/dead-letter.ndjson`: each event upstream
//! refused for good, once, as `{"at", "project", "reason", "event"}` with the event as
//! it was sent. A refused request is bisected down to its one refused event, and a
//! crash in the middle of that (its progress is not kept) bisects the same request
//! again after the restart and finds the same event: so a line is appended only for
//! an event (project and uuid) the file does not hold yet. The file is read once, at
//! the first refusal; a last line torn by a crash, whose append was never fsync'd and
//! so never counted, is cut off before anything is appended after it.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Deserialize;
use serde_json::value::RawValue;
use uuid::Uuid;

/// The dead-letter file, under the database directory.
pub const DEAD_LETTER: &str = "upstream/dead-letter.ndjson";

/// The dead-letter file and the events it holds.
pub struct DeadLetters {
    path: PathBuf,
    /// (project, uuid) of every event in the file; read at the first append. A mutex,
    /// as appends come from the blocking pool, and one append must see the last.
    kept: Mutex<Option<HashSet<(u64, Uuid)>>>,
}

/// What a line says about the event it keeps.
#[derive(Deserialize)]
struct Kept<'a> {
    project: u64,
    #[serde(borrow)]
    event: &'a RawValue,
}

#[derive(Deserialize)]
struct Event {
    uuid: Uuid,
}

impl DeadLetters {
    /// The dead letters of the database at `db_dir`.
    pub fn new(db_dir: &Path) -> DeadLetters {
        DeadLetters {
            path: db_dir.join(DEAD_LETTER),
            kept: Mutex::new(None),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append `event` (project's, `uuid`), refused for `reason`, fsync'd, unless the
    /// file holds it already; true if it was appended. Blocking.
    pub fn keep(
        &self,
        project: u64,
        uuid: Uuid,
        event: &[u8],
        reason: &str,
    ) -> std::io::Result<bool> {
        let mut kept = crate::support::sync::lock(&self.kept);
        if kept.is_none() {
            *kept = Some(read(&self.path)?);
        }
        let Some(set) = kept.as_mut() else {
            return Ok(false);
        };
        if set.contains(&(project, uuid)) {
            return Ok(false);
        }
        append(&self.path, &line(project, event, reason)?)?;
        set.insert((project, uuid));
        Ok(true)
    }
}

/// The events the file at `path` holds, its torn last line cut off first. Read a
/// line at a time: the file may have grown large over the months.
fn read(path: &Path) -> std::io::Result<HashSet<(u64, Uuid)>> {
    use std::io::BufRead;
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HashSet::new()),
        Err(e) => return Err(e),
    };
    let mut reader = std::io::BufReader::new(file);
    let (mut set, mut line, mut whole) = (HashSet::new(), Vec::new(), 0u64);
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 {
            break;
        }
        if line.last() != Some(&b'\n') {
            tracing::warn!(
                bytes = n,
                "forwarder: the dead-letter file ends in a line cut short by a crash; removed"
            );
            let file = std::fs::OpenOptions::new().write(true).open(path)?;
            file.set_len(whole)?;
            file.sync_data()?;
            break;
        }
        whole += n as u64;
        let Ok(k) = serde_json::from_slice::<Kept>(&line) else {
            continue;
        };
        if let Ok(e) = serde_json::from_str::<Event>(k.event.get()) {
            set.insert((k.project, e.uuid));
        }
    }
    Ok(set)
}

/// One line: `{"at", "project", "reason", "event"}`.
fn line(project: u64, event: &[u8], reason: &str) -> std::io::Result<Vec<u8>> {
    let mut line = Vec::with_capacity(event.len() + 200);
    line.extend_from_slice(b"{\"at\":\"");
    line.extend_from_slice(
        crate::support::clock::format_ms(crate::support::clock::now_ms()).as_bytes(),
    );
    line.extend_from_slice(format!("\",\"project\":{project},\"reason\":").as_bytes());
    serde_json::to_writer(&mut line, reason)?;
    line.extend_from_slice(b",\"event\":");
    match serde_json::from_slice::<&RawValue>(event) {
        Ok(_) => line.extend_from_slice(event),
        // Not JSON after all: kept as text so the line stays one JSON object.
        Err(_) => serde_json::to_writer(&mut line, &String::from_utf8_lossy(event))?,
    }
    line.extend_from_slice(b"}\n");
    Ok(line)
}

fn append(path: &Path, line: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    file.write_all(line)?;
    file.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(path: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn event(n: u128) -> (Uuid, Vec<u8>) {
        let uuid = Uuid::from_u128(n);
        (
            uuid,
            format!(r#"{{"uuid":"{uuid}","event":"e{n}"}}"#).into_bytes(),
        )
    }

    #[test]
    fn each_refused_event_is_kept_once_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let (a, a_json) = event(1);
        let (b, b_json) = event(2);
        let dead = DeadLetters::new(dir.path());
        assert!(dead.keep(1, a, &a_json, "400 no").unwrap());
        assert!(!dead.keep(1, a, &a_json, "400 no").unwrap(), "once");
        // The same uuid in another project is another event.
        assert!(dead.keep(2, a, &a_json, "400 no").unwrap());
        // A restart reads what the file holds.
        let again = DeadLetters::new(dir.path());
        assert!(!again.keep(1, a, &a_json, "400 again").unwrap());
        assert!(again.keep(1, b, &b_json, "413 too large").unwrap());
        let kept = lines(again.path());
        assert_eq!(kept.len(), 3);
        assert_eq!(kept[0]["project"], 1);
        assert_eq!(kept[0]["reason"], "400 no");
        assert_eq!(kept[0]["event"]["uuid"], a.to_string());
        assert!(kept[0]["at"].is_string());
        assert_eq!(kept[2]["event"]["event"], "e2");
    }

    #[test]
    fn a_line_torn_by_a_crash_is_cut_off_and_its_event_kept_again() {
        let dir = tempfile::tempdir().unwrap();
        let (a, a_json) = event(1);
        let (b, b_json) = event(2);
        let dead = DeadLetters::new(dir.path());
        assert!(dead.keep(1, a, &a_json, "400").unwrap());
        let whole = line(1, &b_json, "400").unwrap();
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(dead.path())
            .unwrap();
        file.write_all(&whole[..whole.len() / 2]).unwrap();
        let again = DeadLetters::new(dir.path());
        assert!(!again.keep(1, a, &a_json, "400").unwrap());
        assert!(again.keep(1, b, &b_json, "400").unwrap());
        let kept = lines(again.path());
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[1]["event"]["uuid"], b.to_string());
    }

    #[test]
    fn text_that_is_not_json_stays_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let dead = DeadLetters::new(dir.path());
        assert!(dead.keep(1, Uuid::nil(), b"not {json\n", "400").unwrap());
        let kept = lines(dead.path());
        assert_eq!(kept[0]["event"], "not {json\n");
    }
}
