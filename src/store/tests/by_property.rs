use serde_json::json;

use super::*;
use crate::support::lcg::Lcg;

fn trees() -> (tempfile::TempDir, Trees) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let trees = Trees::open(&db, dir.path()).unwrap();
    (dir, trees)
}

/// The table's entries, without its counts.
fn entries(trees: &Trees) -> Vec<(Vec<u8>, Vec<u8>)> {
    let held = trees.by_property.iter().map(|kv| kv.unwrap());
    let held = held.filter(|(k, _)| !count::is_count(k));
    held.map(|(k, v)| (k.to_vec(), v.to_vec())).collect()
}

/// A person as the index sees it, by uuid: its first event and properties, if stored.
type Kept = (Uuid, Option<(i64, Map<String, Value>)>);

/// The index's entries of persons, as a build makes them.
fn fresh(persons: &[Kept]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    for (id, p) in persons {
        let now = p.as_ref().map(|(t, props)| (*t, props));
        changes(1, *id, None, now, |k, v| out.push((k, v.to_vec())));
    }
    out.sort();
    out
}

#[test]
fn a_persons_changes_leave_the_entries_a_build_would_make() {
    // Persons changed at random (values set, replaced, removed, the first event moved,
    // deleted, made again): the table written by `changes` alone holds what a build
    // from the persons as they end would.
    let (_dir, trees) = trees();
    let mut g = Lcg(7);
    let ids: Vec<Uuid> = (0..20u128).map(Uuid::from_u128).collect();
    let mut persons: Vec<Kept> = ids.iter().map(|id| (*id, None)).collect();
    let long = "x".repeat(VALUE_BYTES * 2);
    let values = [
        json!("pro"),
        json!("free"),
        json!(3),
        json!(3.5),
        json!(true),
        json!(null),
        json!(["a", 1]),
        json!({"k": "v"}),
        json!(format!("{long}1")),
        json!(format!("{long}2")),
    ];
    for _ in 0..2_000 {
        let i = g.next(persons.len() as u64) as usize;
        let (id, was) = persons[i].clone();
        let now = match (g.next(10), &was) {
            (0, _) => None,
            (1, Some((_, props))) => Some((g.next(5) as i64, props.clone())),
            (_, _) => {
                let mut props = was.as_ref().map(|w| w.1.clone()).unwrap_or_default();
                let key = format!("k{}", g.next(4));
                match g.next(4) {
                    0 => drop(props.remove(&key)),
                    _ => drop(props.insert(key, values[g.next(10) as usize].clone())),
                }
                let born = was.as_ref().map_or(g.next(5) as i64, |w| w.0);
                Some((born, props))
            }
        };
        let mut writes = Vec::new();
        changes(
            1,
            id,
            was.as_ref().map(|(t, p)| (*t, p)),
            now.as_ref().map(|(t, p)| (*t, p)),
            |k, v| writes.push((IVec::from(k), IVec::from(v))),
        );
        trees.by_property.write(writes).unwrap();
        persons[i].1 = now;
        if g.next(50) == 0 {
            trees.by_property.fold().unwrap();
        }
    }
    let held: Vec<(Vec<u8>, Vec<u8>)> = entries(&trees);
    assert_eq!(held, fresh(&persons));
}

#[test]
fn candidates_are_each_tested_value_once_newest_first() {
    let (_dir, trees) = trees();
    let mut writes = Vec::new();
    let long = json!("y".repeat(VALUE_BYTES + 1));
    for (i, v) in [json!("a"), json!("b"), json!("a"), long.clone(), json!("a")]
        .iter()
        .enumerate()
    {
        let props: Map<String, Value> = [("plan".to_owned(), v.clone())].into_iter().collect();
        let id = Uuid::from_u128(i as u128);
        changes(1, id, None, Some((i as i64, &props)), |k, v| {
            writes.push((IVec::from(k), IVec::from(v)))
        });
        // Another project and another key are not read.
        changes(2, id, None, Some((i as i64, &props)), |k, v| {
            writes.push((IVec::from(k), IVec::from(v)))
        });
        let other: Map<String, Value> = [("plans".to_owned(), v.clone())].into_iter().collect();
        changes(1, id, None, Some((i as i64, &other)), |k, v| {
            writes.push((IVec::from(k), IVec::from(v)))
        });
    }
    trees.by_property.write(writes).unwrap();
    let mut tested = Vec::new();
    let found = candidates(&trees, 1, "plan", None, false, None, |text, cut| {
        tested.push((String::from_utf8_lossy(text).into_owned(), cut));
        text == b"\"a\"" || cut
    })
    .unwrap()
    .unwrap();
    let cut = format!("\"{}", "y".repeat(VALUE_BYTES - 1));
    assert_eq!(
        tested,
        [
            ("\"a\"".to_owned(), false),
            ("\"b\"".to_owned(), false),
            (cut, true)
        ]
    );
    let times: Vec<i64> = found
        .iter()
        .map(|k| keys::split_first_seen(k).unwrap().0)
        .collect();
    assert_eq!(times, [4, 3, 2, 0]);
    // After a first-seen key: only older persons.
    let after = candidates(&trees, 1, "plan", Some(&found[1]), false, None, |_, _| true);
    let after = after.unwrap().unwrap();
    let times: Vec<i64> = after
        .iter()
        .map(|k| keys::split_first_seen(k).unwrap().0)
        .collect();
    assert_eq!(times, [2, 1, 0]);
    // A key too long to be indexed has no entries.
    let long_key = "k".repeat(MAX_KEY_BYTES + 1);
    assert_eq!(key_prefix(1, &long_key), None);
}

