use std::sync::Arc;

use super::*;
use crate::store::layered::runs::Part;
use crate::store::layered::Writer;

/// A run set of `sizes.len()` parts, part `i` holding `sizes[i]` keys of 100 bytes.
fn runs(dir: &std::path::Path, sizes: &[u32]) -> Runs {
    let mut parts = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let file = format!("t.{i:010}.part");
        let mut w = Writer::create(&dir.join(&file)).unwrap();
        for k in 0..n {
            w.push(format!("{i:02}{k:08}").as_bytes(), &[7u8; 90])
                .unwrap();
        }
        w.finish().unwrap();
        let run = Arc::new(crate::store::layered::Run::open(&dir.join(&file)).unwrap());
        let lower = match i {
            0 => Box::from(&b""[..]),
            _ => format!("{i:02}").into_bytes().into(),
        };
        parts.push(Part { lower, file, run });
    }
    Runs::new(parts)
}

#[test]
fn the_parts_whose_share_is_due_are_chosen() {
    let dir = tempfile::tempdir().unwrap();
    let r = runs(dir.path(), &[100, 100, 100, 100]);
    // Part 1 passes an eighth of its 10 KB, part 3 has a little, the others none.
    let choice = choose(&r, &[0, 2_000, 0, 300], Take::Due, u64::MAX, 0);
    assert_eq!(choice.parts, [1]);
    // None due (a fold when idle): every part with changes.
    let choice = choose(&r, &[0, 500, 0, 300], Take::Due, u64::MAX, 0);
    assert_eq!(choice.parts, [1, 3]);
    assert_eq!(
        choose(&r, &[0, 0, 0, 0], Take::Due, u64::MAX, 0).parts,
        Vec::<usize>::new()
    );
}

#[test]
fn a_fold_for_memory_takes_every_part_with_changes_though_one_is_due() {
    let dir = tempfile::tempdir().unwrap();
    let r = runs(dir.path(), &[100, 100, 100, 100]);
    let delta = [0, 2_000, 0, 300];
    assert_eq!(choose(&r, &delta, Take::Due, u64::MAX, 0).parts, [1]);
    assert_eq!(choose(&r, &delta, Take::Every, u64::MAX, 0).parts, [1, 3]);
    // The limit still holds, the most changed first.
    assert_eq!(choose(&r, &delta, Take::Every, 1, 0).parts, [1]);
}

#[test]
fn the_limit_takes_the_most_changed_first_and_at_least_one() {
    let dir = tempfile::tempdir().unwrap();
    let r = runs(dir.path(), &[100, 100, 100, 100]);
    let choice = choose(&r, &[3_000, 2_000, 5_000, 0], Take::Due, 6_000, 0);
    assert_eq!(choice.parts, [0, 2]);
    let choice = choose(&r, &[3_000, 2_000, 5_000, 0], Take::Due, 1, 0);
    assert_eq!(choice.parts, [2]);
}

#[test]
fn without_runs_the_whole_table_is_one_part() {
    let r = Runs::default();
    assert_eq!(choose(&r, &[10], Take::Due, u64::MAX, 0).parts, [0]);
    assert_eq!(
        choose(&r, &[0], Take::Due, u64::MAX, 0).parts,
        Vec::<usize>::new()
    );
}

#[test]
fn a_small_part_chosen_takes_its_neighbour_along() {
    let dir = tempfile::tempdir().unwrap();
    // Parts of 10 KB, the second and the last shrunk to 1 KB.
    let r = runs(dir.path(), &[100, 10, 100, 10]);
    assert_eq!(
        choose(&r, &[0, 500, 0, 0], Take::Due, u64::MAX, 10_000).parts,
        [1, 2]
    );
    assert_eq!(
        choose(&r, &[0, 0, 0, 500], Take::Due, u64::MAX, 10_000).parts,
        [2, 3]
    );
    assert_eq!(
        choose(&r, &[0, 0, 2_000, 0], Take::Due, u64::MAX, 10_000).parts,
        [2]
    );
}
