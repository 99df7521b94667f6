//! Loading and reloading a flags directory: broken files keep the old rules, removed files
//! remove projects, the cheap change check, and readers racing reloads.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use serde_json::json;

use crate::flags::{ErrorKind, Rules, Snapshot};

/// A directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let path = std::env::temp_dir().join(format!("flags-test-{}", uuid::Uuid::new_v4()));
        fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }

    fn write(&self, name: &str, contents: &str) {
        fs::write(self.0.join(name), contents).expect("write test file");
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn file_with_flag(key: &str) -> String {
    json!({"flags": [{"id": 1, "key": key, "active": true,
        "filters": {"groups": [{"properties": [], "rollout_percentage": 100}]}}]})
    .to_string()
}

const INVALID: &str = r#"{"flags": [{"id": 1, "key": "beta", "filters": {"groups": [
    {"properties": []}, {"properties": [{"key": "plan", "operator": 7, "value": 1}]}]}}]}"#;

fn first_key(snapshot: &Snapshot, project: i64) -> Option<String> {
    let rules = snapshot.project(project)?;
    rules.definitions_json()["flags"][0]["key"]
        .as_str()
        .map(str::to_owned)
}

#[test]
fn load_reads_every_project_file() {
    let dir = TempDir::new();
    dir.write("1.json", &file_with_flag("one"));
    dir.write("2.json", &file_with_flag("two"));
    dir.write("README.txt", "not a flag file");
    let (rules, report) = Rules::load(&dir.0);
    assert_eq!(report.loaded, vec![1, 2]);
    assert!(report.errors.is_empty());
    assert!(report.warnings.is_empty());
    let snapshot = rules.current();
    assert_eq!(snapshot.version(), 1);
    assert_eq!(snapshot.project_ids(), vec![1, 2]);
    assert_eq!(first_key(&snapshot, 2).as_deref(), Some("two"));
}

#[test]
fn an_invalid_file_keeps_the_previous_rules() {
    let dir = TempDir::new();
    dir.write("1.json", &file_with_flag("one"));
    dir.write("2.json", &file_with_flag("two"));
    let (rules, _) = Rules::load(&dir.0);
    let before = rules.current();

    dir.write("1.json", &file_with_flag("one-b"));
    dir.write("2.json", INVALID);
    let report = rules.reload(&dir.0);
    assert_eq!(report.version, 2);
    assert_eq!(report.loaded, vec![1]);
    assert_eq!(report.errors.len(), 1);
    let error = &report.errors[0];
    assert_eq!(error.file(), Some(dir.0.join("2.json").as_path()));
    assert_eq!(error.flag(), Some("beta"));
    assert_eq!(error.field(), "filters.groups[1].properties[0].operator");
    assert_eq!(
        error.kind(),
        &ErrorKind::WrongType {
            expected: "a string"
        }
    );
    assert!(error.to_string().ends_with(
        r#"2.json: flag "beta": filters.groups[1].properties[0].operator: expected a string"#
    ));
    assert_eq!(rules.reload_failures(), 1);

    let after = rules.current();
    assert_eq!(after.version(), 2);
    assert_eq!(first_key(&after, 1).as_deref(), Some("one-b"));
    let kept = after.project(2).expect("project 2 kept");
    assert!(Arc::ptr_eq(
        kept,
        before.project(2).expect("project 2 loaded")
    ));
}

#[test]
fn removed_files_remove_projects_and_bad_names_are_reported() {
    let dir = TempDir::new();
    dir.write("1.json", &file_with_flag("one"));
    dir.write("7.json", &file_with_flag("seven"));
    let (rules, _) = Rules::load(&dir.0);
    fs::remove_file(dir.0.join("1.json")).expect("remove");
    dir.write("07.json", &file_with_flag("dup"));
    dir.write("beta.json", &file_with_flag("beta"));
    let report = rules.reload(&dir.0);
    assert_eq!(rules.current().project_ids(), vec![7]);
    let kinds: Vec<&ErrorKind> = report.errors.iter().map(|e| e.kind()).collect();
    assert_eq!(kinds, vec![&ErrorKind::FileName, &ErrorKind::FileName]);
    assert_eq!(rules.reload_failures(), 2);
}

