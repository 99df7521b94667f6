//! A stopped database backed up and restored: trees, the log from the checkpoint on,
//! its marks and the activity logs come back as they were; a destination that is not
//! empty, a backup without its manifest and a file cut short are refused.

use super::*;

fn a_block() -> Vec<u8> {
    crate::store::block::tests::value(7, 1)
}

/// A stopped database: sled with a checkpoint at 39 and two event blocks, 100 log
/// entries in small segments, and an activity log whose last line is cut short.
fn stopped_db(root: &Path) -> PathBuf {
    let db_dir = root.join("db");
    let db = sled::open(&db_dir).unwrap();
    let meta = db.open_tree("meta").unwrap();
    meta.insert(keys::CHECKPOINT_KEY, &39u64.to_be_bytes()[..])
        .unwrap();
    let events = db.open_tree("event_blocks").unwrap();
    // A value that is no block is kept as it is; a block in the block files goes out
    // whole and comes back into the new database's.
    events.insert(b"block-1", &b"lz4 bytes"[..]).unwrap();
    let files = crate::store::block::Files::open(&db_dir).unwrap();
    let pointer = files.append(&a_block()).unwrap();
    files.sync().unwrap();
    events.insert(b"block-2", &pointer[..]).unwrap();
    db.flush().unwrap();
    drop(events);
    drop((meta, db));
    let (mut appender, _reader) = crate::log::open_for_tests(&db_dir.join("wal"), 1, Some(39), 512);
    for i in 0..100u32 {
        appender.push(format!("entry {i:04}").as_bytes()).unwrap();
        appender.commit().unwrap();
    }
    appender.mark_clean().unwrap();
    drop(appender);
    std::fs::create_dir_all(db_dir.join(ACTIVITY)).unwrap();
    std::fs::write(db_dir.join("flag_activity/1.jsonl"), b"{\"a\":1}\n{\"b\":").unwrap();
    db_dir
}

#[test]
fn a_stopped_database_comes_back_whole() {
    let root = tempfile::tempdir().unwrap();
    let db_dir = stopped_db(root.path());
    let dest = root.path().join("backup");
    let manifest = take_stopped(&db_dir, &dest).unwrap();
    assert!(!manifest.running);
    assert_eq!(manifest.checkpoint, Some(39));
    assert_eq!(manifest.log_end, None);
    assert_eq!(manifest.trees["event_blocks"], 2);
    assert_eq!(manifest.trees["meta"], 1);
    // The segments before the one holding entry 40 are left out.
    let logs: Vec<&str> = manifest
        .files
        .iter()
        .map(|f| f.path.as_str())
        .filter(|p| p.ends_with(".log"))
        .collect();
    assert!(!logs.contains(&"wal/00000000000000000001.log"), "{logs:?}");
    assert!(manifest.files.iter().any(|f| f.path == "wal/clean"));
    assert!(dest.join(MANIFEST).is_file());

    let restored = root.path().join("restored");
    assert_eq!(restore::restore(&dest, &restored).unwrap(), manifest);
    let db = crate::store::check::open(&restored, 1 << 24).unwrap();
    let meta = db.open_tree("meta").unwrap();
    let checkpoint = meta.get(keys::CHECKPOINT_KEY).unwrap();
    assert_eq!(checkpoint.as_deref(), Some(&39u64.to_be_bytes()[..]));
    let events = db.open_tree("event_blocks").unwrap();
    let block = events.get(b"block-1").unwrap();
    assert_eq!(block.as_deref(), Some(&b"lz4 bytes"[..]));
    let pointer = events.get(b"block-2").unwrap().unwrap();
    let files = crate::store::block::Files::open(&restored).unwrap();
    assert_eq!(files.resolve(&pointer).unwrap().as_ref(), &a_block()[..]);
    drop((meta, events, db));
    for path in logs {
        let (a, b) = (db_dir.join(path), restored.join(path));
        assert_eq!(
            std::fs::read(a).unwrap(),
            std::fs::read(b).unwrap(),
            "{path}"
        );
    }
    // The activity log up to its last whole line.
    let activity = std::fs::read(restored.join("flag_activity/1.jsonl")).unwrap();
    assert_eq!(activity, b"{\"a\":1}\n");
    // The log on the restored copy reads on from the checkpoint, entries 40 to 100.
    let (_appender, mut reader) =
        crate::log::open_for_tests(&restored.join("wal"), 1, Some(39), 512);
    let numbers: Vec<u64> = crate::log::read_intact(&mut reader)
        .iter()
        .map(|e| e.0)
        .collect();
    assert_eq!(numbers, (40..=100).collect::<Vec<_>>());
}

#[test]
fn refusals_say_why() {
    let root = tempfile::tempdir().unwrap();
    let db_dir = stopped_db(root.path());
    let taken = root.path().join("taken");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("x"), b"x").unwrap();
    let err = take_stopped(&db_dir, &taken).unwrap_err();
    assert_eq!(
        err,
        format!(
            "{} is not empty; give a new or empty directory",
            taken.display()
        )
    );
    let err = take_stopped(&db_dir, &db_dir.join("inside")).unwrap_err();
    assert!(
        err.ends_with("is inside the database directory; choose a directory outside it"),
        "{err}"
    );

    let dest = root.path().join("backup");
    take_stopped(&db_dir, &dest).unwrap();
    // Restoring over a database that is there already.
    let err = restore::restore(&dest, &db_dir).unwrap_err();
    assert_eq!(
        err,
        format!(
            "{} is not empty; give a new or empty directory",
            db_dir.display()
        )
    );
    // A file cut short.
    let trees = dest.join(TREES);
    let bytes = std::fs::read(&trees).unwrap();
    std::fs::write(&trees, &bytes[..bytes.len() - 3]).unwrap();
    let err = restore::verify(&dest).unwrap_err();
    assert_eq!(
        err,
        format!(
            "{} is {} bytes, the manifest says {}: the backup is damaged or incomplete; use another backup",
            trees.display(),
            bytes.len() - 3,
            bytes.len()
        )
    );
    // A byte changed, same size.
    let mut flipped = bytes.clone();
    flipped[30] ^= 0xff;
    std::fs::write(&trees, &flipped).unwrap();
    let err = restore::verify(&dest).unwrap_err();
    assert!(err.ends_with("does not match its checksum in the manifest: the backup is damaged; use another backup"), "{err}");
    // No manifest: never finished.
    std::fs::remove_file(dest.join(MANIFEST)).unwrap();
    let err = restore::restore(&dest, &root.path().join("new")).unwrap_err();
    assert!(
        err.contains("has no manifest.json: the backup did not finish"),
        "{err}"
    );
    assert!(!root.path().join("new").exists(), "nothing written");
}
