use super::super::Trees;
use super::*;
use crate::support::lcg::Lcg;

fn trees() -> (tempfile::TempDir, Trees) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let trees = Trees::open(&db, dir.path()).unwrap();
    (dir, trees)
}

fn key(i: u64) -> Vec<u8> {
    format!("person-{i:05}").into_bytes()
}

fn value(i: u64, round: u64) -> Vec<u8> {
    format!(
        "{{\"n\":{i},\"round\":{round},\"pad\":\"{}\"}}",
        "x".repeat((i % 50) as usize)
    )
    .into_bytes()
}

/// Every key of `0..n`, read through `kept` and as the table answers, the same.
fn same(kept: &Kept, table: &Layered, n: u64) {
    for i in 0..n {
        let through = kept.get(table, &key(i));
        assert_eq!(through, table.get(key(i)).unwrap(), "key {i}");
    }
}

/// Persons `0..n` written with their first values, in the delta.
fn write_first(table: &Layered, n: u64) {
    table
        .write(
            (0..n)
                .map(|i| (key(i).into(), value(i, 0).into()))
                .collect(),
        )
        .unwrap();
}

#[test]
fn values_read_through_it_are_the_tables_through_changes_removals_and_folds() {
    let (_dir, trees) = trees();
    let table = &trees.persons;
    let kept = Kept::new(1 << 20);
    let mut rng = Lcg(38);
    let n = 400;
    write_first(table, n);
    // Before any fold, all is in the delta: nothing is kept.
    same(&kept, table, n + 5);
    assert_eq!(kept.held().0, 0);
    for round in 1..6 {
        table.fold().unwrap();
        same(&kept, table, n + 5);
        assert!(kept.held().0 > 0, "values read from the runs are kept");
        // Changes and removals at random keys, some then folded, some left in the delta.
        let mut changes = Vec::new();
        for _ in 0..60 {
            let i = rng.next(n);
            let v = match rng.next(4) {
                0 => Vec::new(),
                _ => value(i, round),
            };
            changes.push((key(i).into(), v.into()));
        }
        table.write(changes).unwrap();
        same(&kept, table, n + 5);
    }
}

#[test]
fn the_bytes_kept_stay_within_the_bound() {
    let (_dir, trees) = trees();
    let table = &trees.persons;
    let n = 2_000;
    write_first(table, n);
    table.fold().unwrap();
    let capacity = 16 * 1024;
    let kept = Kept::new(capacity);
    same(&kept, table, n);
    let (count, bytes) = kept.held();
    assert!(bytes <= capacity, "{bytes} bytes kept");
    assert!(count > 50 && (count as u64) < n, "{count} kept");
    // The newest kept are the last read.
    let last = key(n - 1);
    assert!(lock(&kept.inner).values.contains_key(&last[..]));
}
