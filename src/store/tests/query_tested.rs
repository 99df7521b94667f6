use uuid::Uuid;

use super::super::tests::{filters, fixture, naive, open};
use super::*;
use crate::store::event::StoredEvent;
use crate::store::keys;
use crate::store::query::{events, EventFilter};

/// Keeps the events whose `n` is odd, those having property `key` when given (which
/// none has in the fixture).
struct Odd {
    key: Option<&'static str>,
}

fn odd(e: &StoredEvent) -> bool {
    e.properties["n"].as_u64().unwrap() % 2 == 1
}

impl BlockTest for Odd {
    fn key(&self) -> Option<String> {
        self.key.map(str::to_owned)
    }

    fn keep(&mut self, rows: &Rows, left: &mut Vec<u32>) -> Result<(), sled::Error> {
        if self.key.is_some() {
            // Loaded only by a read without the index past its bound: none has it.
            left.clear();
        }
        left.retain(|&i| odd(&rows.stored(i as usize).unwrap()));
        Ok(())
    }
}

/// Every page of `f`'s odd events in turn, each page reading at most `budget` blocks
/// (more only to move below its cursor), following the cursors: a full page's is its
/// last event's, else where the read stopped. Each cursor is below the one before.
fn pages(
    trees: &crate::store::Trees,
    project: u64,
    f: &EventFilter,
    (limit, budget): (usize, usize),
    key: Option<&'static str>,
) -> (Vec<StoredEvent>, usize) {
    let mut out = Vec::new();
    let mut cursor: Option<[u8; 32]> = None;
    for page in 1.. {
        let test = Box::new(Odd { key });
        let from = cursor.as_ref().map(|c| &c[..]);
        let mut walk = events(trees, project, f.clone(), from).tested(test, budget);
        let mut found = Vec::new();
        let mut last = None;
        for entry in walk.by_ref() {
            let (key, event) = entry.unwrap();
            found.push(event);
            last = Some(key);
            if found.len() >= limit {
                break;
            }
        }
        let next = match found.len() >= limit {
            true => last,
            false => (walk.stopped_at()).map(|(t, u)| keys::event(project, t, Uuid::from_u128(u))),
        };
        out.extend(found);
        match next {
            Some(c) => {
                assert!(cursor.is_none_or(|old| c < old), "page {page} moved on");
                cursor = Some(c);
            }
            None => return (out, page),
        }
    }
    unreachable!()
}

#[test]
fn pages_bounded_in_blocks_return_every_match_once_in_order() {
    for seed in [1, 2, 3] {
        let (_dir, trees) = open();
        let all = fixture(&trees, seed);
        // The four commonest: each runs at five bounds.
        let filters: Vec<EventFilter> = filters().into_iter().take(4).collect();
        for project in [1, 2] {
            for (i, f) in filters.iter().enumerate() {
                let want: Vec<StoredEvent> =
                    naive(&all, project, f).into_iter().filter(odd).collect();
                // Small bounds page through block by block (each page reading the
                // blocks that reach back over its cursor again), so fewer of them.
                for (budget, limit) in
                    [(1, 100_000), (2, 40), (5, 25), (1_000, 7), (1_000, 100_000)]
                {
                    if budget == 1 && (seed, project) != (1, 1) {
                        continue;
                    }
                    let ctx = format!(
                        "seed {seed} project {project} filter {i} budget {budget} limit {limit}"
                    );
                    let (got, pages) = pages(&trees, project, f, (limit, budget), None);
                    assert_eq!(got, want, "{ctx}");
                    if budget == 1_000 && limit == 100_000 {
                        assert_eq!(pages, 1, "{ctx}: within the bound, one page");
                    }
                }
            }
        }
    }
}

/// A key no event has: through the index no block is loaded and one page says so;
/// without it (not built yet) every block is passed over unloaded, within the bound
/// of blocks passed over for each it may load, so the pages still move on.
#[test]
fn blocks_without_the_key_are_not_loaded_and_the_pages_still_move_on() {
    let (dir, trees) = open();
    fixture(&trees, 4);
    let nobody = Some("nobody");
    assert_eq!(
        pages(&trees, 1, &EventFilter::default(), (10, 3), nobody),
        (vec![], 1)
    );
    let walk = events(&trees, 1, EventFilter::default(), None);
    let mut walk = walk.tested(Box::new(Odd { key: nobody }), 3);
    assert!(walk.through_index());
    assert!(walk.next().is_none());
    assert_eq!((walk.stopped_at(), walk.examined()), (None, 0));

    let mut unbuilt = trees.clone();
    unbuilt.event_index = crate::store::event_index::Index::unopened(dir.path());
    let (got, pages) = pages(&unbuilt, 1, &EventFilter::default(), (10, 3), nobody);
    assert!(got.is_empty());
    let blocks = trees.events.scan_prefix(keys::project(1)).count();
    assert!(
        pages > 1 && pages * 3 * PASSED_A_LOAD >= blocks,
        "{pages} pages for {blocks} blocks"
    );
}
