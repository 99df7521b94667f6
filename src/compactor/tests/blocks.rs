//! The block thread's tests: parts against a chunk made at once, failures, panics,
//! chunks given up, and the thread's absence.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use uuid::Uuid;

use super::*;
use crate::store::block::files::{DIR_SYNC, FILE_SYNC};

/// `n` events of each of two projects, a minute apart, some persons each.
fn entries(n: usize) -> Part {
    let one = |project: u64, i: usize| Entry {
        timestamp: 1_700_000_000_000 + i as i64 * 60_000,
        created_at: 1_700_000_000_000 + i as i64 * 60_000 + 5,
        uuid: Uuid::from_u128((project as u128) << 64 | i as u128),
        person_id: Some(Uuid::from_u128(i as u128 % 13)),
        event: ["$pageview", "$autocapture"][i % 2].into(),
        distinct_id: format!("user-{}", i % 13),
        properties: format!(r#"{{"$current_url":"https://a.example/{i}","n":{i}}}"#).into(),
    };
    [1, 2]
        .into_iter()
        .map(|p| (p, (0..n).map(|i| one(p, i)).collect()))
        .collect()
}

/// `entries` cut in parts of `each` events of each project, in order.
fn parts(entries: Part, each: usize) -> Vec<Part> {
    let mut out: Vec<Part> = Vec::new();
    for (project, list) in entries {
        for (i, some) in list.chunks(each).enumerate() {
            if out.len() == i {
                out.push(Part::new());
            }
            out[i].insert(project, some.to_vec());
        }
    }
    out
}

fn chunk(dir: &std::path::Path) -> Chunk {
    Chunk {
        first_block: 7,
        files: Files::open(dir).unwrap(),
        index: event_index::Index::unopened(dir),
    }
}

/// Count, build, index, append and sync a chunk's blocks here, from one part.
fn store(chunk: Chunk, part: Part) -> io::Result<Stored> {
    let mut making = Making::new(chunk);
    making.part(part)?;
    making.finish()
}

/// Hand `parts` over to a chunk made on the thread, and wait.
fn made(builder: &Builder, chunk: Chunk, parts: Vec<Part>) -> io::Result<Stored> {
    let mut building = builder.start(chunk);
    for part in parts {
        building.add(part);
    }
    building.wait()
}

/// Each block's project and newest time (its key without the id, which follows
/// the projects' order) and bytes.
type Blocks = Vec<(Vec<u8>, Vec<u8>)>;

/// What a chunk stored, read back: its blocks and their ids.
fn read_back(files: &Files, stored: &Stored) -> (Blocks, Vec<u64>) {
    let (mut blocks, mut ids) = (Vec::new(), Vec::new());
    for (key, pointer) in &stored.blocks {
        let bytes = files.resolve(pointer).unwrap().into_owned();
        blocks.push((key[..16].to_vec(), bytes));
        ids.push(u64::from_be_bytes(key[16..].try_into().unwrap()));
    }
    blocks.sort();
    ids.sort();
    (blocks, ids)
}

#[test]
fn blocks_made_on_the_thread_part_after_part_are_the_ones_made_here_at_once() {
    let (there, here) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let builder = Builder::new(0);
    let (on_thread, in_place) = (chunk(there.path()), chunk(here.path()));
    let (files_there, files_here) = (on_thread.files.clone(), in_place.files.clone());
    // Parts that end within blocks: each project's last block is left open.
    let a = made(&builder, on_thread, parts(entries(700), 45)).unwrap();
    let b = store(in_place, entries(700)).unwrap();
    assert!(matches!(builder.thread.get(), Some(Some(_))));
    // 700 events a minute apart span more than an hour: several blocks a project.
    assert!(a.blocks.len() >= 4, "{} blocks", a.blocks.len());
    assert_eq!(a.next_block, 7 + a.blocks.len() as u64);
    assert_eq!(a.next_block, b.next_block);
    assert_eq!(a.counted, b.counted);
    let (blocks, ids) = read_back(&files_there, &a);
    assert_eq!(ids, (7..a.next_block).collect::<Vec<_>>());
    assert_eq!((blocks, ids), read_back(&files_here, &b));
}

#[test]
fn chunks_are_made_on_the_block_thread() {
    let builder = Builder::new(0);
    let name = Arc::new(Mutex::new(None));
    let seen = name.clone();
    let mut building = builder.run(Box::new(move |handed| {
        *seen.lock().unwrap() = std::thread::current().name().map(str::to_owned);
        make(chunk(tempfile::tempdir().unwrap().path()), handed)
    }));
    building.add(Part::new());
    let stored = building.wait().unwrap();
    assert!(stored.blocks.is_empty());
    assert_eq!(stored.next_block, 7);
    assert_eq!(name.lock().unwrap().as_deref(), Some("compactor-block"));
}

#[test]
fn a_chunk_the_thread_cannot_take_is_made_here_part_after_part() {
    let (there, here) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let builder = Builder::new(0);
    // A thread that is gone gives every job back.
    assert!(builder
        .thread
        .set(Some(Worker::gone("compactor-block")))
        .is_ok());
    let (in_parts, at_once) = (chunk(there.path()), chunk(here.path()));
    let (files_parts, files_once) = (in_parts.files.clone(), at_once.files.clone());
    let name = Arc::new(Mutex::new(None));
    let seen = name.clone();
    let mut building = builder.run(Box::new(move |handed| {
        *seen.lock().unwrap() = std::thread::current().name().map(str::to_owned);
        make(in_parts, handed)
    }));
    for part in parts(entries(300), 45) {
        building.add(part);
    }
    let a = building.wait().unwrap();
    let b = store(at_once, entries(300)).unwrap();
    // Made on this test's thread, not a block thread's.
    assert_ne!(name.lock().unwrap().as_deref(), Some("compactor-block"));
    assert!(!a.blocks.is_empty());
    assert_eq!(a.counted, b.counted);
    assert_eq!(read_back(&files_parts, &a), read_back(&files_once, &b));
}

#[test]
fn a_failed_sync_on_the_thread_comes_back_and_the_next_chunk_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let builder = Builder::new(0);
    let first = chunk(dir.path());
    first.files.syncs().fail(FILE_SYNC, 0);
    let failed = made(&builder, first, parts(entries(50), 20));
    assert!(failed.is_err());
    let again = chunk(dir.path());
    let files = again.files.clone();
    let stored = made(&builder, again, parts(entries(50), 20)).unwrap();
    assert!(!stored.blocks.is_empty());
    assert_eq!(read_back(&files, &stored).0.len(), stored.blocks.len());
}

