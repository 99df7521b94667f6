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

/// Persons of every kind for the property tests: a key needing escapes, null, lists,
/// numbers as text, a `distinct_id` property, a key nested inside another value, no
/// properties but `os` (which every person has, of two values); plus an index key whose
/// person has another first event (stale) and one whose stored bytes are not a person.
fn varied(n: i64) -> (tempfile::TempDir, Trees) {
    let (dir, trees) = stored(0);
    for i in 0..n {
        let name = format!("v{i}");
        let mut properties = match i % 8 {
            0 => json!({"plan": "pro", "email": "a@Example.com"}),
            1 => json!({"plan": null, "n": "12"}),
            2 => json!({"we\"ird\\key": "x", "n": 11}),
            3 => json!({}),
            4 => json!({"nested": {"plan": "pro"}, "app": "1.4.2"}),
            5 => json!({"plan": ["pro"], "distinct_id": "someone-else"}),
            6 => json!({"plan": "Free", "n": 9.5, "city": "\u{212A}iel"}),
            _ => {
                json!({"email": "b@example.com", "url": format!("https://example.com/{}{i}", "a".repeat(80))})
            }
        };
        let os = if i % 16 == 9 { "Linux" } else { "Mac OS X" };
        properties["os"] = json!(os);
        let p = Person {
            id: crate::persons::id_for(1, &name),
            created_at: 1_000 * i,
            properties: properties.as_object().unwrap().clone(),
            distinct_ids: vec![name.clone()],
            is_identified: false,
            first_distinct_id: name.clone(),
        };
        let key = keys::with_uuid(1, p.id);
        let value = match i % 13 {
            12 => b"{\"not\": \"a person\"}".to_vec(),
            _ => serde_json::to_vec(&p).unwrap(),
        };
        trees.persons.insert(key, value).unwrap();
        let mut index = vec![(keys::first_seen(1, p.created_at, p.id), first_seen::PRESENT)];
        if i % 11 == 10 {
            index.push((
                keys::first_seen(1, p.created_at + 7, p.id),
                first_seen::PRESENT,
            ));
        }
        let index = index
            .into_iter()
            .map(|(k, v)| (sled::IVec::from(&k[..]), sled::IVec::from(v)))
            .collect();
        trees.first_seen.write(index).unwrap();
        // A stale entry by property (as a build racing the compactor left one before
        // it put its entries right): a value the person does not have, of a key it has
        // and keeps (`churn` removes only `plan`), or of a key it lacks, which would
        // hide it from a negative search but that the key's counts tell of.
        if i % 11 == 10 || (i % 11 == 4 && !p.properties.contains_key("plan")) {
            let stale = json!({"email": "zz@example.com", "n": 100, "plan": "pro"});
            let stale: serde_json::Map<_, _> = (stale.as_object().unwrap().iter())
                .filter(|(k, _)| p.properties.contains_key(*k) == (i % 11 == 10))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            write_by_property(&trees, p.id, None, Some((p.created_at, &stale)));
        }
    }
    by_property::start_build(&trees).unwrap();
    let build = by_property::Build::new(&trees);
    while build.step(&trees).unwrap() != Step::Done {}
    (dir, trees)
}

/// Write the index of persons by property's changes from `was` to `now`, and its
/// counts', as the compactor does with a person it changes.
fn write_by_property(
    trees: &Trees,
    id: uuid::Uuid,
    was: Option<by_property::Indexed<'_>>,
    now: Option<by_property::Indexed<'_>>,
) {
    by_property::count::write_changes(trees, [(1, id, was, now)]);
}

/// Project 1's persons newest first after the index key `after`, each read from the
/// table itself and decoded whole; a key naming a person with another first event
/// passed over.
fn plain_persons(trees: &Trees, after: Option<&[u8]>) -> Vec<(sled::IVec, Person)> {
    let from = match after {
        Some(a) => std::ops::Bound::Excluded(a.to_vec()),
        None => std::ops::Bound::Included(keys::project(1).to_vec()),
    };
    let to = std::ops::Bound::Excluded(keys::project(2).to_vec());
    let mut out = Vec::new();
    for entry in trees.first_seen.range((from, to)) {
        let (key, _) = entry.unwrap();
        let (created_at, id) = keys::split_first_seen(&key).unwrap();
        let Some(bytes) = trees.persons.get(keys::with_uuid(1, id)).unwrap() else {
            continue;
        };
        match serde_json::from_slice::<Person>(&bytes) {
            Ok(p) if p.created_at == created_at => out.push((key, p)),
            _ => {}
        }
    }
    out
}