#[test]
fn a_build_indexes_stored_persons_and_resumes() {
    let (_dir, trees) = trees();
    for i in 0..3_000i64 {
        let name = format!("u{i}");
        let mut properties = Map::new();
        properties.insert("n".into(), json!(i % 7));
        let p = crate::persons::Person {
            id: crate::persons::id_for(1, &name),
            created_at: i,
            properties,
            distinct_ids: vec![name.clone()],
            is_identified: false,
            first_distinct_id: name,
        };
        let key = keys::with_uuid(1, p.id);
        trees
            .persons
            .insert(key, serde_json::to_vec(&p).unwrap())
            .unwrap();
    }
    assert!(ready(&trees.meta).unwrap());
    start_build(&trees).unwrap();
    assert!(!ready(&trees.meta).unwrap() && building(&trees.meta).unwrap());
    // The index is the first half of the build, its counts the second.
    assert_eq!(Build::new(&trees).step(&trees).unwrap(), Step::Progress(17));
    // A restart builds a new plan; the position is in `meta`.
    let build = Build::new(&trees);
    while build.step(&trees).unwrap() != Step::Done {}
    assert!(ready(&trees.meta).unwrap());
    let threes = candidates(&trees, 1, "n", None, false, None, |t, _| t == b"3");
    let threes = threes.unwrap().unwrap();
    let times: Vec<i64> = threes
        .iter()
        .map(|k| keys::split_first_seen(k).unwrap().0)
        .collect();
    let want: Vec<i64> = (0..3_000).rev().filter(|i| i % 7 == 3).collect();
    assert_eq!(times, want);
}

#[test]
fn a_build_step_puts_right_what_the_compactor_changed_while_it_ran() {
    // A step read the persons; the compactor then changed some (values, first event,
    // deleted) and wrote their entries; the step's own write of what it read then
    // brought back the entries of the values as they were. Put right, the table holds
    // what a build from the persons as they are would.
    let (_dir, trees) = trees();
    let mut g = Lcg(11);
    let values = [json!("pro"), json!("free"), json!(3), json!(null)];
    let props = |g: &mut Lcg| -> Map<String, Value> {
        let mut p = Map::new();
        for k in 0..4 {
            if g.next(3) > 0 {
                p.insert(format!("k{k}"), values[g.next(4) as usize].clone());
            }
        }
        p
    };
    let stored = |born: i64, p: &Map<String, Value>| {
        serde_json::to_vec(&json!({"created_at": born, "properties": p})).unwrap()
    };
    let mut persons: Vec<Kept> = Vec::new();
    let mut read = Vec::new();
    for i in 0..40u128 {
        let (id, born, p) = (Uuid::from_u128(i), g.next(5) as i64, props(&mut g));
        let bytes = stored(born, &p);
        trees
            .persons
            .insert(keys::with_uuid(1, id), &bytes)
            .unwrap();
        read.push((1, id, IVec::from(bytes)));
        persons.push((id, Some((born, p))));
    }
    for (id, person) in persons.iter_mut() {
        let now = match g.next(4) {
            0 => None,
            1 => person.clone().map(|(born, p)| (born + 1, p)),
            2 => Some((person.as_ref().map_or(0, |p| p.0), props(&mut g))),
            _ => continue,
        };
        let key = keys::with_uuid(1, *id);
        let bytes = now.as_ref().map_or(Vec::new(), |(t, p)| stored(*t, p));
        trees.persons.insert(key, bytes).unwrap();
        let mut writes = Vec::new();
        let was = person.as_ref().map(|(t, p)| (*t, p));
        changes(1, *id, was, now.as_ref().map(|(t, p)| (*t, p)), |k, v| {
            writes.push((IVec::from(k), IVec::from(v)))
        });
        trees.by_property.write(writes).unwrap();
        *person = now;
    }
    let mut step = Vec::new();
    for (_, id, bytes) in &read {
        let p: Stored = serde_json::from_slice(bytes).unwrap();
        changes(1, *id, None, Some(p.indexed()), |k, v| {
            step.push((IVec::from(k), IVec::from(v)))
        });
    }
    trees.by_property.write(step).unwrap();
    let held = || entries(&trees);
    assert_ne!(
        held(),
        fresh(&persons),
        "the step's write left stale entries"
    );
    put_right(&trees, &read).unwrap();
    assert_eq!(held(), fresh(&persons));
}
