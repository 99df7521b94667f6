use serde_json::json;

use super::*;
use crate::store::block::{self, Entry};
use crate::store::event_index;
use crate::support::lcg::Lcg;

pub(super) const HOUR: i64 = 3_600_000;

/// Blocks written as the compactor writes them: chunks of events, some in a narrow
/// time range (realtime), some spread over hours or far in the past (historical,
/// out-of-order clocks), with repeated timestamps; returns every event stored.
pub(super) fn fixture(trees: &Trees, seed: u64) -> Vec<(u64, StoredEvent)> {
    let mut rng = Lcg(seed);
    let mut all = Vec::new();
    let mut next_id = 0u64;
    let mut uuid = 0u128;
    for chunk in 0..60 {
        let project = 1 + rng.next(2);
        let (base, spread) = match chunk % 3 {
            0 => (10 * HOUR + chunk as i64 * 1000, 2000),
            1 => (rng.next(20) as i64 * HOUR, 5 * HOUR),
            _ => (rng.next(40) as i64 * HOUR / 2, 3),
        };
        let mut entries = Vec::new();
        for _ in 0..1 + rng.next(120) {
            uuid += 1 + u128::from(rng.next(3));
            // Uuids out of time order too, as client-made uuids are.
            let id = uuid::Uuid::from_u128(uuid.reverse_bits());
            let e = StoredEvent {
                uuid: id,
                event: ["a", "b", "c"][rng.next(3) as usize].into(),
                distinct_id: format!("d{}", rng.next(4)),
                properties: json!({"n": uuid as u64}).as_object().unwrap().clone(),
                timestamp: base + rng.next(spread as u64) as i64,
                created_at: 0,
                person_id: None,
            };
            entries.push(Entry::from_stored(&e));
            all.push((project, e));
        }
        for built in block::build_indexed(entries) {
            put(trees, project, next_id, built);
            next_id += 1;
        }
    }
    all
}

/// Block `id` of `project` stored and then indexed, as the compactor does.
pub(super) fn put(trees: &Trees, project: u64, id: u64, built: block::Built) {
    trees
        .events
        .insert(keys::block(project, built.newest, id), built.value)
        .unwrap();
    let block = event_index::BlockRef {
        id,
        project,
        newest: built.newest,
        oldest: built.oldest,
    };
    trees.event_index.add(&[event_index::NewBlock {
        block,
        distinct_ids: built.distinct_ids,
        events: built.events,
        properties: built.properties,
    }]);
}

pub(super) fn open() -> (tempfile::TempDir, Trees) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let trees = Trees::open(&db, dir.path()).unwrap();
    (dir, trees)
}

pub(super) fn naive(all: &[(u64, StoredEvent)], project: u64, f: &EventFilter) -> Vec<StoredEvent> {
    let mut out: Vec<StoredEvent> = all
        .iter()
        .filter(|(p, e)| {
            *p == project
                && f.after.is_none_or(|t| e.timestamp >= t)
                && f.before.is_none_or(|t| e.timestamp < t)
                && f.event.as_deref().is_none_or(|n| e.event == n)
                && f.distinct_id.as_deref().is_none_or(|d| e.distinct_id == d)
        })
        .map(|(_, e)| e.clone())
        .collect();
    out.sort_by_key(|e| std::cmp::Reverse((e.timestamp, e.uuid)));
    out
}

/// Every page in turn, following the cursors.
pub(super) fn paged(
    trees: &Trees,
    project: u64,
    f: &EventFilter,
    limit: usize,
) -> Vec<StoredEvent> {
    let mut out = Vec::new();
    let mut cursor: Option<[u8; 32]> = None;
    loop {
        let (page, next) = events_page(
            trees,
            project,
            f.clone(),
            cursor.as_ref().map(|c| &c[..]),
            limit,
        )
        .unwrap();
        assert!(page.len() <= limit);
        out.extend(page);
        match next {
            Some(c) => cursor = Some(c),
            None => return out,
        }
    }
}

/// The filters the paging tests run, the commonest first.
pub(super) fn filters() -> Vec<EventFilter> {
    vec![
        EventFilter::default(),
        EventFilter {
            event: Some("b".into()),
            ..EventFilter::default()
        },
        EventFilter {
            distinct_id: Some("d2".into()),
            after: Some(5 * HOUR),
            ..EventFilter::default()
        },
        EventFilter {
            after: Some(3 * HOUR + 17),
            before: Some(11 * HOUR),
            ..EventFilter::default()
        },
        EventFilter {
            before: Some(10 * HOUR + 30_000),
            event: Some("a".into()),
            distinct_id: Some("d0".into()),
            ..EventFilter::default()
        },
        EventFilter {
            after: Some(100 * HOUR),
            ..EventFilter::default()
        },
        EventFilter {
            event: Some("c".into()),
            after: Some(2 * HOUR),
            before: Some(10 * HOUR + 1_000),
            ..EventFilter::default()
        },
        EventFilter {
            event: Some("a".into()),
            distinct_id: Some("d3".into()),
            after: Some(4 * HOUR),
            before: Some(20 * HOUR),
            ..EventFilter::default()
        },
        EventFilter {
            event: Some("none has it".into()),
            ..EventFilter::default()
        },
    ]
}