/// The page as the persons were searched before their bytes were read for the property
/// alone: each person decoded whole and tested.
fn plain_newest(trees: &Trees, m: &Matcher, span: Span) -> Page {
    let mut page = Page {
        persons: Vec::new(),
        examined: 0,
        complete: true,
        next: None,
    };
    let (mut skipped, mut last) = (0, None);
    for (key, person) in plain_persons(trees, span.cursor.as_deref()) {
        page.examined += 1;
        last = Some(key);
        let id = person.distinct_ids.first().map_or("", String::as_str);
        if m.matches(id, &person.properties) {
            if skipped < span.offset {
                skipped += 1;
            } else {
                page.persons.push(person);
            }
        }
        if page.persons.len() >= span.limit || page.examined >= span.examine {
            page.complete = false;
            break;
        }
    }
    if !page.complete {
        page.next = last.map(|k| k.to_vec());
        if let Some(after) = &page.next {
            if plain_persons(trees, Some(after)).is_empty() {
                page.complete = true;
                page.next = None;
            }
        }
    }
    page
}

/// Rewrite a share of the persons (other properties, some removed), as the compactor's
/// `$set`s and merges do between two searches.
fn churn(trees: &Trees, n: i64, round: i64) {
    let mut changes = Vec::new();
    for i in (round..n).step_by(5) {
        let name = format!("v{i}");
        let id = crate::persons::id_for(1, &name);
        let key = keys::with_uuid(1, id);
        let Some(bytes) = trees.persons.get(key).unwrap() else {
            continue;
        };
        let Ok(mut p) = serde_json::from_slice::<Person>(&bytes) else {
            continue;
        };
        let was = p.clone();
        let value = match (i + round) % 4 {
            0 => Vec::new(),
            1 => {
                p.properties.insert("plan".into(), json!("pro"));
                serde_json::to_vec(&p).unwrap()
            }
            2 => {
                p.properties.remove("plan");
                p.properties
                    .insert("email".into(), json!(format!("{name}@example.com")));
                serde_json::to_vec(&p).unwrap()
            }
            _ => {
                p.properties.insert("n".into(), json!(round * 5));
                serde_json::to_vec(&p).unwrap()
            }
        };
        let now: Option<Person> = serde_json::from_slice(&value).ok();
        let now = now.as_ref().map(|p| (p.created_at, &p.properties));
        write_by_property(trees, id, Some((was.created_at, &was.properties)), now);
        changes.push((sled::IVec::from(&key[..]), sled::IVec::from(value)));
    }
    trees.persons.write(changes).unwrap();
}

/// Every filter of [`FILTERS`] paged through as the console pages, against the plain
/// search, with the persons as `trees` holds them now.
fn pages_are_the_plain_answer(trees: &Trees, state: &str) {
    for q in FILTERS {
        let m = Matcher::from_params(&Params::parse(Some(q)))
            .unwrap()
            .unwrap();
        for (limit, examine, offset) in [(5, 1_000, 0), (100, 7, 0), (3, 10, 2), (1, 1, 0)] {
            page_through(limit, examine, offset, |s, page_number| {
                let got = newest(trees, 1, Some(&m), s.clone()).unwrap();
                let want = plain_newest(trees, &m, s);
                let ctx =
                    format!("{state}: {q} limit {limit} examine {examine} page {page_number}");
                assert_eq!(got.persons, want.persons, "{ctx}");
                assert_eq!(
                    (got.examined, got.complete, &got.next),
                    (want.examined, want.complete, &want.next),
                    "{ctx}"
                );
                got.next
            });
        }
    }
}

