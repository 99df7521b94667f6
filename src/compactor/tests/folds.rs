//! The layered tables folded beside the compactor: on the fold thread the compactor
//! hands them to, and on another thread folding without pause, while chunks are
//! applied. What is stored must be what a compactor that never folds stores.

use std::sync::atomic::AtomicBool;

use super::*;
use crate::compactor::fold::Moment;

/// Events over `persons` distinct ids: property changes, identifies linking pairs.
pub(super) fn events(from: i64, count: i64, persons: i64) -> Vec<Record> {
    (from..from + count)
        .map(|i| {
            let id = format!("user-{}", (i * 7919) % persons);
            let event = match i % 11 {
                0 => json!({"event": "$identify", "distinct_id": id,
                    "properties": {"$anon_distinct_id": format!("anon-{}", i % persons)}}),
                _ => json!({"event": "e", "distinct_id": id,
                    "properties": {"$set": {"n": i, "plan": format!("p{}", i % 3)}}}),
            };
            record(1, i, event)
        })
        .collect()
}

#[test]
fn folds_beside_the_compactor_change_nothing_that_is_stored() {
    let mut with = fixture(Compaction::default());
    let mut without = fixture(Compaction::default());
    let tables: Vec<_> = with.trees.tables().map(Clone::clone).into();
    let stop = AtomicBool::new(false);
    let folds = std::thread::scope(|s| {
        let folder = s.spawn(|| {
            let mut folds = 0;
            while !stop.load(Ordering::Relaxed) {
                for t in &tables {
                    t.fold().unwrap();
                    folds += 1;
                }
            }
            folds
        });
        for round in 0..20 {
            let chunk = events(round * 100, 100, 300);
            for f in [&mut with, &mut without] {
                f.push(&chunk);
                f.drain();
            }
            // The compactor's own schedule too: due tables go to its fold thread.
            with.compactor.fold_tables(Moment::Busy);
        }
        stop.store(true, Ordering::Relaxed);
        folder.join().unwrap()
    });
    assert!(folds > 8, "{folds} folds only");
    // The folders may have folded the last chunk's changes too: once the compactor's
    // fold under way is done, one more chunk, not folded, so the reopen below replays a
    // journal over the runs.
    with.compactor.fold_tables(Moment::Stop);
    let last = events(2_000, 100, 300);
    for f in [&mut with, &mut without] {
        f.push(&last);
        f.drain();
    }
    // As a start finds them: the tables' journal, carried over by every fold, replayed
    // over their runs.
    let contents = |trees: &Trees| -> Vec<Vec<_>> {
        let tables = trees.tables();
        tables
            .iter()
            .map(|t| t.iter().map(|kv| kv.unwrap()).collect())
            .collect()
    };
    assert!(with.trees.tables().iter().any(|t| t.delta_len() > 0));
    let reopened = Trees::open(&with.db, with._dir.path()).unwrap();
    assert_eq!(contents(&reopened), contents(&with.trees));
    drop(reopened);
    // A stop waits for the fold under way, then folds what is left.
    with.compactor.fold_tables(Moment::Stop);
    for t in with.trees.tables() {
        assert_eq!(t.pending(), 0, "{}", t.name());
    }
    assert_eq!(with.state(1), without.state(1));
    let everyone = |f: &Fixture| {
        let persons = query::persons(&f.trees, 1, 1000).unwrap();
        let persons: Vec<_> = persons
            .into_iter()
            .map(|p| (p.id, p.distinct_ids, p.properties))
            .collect();
        let tables: Vec<Vec<_>> = f
            .trees
            .tables()
            .iter()
            .map(|t| t.iter().map(|kv| kv.unwrap()).collect())
            .collect();
        (persons, tables)
    };
    assert_eq!(everyone(&with), everyone(&without));
}
