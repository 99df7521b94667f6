//! A key's places: the next place from every place and each place's membership equal a
//! plain search of the read order, as a list and as bits, across gaps longer than a
//! summary word; the names a run keeps stay within its budget, the least recently
//! read going first.

use super::*;

/// `n` blocks whose times mostly follow their ids, every fifth from far back.
fn table(n: u64) -> Vec<BlockRef> {
    (0..n)
        .map(|i| {
            let newest = match i % 5 {
                2 => 1_000 + (i as i64 * 7919) % 50_000,
                _ => 100_000 + i as i64 * 10,
            };
            BlockRef {
                id: i * 3 + 1,
                project: 1,
                newest,
                oldest: newest - 5,
            }
        })
        .collect()
}

fn check(blocks: &[BlockRef], ids: &[u64], bits: bool) {
    let order = ByNewest::of(blocks);
    let places = Places::of(blocks, &order, ids);
    assert_eq!(places.is_bits(), bits, "{} ids", ids.len());
    // A plain search of the read order: whether each place's block has one of `ids`,
    // and from the end back, the first such place at or after each.
    let wanted: std::collections::HashSet<u64> = ids.iter().copied().collect();
    let named: Vec<bool> = (order.order.iter())
        .map(|&row| wanted.contains(&blocks[row as usize].id))
        .collect();
    let mut next = vec![None; named.len() + 1];
    for p in (0..named.len()).rev() {
        next[p] = if named[p] { Some(p) } else { next[p + 1] };
    }
    for (at, &has) in named.iter().enumerate() {
        assert_eq!(places.has(at), has, "place {at}");
    }
    for at in 0..=blocks.len() + 70 {
        let want = next.get(at).copied().flatten();
        assert_eq!(places.next_from(at), want, "from {at}, {} ids", ids.len());
    }
}

#[test]
fn places_as_a_list_or_bits_follow_the_read_order() {
    let blocks = table(20_000);
    let all: Vec<u64> = blocks.iter().map(|b| b.id).collect();
    // In every block; in every third; in few; in none; ids the run does not name.
    check(&blocks, &all, true);
    let third: Vec<u64> = all.iter().copied().step_by(3).collect();
    check(&blocks, &third, true);
    let few: Vec<u64> = all.iter().copied().step_by(997).collect();
    check(&blocks, &few, false);
    check(&blocks, &[], false);
    check(&blocks, &[0, 2, 5, 60_001], false);
    // Common in the oldest blocks only, and in two far apart: the next place is past
    // gaps of many summary words.
    let old: Vec<u64> = all
        .iter()
        .copied()
        .filter(|id| (id - 1) / 3 % 5 == 2)
        .collect();
    check(&blocks, &old, true);
    let mut ends: Vec<u64> = all[..2_600].to_vec();
    ends.extend_from_slice(&all[19_990..]);
    check(&blocks, &ends, true);
}

fn list(n: u32) -> Arc<Places> {
    Arc::new(Places::List((0..n).collect()))
}

#[test]
fn a_runs_names_stay_within_its_budget_the_least_recently_read_going_first() {
    // 1,000 blocks: 8,000 bytes; each name below takes its key, 1,600 bytes and the
    // overhead, so four fit and a fifth pushes out the one read longest ago.
    let names = Names::new(1_000);
    for k in [b"a", b"b", b"c", b"d"] {
        names.put(k, list(400));
    }
    assert!(names.get(b"a").is_some());
    names.put(b"e", list(400));
    assert!(names.get(b"b").is_none(), "b was read least recently");
    for k in [b"a", b"c", b"d", b"e"] {
        assert!(names.get(k).is_some());
    }
    assert!(names.bytes() <= 8_000, "{}", names.bytes());
    assert_eq!(names.bytes(), 4 * (1 + 1_600 + HELD_OVERHEAD));
    // A name larger than the whole budget is not kept, and pushes nothing out.
    names.put(b"huge", list(2_100));
    assert!(names.get(b"huge").is_none());
    assert!(names.get(b"a").is_some());
    // Put again, a name replaces its places rather than counting them twice.
    names.put(b"a", list(400));
    assert_eq!(names.bytes(), 4 * (1 + 1_600 + HELD_OVERHEAD));
}