#[test]
fn a_failure_in_a_middle_part_comes_back_and_the_next_chunk_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let builder = Builder::new(0);
    let first = chunk(dir.path());
    let files = first.files.clone();
    // The second block file cannot be made: the first part's blocks fit in the
    // first, a later part's do not.
    files.syncs().fail(DIR_SYNC, 1);
    let all = parts(entries(3000), 300);
    assert!(all.len() >= 4);
    let failed = made(&builder, first, all.clone());
    assert!(failed.is_err());
    assert_eq!(files.syncs().count(DIR_SYNC), 1);
    // The parts handed over after the failure were dropped, not waited on; the
    // next chunk is stored whole.
    let stored = made(&builder, chunk(dir.path()), all).unwrap();
    let whole = store(chunk(tempfile::tempdir().unwrap().path()), entries(3000));
    assert_eq!(stored.counted, whole.unwrap().counted);
    assert_eq!(read_back(&files, &stored).0.len(), stored.blocks.len());
}

#[test]
fn a_chunk_given_up_part_way_and_made_again_counts_and_indexes_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let index = event_index::Index::open(dir.path(), 7, true).unwrap();
    let builder = Builder::new(0);
    let with_index = || Chunk {
        index: index.clone(),
        ..chunk(dir.path())
    };
    let all = parts(entries(700), 45);
    // A transaction sled runs again: the first try hands over some parts and
    // returns without waiting.
    let mut tried = builder.start(with_index());
    for part in all.iter().take(5) {
        tried.add(part.clone());
    }
    drop(tried);
    let stored = made(&builder, with_index(), all).unwrap();
    let whole = store(chunk(tempfile::tempdir().unwrap().path()), entries(700)).unwrap();
    assert_eq!(stored.counted, whole.counted);
    assert_eq!(stored.next_block, whole.next_block);
    // The index holds each block once, under its id of the try that committed.
    let status = index.status();
    assert_eq!(status.recent_blocks, stored.blocks.len());
}

#[test]
fn a_chunk_given_up_after_its_end_is_synced_unnamed_and_made_again_once() {
    let dir = tempfile::tempdir().unwrap();
    let index = event_index::Index::open(dir.path(), 7, true).unwrap();
    let builder = Builder::new(0);
    let files = chunk(dir.path()).files;
    let with_index = || Chunk {
        first_block: 7,
        files: files.clone(),
        index: index.clone(),
    };
    let all = parts(entries(700), 45);
    // Every part and the end handed over, then the transaction fails before it
    // waits (the persons' journal, say): the blocks are made and synced all the same.
    let mut tried = builder.start(with_index());
    for part in all.iter().cloned() {
        tried.add(part);
    }
    tried.end();
    // Handed over once: a second end is nothing.
    tried.end();
    drop(tried);
    assert_eq!(files.syncs().count(FILE_SYNC), 1);
    let stored = made(&builder, with_index(), all).unwrap();
    let once = tempfile::tempdir().unwrap();
    let at_once = chunk(once.path());
    let files_once = at_once.files.clone();
    let whole = store(at_once, entries(700)).unwrap();
    assert_eq!(stored.counted, whole.counted);
    assert_eq!(stored.next_block, whole.next_block);
    assert_eq!(read_back(&files, &stored), read_back(&files_once, &whole));
    // The index holds each block once, under its id of the try that committed.
    assert_eq!(index.status().recent_blocks, stored.blocks.len());
}

#[test]
fn a_panic_in_a_middle_part_is_raised_on_the_waiting_thread() {
    let builder = Builder::new(0);
    let mut building = builder.run(Box::new(|handed| {
        let _first = handed.recv();
        panic!("a block that cannot be made")
    }));
    // More parts than the queue holds: the hand-over does not wait on a thread
    // that stopped making the chunk.
    for part in parts(entries(100), 10) {
        building.add(part);
    }
    let Err(raised) = panic::catch_unwind(AssertUnwindSafe(|| building.wait())) else {
        panic!("the panic was not raised");
    };
    assert_eq!(
        raised.downcast_ref::<&str>(),
        Some(&"a block that cannot be made")
    );
    // The thread goes on with the next chunk.
    let dir = tempfile::tempdir().unwrap();
    let next = made(&builder, chunk(dir.path()), parts(entries(10), 5));
    assert!(!next.unwrap().blocks.is_empty());
}

#[test]
fn a_transaction_returning_early_still_waits_for_its_blocks() {
    let builder = Builder::new(0);
    let done = Arc::new(AtomicBool::new(false));
    let finished = done.clone();
    let mut building = builder.run(Box::new(move |handed| {
        let made = make(chunk(tempfile::tempdir().unwrap().path()), handed);
        std::thread::sleep(Duration::from_millis(50));
        finished.store(true, Ordering::SeqCst);
        made
    }));
    building.add(entries(10));
    drop(building);
    assert!(done.load(Ordering::SeqCst));
}
