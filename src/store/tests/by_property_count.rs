use serde_json::{json, Map, Value};
use uuid::Uuid;

use super::*;
use crate::store::by_property::{self, candidates};
use crate::store::first_seen;
use crate::support::lcg::Lcg;

fn trees() -> (tempfile::TempDir, Trees) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let trees = Trees::open(&db, dir.path()).unwrap();
    (dir, trees)
}

/// A person as the counts see it: its first event and properties, if stored.
type Held = Option<(i64, Map<String, Value>)>;

/// The counts a count of `persons` (project 1) makes.
fn fresh(persons: &[(Uuid, Held)]) -> Counts {
    let mut moves = Moves::default();
    for (_, p) in persons {
        moves.person(1, None, p.as_ref().map(|(t, props)| (*t, props)));
    }
    moves.totals()
}

/// A random change of a person: deleted, its first event moved, a key set or removed,
/// or made again.
fn change(g: &mut Lcg, was: &Held) -> Held {
    match (g.next(10), was) {
        (0, _) => None,
        (1, Some((_, props))) => Some((g.next(5) as i64, props.clone())),
        _ => {
            let mut props = was.as_ref().map(|w| w.1.clone()).unwrap_or_default();
            let key = format!("k{}", g.next(4));
            match g.next(4) {
                0 => drop(props.remove(&key)),
                _ => drop(props.insert(key, json!(g.next(3)))),
            }
            let born = was.as_ref().map_or(g.next(5) as i64, |w| w.0);
            Some((born, props))
        }
    }
}

fn indexed(p: &Held) -> Option<by_property::Indexed<'_>> {
    p.as_ref().map(|(t, props)| (*t, props))
}

#[test]
fn the_counts_follow_gains_losses_moves_and_deletes() {
    let (_dir, trees) = trees();
    assert_eq!(Kept::read(|k| trees.by_property.get(k).unwrap()), Kept::All);
    let mut g = Lcg(3);
    let mut persons: Vec<(Uuid, Held)> = (0..30u128).map(|i| (Uuid::from_u128(i), None)).collect();
    for round in 0..400 {
        let i = g.next(persons.len() as u64) as usize;
        let (id, was) = persons[i].clone();
        let now = change(&mut g, &was);
        write_changes(&trees, [(1, id, indexed(&was), indexed(&now))]);
        persons[i].1 = now;
        if round % 50 == 0 {
            trees.by_property.fold().unwrap();
        }
    }
    let want = fresh(&persons);
    assert!(want.len() > 3, "persons and several keys counted: {want:?}");
    assert_eq!(held(&trees.by_property), want);
    let stored = persons.iter().filter(|p| p.1.is_some()).count() as u64;
    let holders = (persons.iter())
        .filter(|p| p.1.as_ref().is_some_and(|p| p.1.contains_key("k1")))
        .count() as u64;
    assert_eq!(of(&trees, 1, "k1").unwrap(), Some((holders, stored)));
    assert_eq!(of(&trees, 2, "k1").unwrap(), Some((0, 0)));
}

