//! Where the store's memory goes: each holder's bytes by its own count, for
//! `/metrics` (`flagpost_memory_bytes`) and the scale benchmark. The caches count
//! what they weigh against their budgets; the tables' deltas, the event index's
//! recent part and the runs' indexes are estimated from their entries
//! (`layered::delta::entry_footprint`), since their maps' nodes and the allocator's
//! rounding are most of what short keys and values cost.

use super::{layered, Trees};

/// Each holder of the open store and its bytes, named as `/metrics` labels them.
pub fn holders(trees: &Trees) -> Vec<(&'static str, u64)> {
    let mut out = vec![
        ("event_block_cache", trees.blocks.cached_bytes() as u64),
        ("run_block_cache", layered::cache::global().bytes() as u64),
        (
            "person_bytes",
            super::person_bytes::global().held().1 as u64,
        ),
    ];
    let mut runs = 0;
    for (name, table) in [
        ("persons_delta", &trees.persons),
        ("distinct_ids_delta", &trees.distinct_ids),
        ("first_seen_delta", &trees.first_seen),
        ("by_property_delta", &trees.by_property),
    ] {
        let (delta, resident) = table.memory_bytes();
        out.push((name, delta));
        runs += resident;
    }
    out.push(("table_run_indexes", runs));
    let (recent, index_runs) = trees.event_index.memory_bytes();
    out.push(("event_index_recent", recent));
    out.push(("event_index_runs", index_runs));
    out
}
