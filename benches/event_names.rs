//! What the event index does for a page of events by name or by a property key
//! (`event_names`), at the block count of 1 M events (17,300 blocks, as the scale
//! scenario stores them) and of 20 M (346,000), side by side: `Index::blocks` for the
//! name or key, then the first blocks of the page taken newest first. Only the index's work: the blocks themselves are
//! read the same at any size (a page of `$pageview` reads its newest one or two). The
//! index is made as the server makes it: blocks added a chunk at a time, each chunk's
//! recent part folded into a run by the worker and the runs merged; each block's key
//! is stored (empty), so the merges keep it.
//!
//! Names as the scale traffic has them: `$pageview` in every block; `$identify` in
//! the oldest twentieth of the blocks; `$create_alias` in the oldest two-hundredth;
//! `$set` in one block in seven throughout. Property keys likewise: a dozen of
//! posthog-js's in every block, `$set` in one in seven, `alias` (what `$create_alias`
//! carries) in the oldest two-hundredth and `plan` in one block in five hundred
//! throughout; one block in a thousand keeps an event's properties whole (it may hold
//! any key). Cases: each name's first page; each key's (the console's events where a
//! property is set: without the index, `alias` read every block); the
//! `$pageview` page a tenth of the way back (`before`, as a cursor there asks); a name
//! no block has; and the first `$pageview` and `$identify` pages of an index just
//! opened (its runs as a start finds them, no read made yet: what a name's first read
//! after a start, a fold or a merge costs), the opening itself not timed.

#[path = "common/mod.rs"]
mod common;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use flagpost::store::block::PropertyKeys;
use flagpost::store::event_index::{Ask, BlockRef, Index, NewBlock, Step};
use flagpost::store::{keys, Trees};

/// Block counts: the scale scenario's 1 M events and the 20 M, at the 58
/// events a block it stores.
const SIZES: [u64; 2] = [17_300, 346_000];
/// Blocks a compactor chunk stores at once.
const CHUNK: u64 = 64;
/// The span the blocks' times cover: the scale traffic's 30 days.
const SPAN_MS: i64 = 30 * 24 * 3_600_000;
/// Blocks a page takes: a page of 100 `$pageview` events takes two, the reader
/// looks at one more.
const TAKEN: usize = 3;

fn names(i: u64, blocks: u64) -> Vec<String> {
    let mut out = vec!["$pageview".to_string()];
    if i < blocks / 20 {
        out.push("$identify".into());
    }
    if i < blocks / 200 {
        out.push("$create_alias".into());
    }
    if i % 7 == 3 {
        out.push("$set".into());
    }
    out
}

/// posthog-js's property keys every web event has.
const EVERY_BLOCK: [&str; 12] = [
    "$browser",
    "$browser_version",
    "$current_url",
    "$device_id",
    "$device_type",
    "$host",
    "$lib",
    "$lib_version",
    "$os",
    "$pathname",
    "$referrer",
    "$session_id",
];

fn properties(i: u64, blocks: u64) -> PropertyKeys {
    let mut keys: Vec<String> = EVERY_BLOCK.iter().map(|k| k.to_string()).collect();
    if i < blocks / 200 {
        keys.push("alias".into());
    }
    if i % 7 == 3 {
        keys.push("$set".into());
    }
    if i % 500 == 250 {
        keys.push("plan".into());
    }
    keys.sort_unstable();
    PropertyKeys {
        keys,
        any: i % 1000 == 999,
    }
}

/// The trees with `blocks` blocks indexed, folded and merged.
fn indexed(blocks: u64) -> (tempfile::TempDir, sled::Db, Trees) {
    let (dir, db) = common::open_db("event-names");
    let trees = Trees::open(&db, dir.path()).expect("the trees open");
    let step_ms = SPAN_MS / blocks as i64;
    for first in (0..blocks).step_by(CHUNK as usize) {
        let mut chunk = Vec::new();
        for id in first..(first + CHUNK).min(blocks) {
            let newest = common::NOW_MS - SPAN_MS + id as i64 * step_ms;
            let block = BlockRef {
                id,
                project: 1,
                newest,
                oldest: newest - step_ms / 2,
            };
            trees
                .events
                .insert(keys::block(1, newest, id), &[][..])
                .expect("sled stores");
            let distinct_ids = (0..20).map(|n| format!("user-{}", (id * 20 + n) % 50_000));
            chunk.push(NewBlock {
                block,
                distinct_ids: distinct_ids.collect(),
                events: names(id, blocks),
                properties: properties(id, blocks),
            });
        }
        trees.event_index.add(&chunk);
        trees.event_index.committed();
        while trees.event_index.step(&trees).expect("the index writes") != Step::Idle {}
    }
    (dir, db, trees)
}

/// The index's work for the first page of `event` before `newest`.
fn page(index: &Index, event: &str, newest: Option<i64>) -> usize {
    let ask = Ask {
        project: 1,
        distinct_ids: None,
        event: Some(event),
        property: None,
        oldest: i64::MIN,
        newest,
    };
    taken(index, &ask)
}

/// The index's work for the first page of events with property `key`.
fn keyed(index: &Index, key: &str) -> usize {
    let ask = Ask {
        project: 1,
        distinct_ids: None,
        event: None,
        property: Some(key),
        oldest: i64::MIN,
        newest: None,
    };
    taken(index, &ask)
}

/// The first blocks of the page `ask` names.
fn taken(index: &Index, ask: &Ask) -> usize {
    let mut blocks = index
        .blocks(ask)
        .expect("the runs read")
        .expect("the index is built");
    (0..TAKEN).filter_map(|_| blocks.pop()).count()
}

fn bench(c: &mut Criterion) {
    for blocks in SIZES {
        let (dir, _db, trees) = indexed(blocks);
        let status = trees.event_index.status();
        println!(
            "event_names: {blocks} blocks in {} runs ({} bytes) and {} recent",
            status.runs, status.bytes, status.recent_blocks
        );
        let back = common::NOW_MS - SPAN_MS / 10;
        let cases: [(&str, &str, Option<i64>); 6] = [
            ("$pageview", "$pageview", None),
            ("$pageview, a tenth back", "$pageview", Some(back)),
            ("$set", "$set", None),
            ("$identify", "$identify", None),
            ("$create_alias", "$create_alias", None),
            ("none has it", "none has it", None),
        ];
        let mut group = c.benchmark_group(format!("event_names/{blocks} blocks"));
        let index = &trees.event_index;
        for (what, event, newest) in cases {
            let took = page(index, event, newest);
            assert!(took == TAKEN || event == "none has it", "{what}: {took}");
            group.bench_function(what, |b| b.iter(|| black_box(page(index, event, newest))));
        }
        for key in ["$current_url", "$set", "alias", "plan", "none has it"] {
            let took = keyed(index, key);
            assert!(took == TAKEN || key == "none has it", "{key}: {took}");
            group.bench_function(format!("key {key}"), |b| {
                b.iter(|| black_box(keyed(index, key)))
            });
        }
        // The runs alone, as a start opens them: the blocks they cover are all stored.
        let opened = || Index::open(dir.path(), status.covered, false).expect("the runs open");
        for event in ["$pageview", "$identify"] {
            assert_eq!(page(&opened(), event, None), TAKEN, "{event}, just opened");
            group.bench_function(format!("{event}, just opened"), |b| {
                b.iter_batched(
                    opened,
                    // The index is dropped after the timing, with the output.
                    |index| black_box((page(&index, event, None), index)),
                    BatchSize::PerIteration,
                )
            });
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = bench
}
criterion_main!(benches);
