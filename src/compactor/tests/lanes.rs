//! The slower lanes: spiking distinct ids go to the overflow lane and historical
//! batches to their own, in order, and nothing is dropped.

use super::*;

#[test]
fn spikes_go_to_overflow_and_are_never_dropped() {
    let mut f = fixture(Compaction {
        overflow_rate: 1.0,
        overflow_burst: 3.0,
        ..Compaction::default()
    });
    let mut records: Vec<Record> = (0..10)
        .map(|i| record(1, i, json!({"event": "spam", "distinct_id": "loud"})))
        .collect();
    records.push(record(
        1,
        10,
        json!({"event": "normal", "distinct_id": "quiet"}),
    ));
    f.push(&records);
    // The first step applies the burst and the quiet user's event, and parks the rest.
    let first = f.compactor.step().unwrap();
    assert_eq!(first.realtime, 11);
    assert_eq!(f.compactor.stats.to_overflow.load(Ordering::Relaxed), 7);
    f.drain();
    let events = f.events(1);
    assert_eq!(events.iter().filter(|e| e.event == "spam").count(), 10);
    assert_eq!(events.iter().filter(|e| e.event == "normal").count(), 1);
    assert!(f.trees.overflow.is_empty());
}

#[test]
fn historical_batches_use_their_own_lane_in_order() {
    let mut f = fixture(Compaction {
        overflow_rate: 1.0,
        overflow_burst: 1.0,
        ..Compaction::default()
    });
    let records: Vec<Record> = (0..20)
        .map(|i| {
            let set = json!({"event": "import", "distinct_id": "old-user", "$set": {"n": i}});
            Record {
                historical: true,
                ..record(1, i, set)
            }
        })
        .collect();
    f.push(&records);
    f.drain();
    // Never spike-routed despite a limit of one event, and applied in order: the
    // last $set wins.
    assert_eq!(f.compactor.stats.to_overflow.load(Ordering::Relaxed), 0);
    assert_eq!(f.compactor.stats.to_historical.load(Ordering::Relaxed), 20);
    let person = query::person_by_distinct_id(&f.trees, 1, "old-user")
        .unwrap()
        .unwrap();
    assert_eq!(person.properties["n"], 19);
    assert_eq!(f.events(1).len(), 20);
}