/// Page through from the first page as the console does: `page` answers a page
/// (given its span and number) with the cursor of the next, if any.
fn page_through(
    limit: usize,
    examine: usize,
    offset: usize,
    mut page: impl FnMut(Span, usize) -> Option<Vec<u8>>,
) {
    let mut cursor = None;
    for number in 0.. {
        let s = Span {
            cursor: cursor.take(),
            offset: if number == 0 { offset } else { 0 },
            limit,
            examine,
        };
        match page(s, number) {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
}

/// Every filter the index of persons by property answers, paged through from the
/// index, against the plain search: the same persons page after page, and the index's
/// last page is where the plain search finds no more.
fn index_pages_are_the_plain_answer(trees: &Trees, state: &str) {
    let mut answered = 0;
    for q in FILTERS.iter().chain(&INDEXED_FILTERS) {
        let m = Matcher::from_params(&Params::parse(Some(q)))
            .unwrap()
            .unwrap();
        if !indexed(trees, 1, &m) {
            continue;
        }
        answered += 1;
        for (limit, offset) in [(5, 0), (3, 2), (1, 0), (100, 0)] {
            page_through(limit, usize::MAX, offset, |s, page_number| {
                let got = by_index(trees, 1, &m, s.clone()).unwrap();
                let want = plain_newest(trees, &m, s.clone());
                let ctx = format!("{state}: {q} limit {limit} page {page_number}");
                assert_eq!(got.persons, want.persons, "{ctx}");
                if got.next.is_none() {
                    // Nothing passes past what the last page holds.
                    let rest = Span {
                        offset: s.offset + got.persons.len(),
                        limit: 1,
                        ..s
                    };
                    assert_eq!(plain_newest(trees, &m, rest).persons, [], "{ctx}");
                }
                assert_eq!(got.complete, got.next.is_none(), "{ctx}");
                got.next
            });
        }
    }
    assert_eq!(answered, 28, "{state}");
}

/// More of the operators the index answers, each of a value it must read right: in
/// every case, past an escape, beyond a cut value's kept start, a Kelvin sign that
/// only full case folding makes a `k`.
const INDEXED_FILTERS: [&str; 12] = [
    "property=email&operator=icontains&value=EXAMPLE.COM",
    "property=email&operator=icontains&value=zz",
    "property=plan&operator=regex&value=^(pro|Free)$",
    "property=plan&value=PRO,free",
    "property=n&operator=lt&value=12",
    "property=we%22ird%5Ckey&operator=icontains&value=X",
    "property=url&operator=regex&value=a7$",
    "property=city&value=kiel",
    "property=city&operator=icontains&value=kiel",
    "property=email&operator=not_icontains&value=EXAMPLE.COM",
    "property=city&operator=not_icontains&value=kiel",
    "property=we%22ird%5Ckey&operator=not_icontains&value=X",
];

/// The persons are read through the bytes kept between searches (`person_bytes`):
/// the answers stay the plain ones while persons change in the delta, are folded into
/// the runs, and change again; and so do the index by property's (with its stale
/// entries, cut values, escapes and non-ASCII values).
#[test]
fn a_property_search_is_the_plain_tests_answer() {
    let n = 80;
    let (_dir, trees) = varied(n);
    // Parts of a few dozen entries, so a key's entries span several.
    trees.by_property.set_part_bytes(2048);
    let check = |state: &str| {
        pages_are_the_plain_answer(&trees, state);
        index_pages_are_the_plain_answer(&trees, state);
    };
    let fold = || {
        trees.persons.fold().unwrap();
        trees.by_property.fold().unwrap();
    };
    check("in the delta");
    fold();
    check("folded");
    for round in 1..4 {
        churn(&trees, n, round);
        check(&format!("changed {round}"));
        fold();
        check(&format!("folded {round}"));
    }
}

const FILTERS: [&str; 18] = [
    "property=plan&value=pro",
    "property=plan&operator=is_not&value=pro",
    "property=plan&operator=is_set",
    "property=plan&operator=is_not_set",
    "property=plan&operator=icontains&value=R",
    "property=plan&operator=not_regex&value=^p",
    "property=n&operator=gt&value=10",
    "property=app&operator=semver_gte&value=1.4.0",
    "property=we%22ird%5Ckey&value=x",
    "property=email&operator=icontains&value=example",
    "property=nobody&operator=is_not_set",
    "property=distinct_id&value=v3,someone-else",
    "property=distinct_id&operator=is_not&value=v3",
    // A key every person has: no one lacks it, and no one or a few pass.
    "property=os&operator=is_not_set",
    "property=os&operator=is_not&value=Mac%20OS%20X",
    "property=os&operator=not_icontains&value=X",
    "property=os&operator=not_regex&value=^(Mac|Linux)",
    "property=os&operator=not_icontains&value=mac",
];
