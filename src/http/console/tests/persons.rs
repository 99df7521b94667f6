use serde_json::Map;

use super::*;
use crate::store::rollup::backfill::Step;

/// Persons u0 (oldest) to u{n-1} (newest), a second apart, plan "pro" for every third,
/// stored and indexed as a build of the index does it.
fn stored(n: i64) -> (tempfile::TempDir, Trees) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let trees = Trees::open(&db, dir.path()).unwrap();
    for i in 0..n {
        let name = format!("u{i}");
        let mut properties = Map::new();
        if i % 3 == 0 {
            properties.insert("plan".into(), json!("pro"));
        }
        let p = Person {
            id: crate::persons::id_for(1, &name),
            created_at: 1_000 * i,
            properties,
            distinct_ids: vec![name.clone(), format!("alias-{i}")],
            is_identified: true,
            first_distinct_id: name.clone(),
        };
        let value = serde_json::to_vec(&p).unwrap();
        trees
            .persons
            .insert(keys::with_uuid(1, p.id), value)
            .unwrap();
        for id in &p.distinct_ids {
            let key = keys::with_str(1, id);
            trees
                .distinct_ids
                .insert(key, &p.id.as_bytes()[..])
                .unwrap();
        }
    }
    first_seen::start_build(&trees).unwrap();
    let build = first_seen::Build::new(&trees);
    while build.step(&trees).unwrap() != Step::Done {}
    (dir, trees)
}

fn names(page: &Page) -> Vec<&str> {
    page.persons
        .iter()
        .map(|p| p.first_distinct_id.as_str())
        .collect()
}

fn span(cursor: Option<Vec<u8>>, limit: usize, examine: usize) -> Span {
    Span {
        cursor,
        offset: 0,
        limit,
        examine,
    }
}

#[test]
fn pages_go_newest_first_from_a_cursor_to_the_end() {
    let (_dir, trees) = stored(7);
    let first = newest(&trees, 1, None, span(None, 3, 100)).unwrap();
    assert_eq!(names(&first), ["u6", "u5", "u4"]);
    assert_eq!((first.examined, first.complete), (3, false));
    let second = newest(&trees, 1, None, span(first.next.clone(), 3, 100)).unwrap();
    assert_eq!(names(&second), ["u3", "u2", "u1"]);
    // The last page is short, or full with nothing after it: complete either way.
    let last = newest(&trees, 1, None, span(second.next.clone(), 3, 100)).unwrap();
    assert_eq!((names(&last), last.complete), (vec!["u0"], true));
    assert_eq!(last.next, None);
    let exact = newest(&trees, 1, None, span(first.next, 4, 100)).unwrap();
    assert_eq!(names(&exact), ["u3", "u2", "u1", "u0"]);
    assert_eq!((exact.complete, exact.next), (true, None));
    let skipped = Span {
        offset: 2,
        ..span(None, 2, 100)
    };
    assert_eq!(
        names(&newest(&trees, 1, None, skipped).unwrap()),
        ["u4", "u3"]
    );
    // Another project has no one.
    let other = newest(&trees, 2, None, span(None, 3, 100)).unwrap();
    assert_eq!((other.persons.len(), other.complete), (0, true));
}

#[test]
fn a_property_search_stops_where_it_was_told_and_goes_on_from_there() {
    let (_dir, trees) = stored(20);
    let params = Params::parse(Some("property=plan&value=pro"));
    let pro = Matcher::from_params(&params).unwrap().unwrap();
    // u19 to u15 examined: only u18 and u15 are pro.
    let first = newest(&trees, 1, Some(&pro), span(None, 10, 5)).unwrap();
    assert_eq!(names(&first), ["u18", "u15"]);
    assert_eq!((first.examined, first.complete), (5, false));
    let second = newest(&trees, 1, Some(&pro), span(first.next, 10, 5)).unwrap();
    assert_eq!(names(&second), ["u12"]);
    // A page that fills up stops there.
    let full = newest(&trees, 1, Some(&pro), span(None, 3, 100)).unwrap();
    assert_eq!(names(&full), ["u18", "u15", "u12"]);
    assert_eq!(full.examined, 8);
    let rest = newest(&trees, 1, Some(&pro), span(full.next, 100, 100)).unwrap();
    assert_eq!(names(&rest), ["u9", "u6", "u3", "u0"]);
    assert_eq!((rest.examined, rest.complete, rest.next), (12, true, None));
}

#[test]
fn a_distinct_id_prefix_reads_the_distinct_ids_in_order() {
    let (_dir, trees) = stored(12);
    let all = by_prefix(&trees, 1, "u1", None, 10).unwrap();
    assert_eq!(names(&all), ["u1", "u10", "u11"]);
    assert!(all.complete);
    let first = by_prefix(&trees, 1, "alias-1", None, 2).unwrap();
    assert_eq!((names(&first), first.complete), (vec!["u1", "u10"], false));
    let rest = by_prefix(&trees, 1, "alias-1", first.next, 2).unwrap();
    assert_eq!((names(&rest), rest.complete), (vec!["u11"], true));
    assert_eq!(
        by_prefix(&trees, 1, "nobody", None, 2)
            .unwrap()
            .persons
            .len(),
        0
    );
    assert_eq!(by_prefix(&trees, 2, "u", None, 2).unwrap().persons.len(), 0);
}