#[test]
fn disabled_flags_are_reported_as_warnings() {
    let dir = TempDir::new();
    // A cohort the feed did not send, as PostHog's feed without `send_cohorts` may hold.
    let file = json!({"flags": [{"id": 1, "key": "in-cohort", "filters": {"groups": [{"properties": [
        {"key": "id", "type": "cohort", "value": 42}]}]}}]});
    dir.write("4.json", &file.to_string());
    let (rules, report) = Rules::load(&dir.0);
    assert!(report.errors.is_empty());
    assert_eq!(report.loaded, vec![4]);
    assert_eq!(report.warnings.len(), 1);
    assert!(report.warnings[0].to_string().ends_with(
        r#"4.json: flag "in-cohort": filters.groups[0].properties[0]: cohort 42 is missing, cyclic or refers to a missing cohort"#
    ));
    assert_eq!(
        rules.reload_failures(),
        0,
        "a disabled flag is not a failed file"
    );
}

#[test]
fn a_new_project_with_an_invalid_file_is_absent() {
    let dir = TempDir::new();
    dir.write("3.json", "{not json");
    let (rules, report) = Rules::load(&dir.0);
    assert!(matches!(report.errors[0].kind(), ErrorKind::Json(_)));
    assert!(rules.current().project(3).is_none());
}

#[test]
fn a_missing_directory_keeps_everything() {
    let dir = TempDir::new();
    dir.write("1.json", &file_with_flag("one"));
    let (rules, _) = Rules::load(&dir.0);
    let gone = dir.0.join("nowhere");
    let report = rules.reload(&gone);
    assert!(matches!(report.errors[0].kind(), ErrorKind::Io(_)));
    assert_eq!(report.version, 1, "nothing was published");
    assert_eq!(rules.current().project_ids(), vec![1]);
    assert!(
        rules.reload_if_changed(&gone).is_none(),
        "already reported, not repeated"
    );
    assert!(
        rules.reload_if_changed(&dir.0).is_some(),
        "back to a readable directory"
    );
}

#[test]
fn reload_if_changed_only_reloads_on_change() {
    let dir = TempDir::new();
    dir.write("1.json", &file_with_flag("aaa"));
    let rules = Rules::new();
    assert_eq!(rules.current().version(), 0);
    assert!(
        rules.reload_if_changed(&dir.0).is_some(),
        "first poll loads"
    );
    assert!(rules.reload_if_changed(&dir.0).is_none(), "nothing changed");
    // Same size, possibly the same mtime tick: caught by content while files are fresh.
    dir.write("1.json", &file_with_flag("bbb"));
    let report = rules
        .reload_if_changed(&dir.0)
        .expect("same-size rewrite seen");
    assert_eq!(report.loaded, vec![1]);
    assert_eq!(first_key(&rules.current(), 1).as_deref(), Some("bbb"));
    dir.write("2.json", &file_with_flag("two"));
    assert!(rules.reload_if_changed(&dir.0).is_some(), "new file seen");
    assert!(rules.reload_if_changed(&dir.0).is_none());
    assert_eq!(rules.current().version(), 3);
}

fn write_generation(dir: &Path, projects: i64, generation: u32) {
    for project in 1..=projects {
        let path = dir.join(format!("{project}.json"));
        fs::write(path, file_with_flag(&format!("gen-{generation}"))).expect("write");
    }
}

#[test]
fn readers_racing_reloads_see_whole_snapshots() {
    const PROJECTS: i64 = 8;
    const GENERATIONS: u32 = 40;
    let dir = TempDir::new();
    write_generation(&dir.0, PROJECTS, 0);
    let (rules, _) = Rules::load(&dir.0);
    let rules = Arc::new(rules);
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (rules, done) = (Arc::clone(&rules), Arc::clone(&done));
            thread::spawn(move || {
                let (mut last_version, mut seen) = (0, 0u32);
                while !done.load(Ordering::Acquire) {
                    let snapshot = rules.current();
                    assert!(snapshot.version() >= last_version, "versions never go back");
                    last_version = snapshot.version();
                    assert_eq!(snapshot.project_ids().len(), PROJECTS as usize);
                    let first = first_key(&snapshot, 1);
                    for project in 2..=PROJECTS {
                        assert_eq!(first_key(&snapshot, project), first, "mixed snapshot");
                    }
                    seen += 1;
                }
                seen
            })
        })
        .collect();
    for generation in 1..=GENERATIONS {
        write_generation(&dir.0, PROJECTS, generation);
        let report = rules.reload(&dir.0);
        assert!(report.errors.is_empty());
    }
    done.store(true, Ordering::Release);
    for reader in readers {
        assert!(reader.join().expect("reader panicked") > 0);
    }
    let last = rules.current();
    assert_eq!(last.version(), u64::from(GENERATIONS) + 1);
    assert_eq!(first_key(&last, PROJECTS).as_deref(), Some("gen-40"));
}