#[test]
fn a_build_counts_every_person_once_while_the_compactor_changes_them() {
    let (_dir, trees) = trees();
    let mut g = Lcg(9);
    let stored = |born: i64, p: &Map<String, Value>| {
        serde_json::to_vec(&json!({"created_at": born, "properties": p})).unwrap()
    };
    let mut persons: Vec<(Uuid, Held)> = Vec::new();
    for i in 0..5_000u128 {
        let id = Uuid::from_u128(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let p = change(&mut g, &Some((i as i64, Map::new())));
        let bytes = p.as_ref().map_or(Vec::new(), |(t, p)| stored(*t, p));
        trees.persons.insert(keys::with_uuid(1, id), bytes).unwrap();
        persons.push((id, p));
    }
    // Stored directly: the counts are built, as for a database written before them.
    by_property::start_build(&trees).unwrap();
    assert!(by_property::building(&trees.meta).unwrap());
    assert_eq!(of(&trees, 1, "k0").unwrap(), None);
    let mut build = by_property::Build::new(&trees);
    let mut steps = 0;
    loop {
        // The compactor's changes between two steps, counted only for the persons
        // already counted.
        for _ in 0..20 {
            let i = g.next(persons.len() as u64) as usize;
            let (id, was) = persons[i].clone();
            let now = change(&mut g, &was);
            let bytes = now.as_ref().map_or(Vec::new(), |(t, p)| stored(*t, p));
            trees.persons.insert(keys::with_uuid(1, id), bytes).unwrap();
            write_changes(&trees, [(1, id, indexed(&was), indexed(&now))]);
            persons[i].1 = now;
        }
        steps += 1;
        if steps == 4 {
            // A restart goes on from where the counts say, even if `meta` lost the
            // mark that a build is due (a crash the table's journal survived).
            trees.meta.remove(DUE).unwrap();
            assert!(!building(&trees.meta).unwrap());
            prepare(&trees).unwrap();
            assert!(building(&trees.meta).unwrap());
            build = by_property::Build::new(&trees);
        }
        if build.step(&trees).unwrap() == Step::Done {
            break;
        }
    }
    assert!(steps > 5, "{steps} steps");
    assert!(!by_property::building(&trees.meta).unwrap());
    assert_eq!(Kept::read(|k| trees.by_property.get(k).unwrap()), Kept::All);
    assert_eq!(held(&trees.by_property), fresh(&persons));
}

/// Persons 0 to n-1 (first event i), each with the properties `props(i)`, stored in
/// the first-seen index and the index by property with its counts.
fn indexed_persons(trees: &Trees, n: u128, props: impl Fn(u128) -> Value) -> Vec<[u8; 32]> {
    let persons: Vec<(Uuid, i64, Map<String, Value>)> = (0..n)
        .map(|i| {
            let p = props(i).as_object().cloned().unwrap_or_default();
            (Uuid::from_u128(i + 1), i as i64, p)
        })
        .collect();
    let changed = (persons.iter()).map(|(id, born, p)| (1, *id, None, Some((*born, p))));
    write_changes(trees, changed);
    let seen: Vec<_> = (persons.iter())
        .map(|(id, born, _)| keys::first_seen(1, *born, *id))
        .collect();
    let writes = (seen.iter())
        .map(|k| (IVec::from(&k[..]), IVec::from(first_seen::PRESENT)))
        .collect();
    trees.first_seen.write(writes).unwrap();
    seen
}

/// A stale entry, written as a racing build once left one: no count moves.
fn stale(trees: &Trees, id: u128, born: i64, props: Value) {
    let props = props.as_object().cloned().unwrap_or_default();
    let mut writes = Vec::new();
    by_property::changes(
        1,
        Uuid::from_u128(id + 1),
        None,
        Some((born, &props)),
        |k, v| writes.push((IVec::from(k), IVec::from(v))),
    );
    trees.by_property.write(writes).unwrap();
}

#[test]
fn a_key_everyone_holds_is_read_for_its_values_alone() {
    let (_dir, trees) = trees();
    let seen = indexed_persons(
        &trees,
        50,
        |i| json!({"os": if i == 7 { "Linux" } else { "Mac" }}),
    );
    // `is_not` Mac: the one Linux; the others hold the key, so none lacks it.
    let not_mac = |text: &[u8], _: bool| text != b"\"Mac\"";
    let got = candidates(&trees, 1, "os", None, true, None, not_mac).unwrap();
    assert_eq!(got, Some(vec![seen[7]]));
    // A stale entry of another value of a key its person holds hides no one.
    stale(&trees, 3, 3, json!({"os": "Windows"}));
    let got = candidates(&trees, 1, "os", None, true, None, not_mac).unwrap();
    assert_eq!(
        got,
        Some(vec![seen[7], seen[3]]),
        "the Linux, and the stale one"
    );
    let nobody = candidates(&trees, 1, "os", None, true, None, |_, _| false).unwrap();
    assert_eq!(nobody, Some(Vec::new()));
}

#[test]
fn a_stale_entry_of_a_key_its_person_lacks_is_told_by_the_counts() {
    let (_dir, trees) = trees();
    let seen = indexed_persons(&trees, 40, |i| match i % 4 {
        0 => json!({}),
        _ => json!({"plan": "pro"}),
    });
    let lacking: Vec<[u8; 32]> = seen.iter().step_by(4).rev().copied().collect();
    let not_pro = |text: &[u8], _: bool| text != b"\"pro\"";
    let got = candidates(&trees, 1, "plan", None, true, None, not_pro).unwrap();
    assert_eq!(got, Some(lacking.clone()));
    // Person 8 lacks `plan`, but an entry says it has it: the index cannot answer.
    stale(&trees, 8, 8, json!({"plan": "pro"}));
    let got = candidates(&trees, 1, "plan", None, true, None, not_pro).unwrap();
    assert_eq!(got, None);
    // A test only holders pass still reads the index.
    let pro = |text: &[u8], _: bool| text == b"\"pro\"";
    let got = candidates(&trees, 1, "plan", None, false, None, pro).unwrap();
    assert_eq!(got.map(|g| g.len()), Some(31));
}

#[test]
fn counts_are_not_entries() {
    let holders = holders_key(1, "plan").unwrap();
    assert!(is_count(&holders) && is_count(&persons_key(1)) && is_count(&STATE_KEY));
    let mut entry = None;
    let props: Map<String, Value> = [("plan".to_owned(), json!("x".repeat(200)))]
        .into_iter()
        .collect();
    by_property::changes(1, Uuid::nil(), None, Some((0, &props)), |k, _| {
        entry = Some(k)
    });
    assert!(!is_count(&entry.unwrap()));
}
