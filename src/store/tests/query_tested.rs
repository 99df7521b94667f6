use uuid::Uuid;

use super::super::tests::{filters, fixture, naive, open};
use super::*;
use crate::store::event::StoredEvent;
use crate::store::keys;
use crate::store::query::{events, EventFilter};

/// Keeps the events whose `n` is odd; skips undecoded the blocks `skip` says to.
struct Odd {
    skip_all: bool,
}

fn odd(e: &StoredEvent) -> bool {
    e.properties["n"].as_u64().unwrap() % 2 == 1
}

impl BlockTest for Odd {
    fn skips(&mut self, value: &[u8]) -> bool {
        assert!(block::count(value).is_some(), "given the block's bytes");
        self.skip_all
    }

    fn keep(&mut self, rows: &Rows, left: &mut Vec<u32>) {
        assert!(!self.skip_all, "a skipped block is not decoded");
        left.retain(|&i| odd(&rows.stored(i as usize).unwrap()));
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
    skip_all: bool,
) -> (Vec<StoredEvent>, usize) {
    let mut out = Vec::new();
    let mut cursor: Option<[u8; 32]> = None;
    for page in 1.. {
        let test = Box::new(Odd { skip_all });
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
                    let (got, pages) = pages(&trees, project, f, (limit, budget), false);
                    assert_eq!(got, want, "{ctx}");
                    if budget == 1_000 && limit == 100_000 {
                        assert_eq!(pages, 1, "{ctx}: within the bound, one page");
                    }
                }
            }
        }
    }
}

#[test]
fn blocks_the_test_skips_are_not_decoded_and_the_pages_still_move_on() {
    let (_dir, trees) = open();
    fixture(&trees, 4);
    let (got, pages) = pages(&trees, 1, &EventFilter::default(), (10, 3), true);
    assert!(got.is_empty());
    assert!(pages > 3, "{pages} pages of at most 3 blocks each");
    let mut walk = events(&trees, 1, EventFilter::default(), None)
        .tested(Box::new(Odd { skip_all: true }), usize::MAX);
    assert!(walk.next().is_none());
    assert!(walk.stopped_at().is_none());
    assert!(
        walk.examined() > 0,
        "the skipped blocks' events count as examined"
    );
}