#[test]
fn newest_first_across_overlapping_blocks_with_paging_and_filters() {
    for seed in [1, 2, 3] {
        let (_dir, trees) = open();
        let all = fixture(&trees, seed);
        let filters = filters();
        for project in [1, 2, 3] {
            for (i, f) in filters.iter().enumerate() {
                let want = naive(&all, project, f);
                let ctx = format!("seed {seed} project {project} filter {i}");
                for limit in [1, 7, 100, 100_000] {
                    assert_eq!(
                        paged(&trees, project, f, limit),
                        want,
                        "{ctx} limit {limit}"
                    );
                }
                let through = events(&trees, project, f.clone(), None).through_index();
                let asks = f.distinct_id.is_some() || f.event.is_some();
                assert_eq!(through, asks, "{ctx}");
                let streamed: Vec<StoredEvent> = events(&trees, project, f.clone(), None)
                    .map(|e| e.unwrap().1)
                    .collect();
                assert_eq!(streamed, want, "{ctx}");
            }
        }
    }
}

/// The index names exactly the blocks that may hold a filter's events: those with an
/// event of the name, and of the distinct id (not necessarily the same event), in the
/// time range; none for a name no event has.
#[test]
fn the_index_names_only_the_blocks_that_may_hold_matches() {
    let (_dir, trees) = open();
    fixture(&trees, 5);
    let blocks: Vec<(u64, i64, i64, block::Block)> = trees
        .events
        .iter()
        .map(|kv| {
            let (k, v) = kv.unwrap();
            let (project, newest) = keys::split_block(&k).unwrap();
            let b = block::Block::decode(&v).unwrap();
            let oldest = b.heads()[0].timestamp;
            (project, newest, oldest, b)
        })
        .collect();
    let filters = [
        (Some("a"), None, None, None),
        (Some("none has it"), None, None, None),
        (None, Some("d1"), None, None),
        (Some("c"), Some("d2"), None, None),
        (Some("b"), None, Some(3 * HOUR), Some(9 * HOUR)),
    ];
    for (event, who, after, before) in filters {
        let f = EventFilter {
            event: event.map(str::to_owned),
            distinct_id: who.map(str::to_owned),
            after,
            before,
            ..EventFilter::default()
        };
        let holds =
            |b: &block::Block, keep: &dyn Fn(&block::Head) -> bool| b.heads().iter().any(keep);
        let want = blocks
            .iter()
            .filter(|(project, newest, oldest, b)| {
                *project == 1
                    && after.is_none_or(|t| *newest >= t)
                    && before.is_none_or(|t| *oldest < t)
                    && event.is_none_or(|n| holds(b, &|h| b.event(h) == n))
                    && who.is_none_or(|d| holds(b, &|h| b.distinct_id(h) == d))
            })
            .count();
        let named = events(&trees, 1, f.clone(), None).named_blocks();
        assert_eq!(named, Some(want), "{f:?}");
        assert!(want > 0 || event == Some("none has it"), "{f:?}");
    }
}

#[test]
fn cursors_of_another_project_or_shape_match_nothing() {
    let (_dir, trees) = open();
    let all = fixture(&trees, 4);
    let (project, e) = &all[0];
    let other = keys::event(project + 1, e.timestamp, e.uuid);
    let page = events_page(&trees, *project, EventFilter::default(), Some(&other), 10).unwrap();
    assert!(page.0.is_empty() && page.1.is_none());
    let page = events_page(&trees, *project, EventFilter::default(), Some(&[1, 2]), 10).unwrap();
    assert!(page.0.is_empty());
}

#[test]
fn a_damaged_block_hides_only_itself() {
    let (_dir, trees) = open();
    let good = StoredEvent {
        uuid: uuid::Uuid::from_u128(1),
        event: "e".into(),
        distinct_id: "d".into(),
        properties: serde_json::Map::new(),
        timestamp: 5,
        created_at: 5,
        person_id: None,
    };
    let (newest, value) = block::build(vec![Entry::from_stored(&good)]).remove(0);
    trees
        .events
        .insert(keys::block(1, newest, 0), value)
        .unwrap();
    trees
        .events
        .insert(keys::block(1, 9, 1), &b"damaged"[..])
        .unwrap();
    let (page, _) = events_page(&trees, 1, EventFilter::default(), None, 10).unwrap();
    assert_eq!(page, [good]);
}

/// Each chunk stores one block of its current events plus one event that arrived late
/// (clients that were offline), so every block reaches back most of an hour. Listing
/// them must not keep every such block decoded until its late event comes up.
#[test]
fn blocks_reaching_back_are_not_all_held_decoded() {
    let (_dir, trees) = open();
    let mut all = Vec::new();
    let base = 10 * HOUR;
    let event = |uuid: u128, timestamp: i64| StoredEvent {
        uuid: uuid::Uuid::from_u128(uuid),
        event: "e".into(),
        distinct_id: format!("d{}", uuid % 7),
        properties: json!({"n": uuid as u64}).as_object().unwrap().clone(),
        timestamp,
        created_at: 0,
        person_id: None,
    };
    let chunks = 300u128;
    for c in 0..chunks {
        let now = base + c as i64 * 1000;
        let mut chunk = vec![event(c * 1000, now - 50 * 60 * 1000)];
        chunk.extend((1..100).map(|i| event(c * 1000 + i, now + i as i64)));
        let blocks = block::build(chunk.iter().map(Entry::from_stored).collect());
        assert_eq!(blocks.len(), 1);
        for (newest, value) in blocks {
            let key = keys::block(1, newest, c as u64);
            trees.events.insert(key, value).unwrap();
        }
        all.extend(chunk.into_iter().map(|e| (1, e)));
    }
    let mut listed = Vec::new();
    let mut most_decoded = 0;
    let mut it = events(&trees, 1, EventFilter::default(), None);
    while let Some(entry) = it.next() {
        listed.push(entry.unwrap().1);
        most_decoded = most_decoded.max(it.decoded_blocks());
    }
    assert_eq!(listed, naive(&all, 1, &EventFilter::default()));
    assert!(
        most_decoded <= 4,
        "{most_decoded} blocks held decoded at once"
    );
}
