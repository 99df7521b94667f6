use std::sync::Arc;

use super::*;
use crate::store::block::Rows;

fn props(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

fn matcher(q: &str) -> Result<Option<Matcher>, ApiError> {
    Matcher::from_params(&Params::parse(Some(q)))
}

/// The console's `property=&operator=&value=` compares as PostHog's UI does
/// ([`hogql`]): `exact` case-sensitively, a `null` as no value.
#[test]
fn the_consoles_property_tests_are_posthogs_uis() {
    let ada = props(json!({"email": "ada@Example.com", "age": 36, "app": "1.4.2", "plan": null}));
    let cases = [
        ("property=email&value=ada@Example.com", true),
        ("property=email&value=ada@example.com", false),
        ("property=email&value=bob@example.com,ada@Example.com", true),
        ("property=email&operator=is_not&value=ada@example.com", true),
        (
            "property=email&operator=is_not&value=ada@Example.com",
            false,
        ),
        ("property=email&operator=icontains&value=EXAMPLE", true),
        ("property=email&operator=icontains&value=ada%25com", true),
        ("property=email&operator=regex&value=^ada@", true),
        ("property=email&operator=regex&value=example", false),
        ("property=age&operator=gt&value=40", false),
        ("property=age&operator=lte&value=36", true),
        ("property=age&value=36", true),
        ("property=app&operator=semver_gte&value=1.4.0", true),
        ("property=plan&operator=is_not_set", true),
        ("property=plan&operator=is_set", false),
        ("property=distinct_id&value=ada", true),
    ];
    for (q, want) in cases {
        let m = matcher(q).unwrap().unwrap();
        assert_eq!(m.matches("ada", &ada), want, "{q}");
    }
    assert!(matcher("value=x").unwrap().is_none());
}

/// A flag's reach ([`Matcher::new`]) keeps the flags' comparison: `exact` ignores
/// case, a `null` is a value `is_set` finds.
#[test]
fn a_flags_filter_keeps_the_flags_comparison() {
    let ada = props(json!({"email": "ada@Example.com", "plan": null}));
    let cases = [
        (json!({"key": "email", "value": "ADA@example.com"}), true),
        (
            json!({"key": "email", "value": ["ada@example.com"], "operator": "is_not"}),
            false,
        ),
        (
            json!({"key": "plan", "value": "is_set", "operator": "is_set"}),
            true,
        ),
    ];
    for (mut filter, want) in cases {
        filter["type"] = json!("person");
        let flags = Matcher::new(filter.clone(), None).unwrap();
        assert_eq!(flags.matches("ada", &ada), want, "{filter}");
        let posthog = Matcher::posthog(filter.clone()).unwrap();
        assert_eq!(posthog.matches("ada", &ada), !want, "{filter}");
    }
}

/// PostHog's rule for a missing property (flags-reference.md): the positive operators
/// are false, `is_not`, `not_icontains`, `not_regex` and `is_not_set` true; and
/// `distinct_id` is filled with the distinct id, so no test of it needs the key.
#[test]
fn only_the_positive_operators_need_the_key() {
    let cases = [
        ("property=plan&value=pro", true),
        ("property=plan&operator=is_not&value=pro", false),
        ("property=plan&operator=icontains&value=p", true),
        ("property=plan&operator=not_icontains&value=p", false),
        ("property=plan&operator=regex&value=p", true),
        ("property=plan&operator=not_regex&value=p", false),
        ("property=plan&operator=gt&value=1", true),
        ("property=plan&operator=is_set", true),
        ("property=plan&operator=is_not_set", false),
        (
            "property=plan&operator=is_date_before&value=2026-01-01",
            true,
        ),
        ("property=plan&operator=semver_gte&value=1.0.0", true),
        ("property=distinct_id&value=ada", false),
        ("property=distinct_id&operator=is_set", false),
    ];
    for (q, needs) in cases {
        let m = matcher(q).unwrap().unwrap();
        assert_eq!(m.needs_key(), needs, "{q}");
        // Without the key, the one answer for all properties is the whole test's.
        let other = props(json!({"other": 1}));
        assert_eq!(
            m.matches_value("ada", None),
            m.matches("ada", &other),
            "{q}"
        );
    }
}

#[test]
fn a_filter_the_flags_refuse_is_refused() {
    for q in [
        "property=email&operator=ends_wth&value=x",
        "property=email&operator=regex&value=(",
    ] {
        match matcher(q) {
            Err(ApiError::BadQuery(m)) => assert!(m.contains("not valid"), "{q}: {m}"),
            Err(e) => panic!("{q}: {e:?}"),
            Ok(_) => panic!("{q} was accepted"),
        }
    }
}

/// Events stored in blocks as the compactor stores them: chunks in overlapping time
/// ranges, properties of every kind (a key needing escapes, null, a list, numbers as
/// text, a `distinct_id` property, properties kept whole), and chunks whose blocks
/// hold no `plan` at all.
pub(crate) fn stored_events() -> (tempfile::TempDir, crate::store::Trees) {
    use crate::store::block::Entry;
    use crate::store::StoredEvent;
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let trees = crate::store::Trees::open(&db, dir.path()).unwrap();
    let mut next = 0;
    for chunk in 0..12u32 {
        let mut entries = Vec::new();
        for j in 0..40u32 {
            let i = chunk * 40 + j;
            let properties = match (chunk % 4, i % 9) {
                (3, _) => json!({"$browser": "Safari", "n": i}),
                (_, 0) => json!({"plan": "pro", "$browser": "Chrome", "n": i}),
                (_, 1) => json!({"plan": "Free", "email": "a@Example.com"}),
                (_, 2) => json!({"we\"ird\\key": "x", "n": i}),
                (_, 3) => json!({}),
                (_, 4) => json!({"plan": null}),
                (_, 5) => json!({"app": "1.4.2", "n": "12"}),
                (_, 6) => json!({"date": "2026-01-01T00:00:00Z", "plan": ["pro"]}),
                (_, 7) => json!({"distinct_id": "someone-else", "n": 10.5}),
                _ => json!({"plan": "pro"}),
            };
            let event = StoredEvent {
                uuid: uuid::Uuid::from_u128(u128::from(i) * 7_919 + 1),
                event: "$pageview".into(),
                distinct_id: format!("u{}", i % 5),
                properties: props(properties),
                // Chunks overlap in time, and some events share a time.
                timestamp: 1_000_000 + i64::from(chunk % 6) * 30_000 + i64::from(j) * 1_000,
                created_at: 0,
                person_id: None,
            };
            let mut entry = Entry::from_stored(&event);
            if i % 9 == 8 && chunk % 4 != 3 {
                // Written with a space: the block keeps these properties whole.
                entry.properties = br#"{"plan": "pro"}"#.to_vec();
            }
            entries.push(entry);
        }
        // Stored and indexed as the compactor does: reads by a property go through
        // the index.
        for built in crate::store::block::build_indexed(entries) {
            let key = crate::store::keys::block(1, built.newest, next);
            trees.events.insert(key, built.value).unwrap();
            let block = crate::store::event_index::BlockRef {
                id: next,
                project: 1,
                newest: built.newest,
                oldest: built.oldest,
            };
            trees
                .event_index
                .add(&[crate::store::event_index::NewBlock {
                    block,
                    distinct_ids: built.distinct_ids,
                    events: built.events,
                    properties: built.properties,
                }]);
            next += 1;
        }
    }
    (dir, trees)
}

/// The filters the equivalence tests run: every operator class, the negative ones,
/// a key needing escapes, a key no event has, and `distinct_id`.
const FILTERS: &[&str] = &[
    "property=plan&value=pro",
    "property=plan&operator=is_not&value=pro",
    "property=plan&operator=is_set",
    "property=plan&operator=is_not_set",
    "property=plan&operator=icontains&value=R",
    "property=plan&operator=not_icontains&value=r",
    "property=plan&operator=regex&value=^p",
    "property=plan&operator=not_regex&value=^p",
    "property=n&operator=gt&value=10",
    "property=n&operator=lte&value=12",
    "property=app&operator=semver_gte&value=1.4.0",
    "property=date&operator=is_date_before&value=2026-06-01",
    "property=we%22ird%5Ckey&value=x",
    "property=$browser&value=safari",
    "property=$browser&value=Safari",
    "property=plan&value=Free,pro",
    "property=plan&operator=icontains&value=_R%25",
    "property=n&value=12",
    "property=nobody&operator=is_set",
    "property=nobody&operator=is_not_set",
    "property=nobody&operator=is_not&value=x",
    "property=distinct_id&value=u1,someone-else",
    "property=distinct_id&operator=is_not&value=u1",
];

/// Every event passing the filter, newest first, as the plain test finds them: each
/// event made whole and matched.
fn plain_events(trees: &crate::store::Trees, q: &str) -> Vec<(Value, [u8; 32])> {
    let m = matcher(q).unwrap().unwrap();
    query::events(trees, 1, query::EventFilter::default(), None)
        .map(Result::unwrap)
        .filter(|(_, e)| m.matches(&e.distinct_id, &e.properties))
        .map(|(key, e)| (e.to_api(), key))
        .collect()
}

fn column_page(
    trees: &crate::store::Trees,
    q: &str,
    cursor: Option<&[u8]>,
    (limit, budget): (usize, usize),
) -> EventsPage {
    let m = matcher(q).unwrap().unwrap();
    let walk = query::events(trees, 1, query::EventFilter::default(), cursor);
    events_page(walk.tested(Box::new(ColumnTest::new(m)), budget), 1, limit).unwrap()
}

#[test]
fn events_by_a_property_are_the_plain_tests_answer_page_by_page() {
    let (_dir, trees) = stored_events();
    for q in FILTERS {
        let want = plain_events(&trees, q);
        let values: Vec<&Value> = want.iter().map(|(v, _)| v).collect();
        for (budget, limit) in [(1, 1_000), (3, 4), (10_000, 1), (10_000, 4)] {
            let mut got = Vec::new();
            let mut cursor: Option<[u8; 32]> = None;
            loop {
                let page = column_page(&trees, q, cursor.as_ref().map(|c| &c[..]), (limit, budget));
                if page.events.len() == limit {
                    // A full page goes on after its last event, as before.
                    let last = want.iter().find(|(v, _)| *v == page.events[limit - 1]);
                    assert_eq!(page.next, last.map(|(_, k)| *k), "{q}");
                }
                got.extend(page.events);
                match page.next {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
            assert_eq!(
                got.iter().collect::<Vec<_>>(),
                values,
                "{q} budget {budget} limit {limit}"
            );
        }
        // Within the bound, one page holds them all.
        let whole = column_page(&trees, q, None, (100_000, 10_000));
        assert_eq!((whole.events.len(), whole.next), (want.len(), None), "{q}");
    }
}

#[test]
fn blocks_without_the_property_are_not_decoded() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (_dir, trees) = stored_events();
    /// Counts the blocks decoded.
    struct Counting(ColumnTest, Arc<AtomicUsize>);
    impl BlockTest for Counting {
        fn key(&self) -> Option<String> {
            self.0.key()
        }
        fn keep(&mut self, rows: &Rows, left: &mut Vec<u32>) -> Result<(), sled::Error> {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.keep(rows, left)
        }
    }
    let (mut blocks, mut with_plan, mut events_with_plan) = (0, 0, 0);
    for entry in trees.events.iter() {
        let (_, value) = entry.unwrap();
        let rows = Rows::decode(&value).unwrap();
        blocks += 1;
        let holds = rows.column("plan").unwrap().may_hold();
        with_plan += usize::from(holds);
        events_with_plan += usize::from(holds) * rows.heads().len();
    }
    assert!(
        0 < with_plan && with_plan < blocks,
        "{with_plan} of {blocks}"
    );
    for (q, decoded, examined) in [
        ("property=plan&operator=is_set", with_plan, events_with_plan),
        ("property=plan&operator=is_not_set", blocks, 12 * 40),
    ] {
        let count = Arc::new(AtomicUsize::new(0));
        let m = matcher(q).unwrap().unwrap();
        let test = Box::new(Counting(ColumnTest::new(m), count.clone()));
        let walk = query::events(&trees, 1, query::EventFilter::default(), None);
        let mut walk = walk.tested(test, usize::MAX);
        assert_eq!(walk.by_ref().count(), plain_events(&trees, q).len(), "{q}");
        assert_eq!(count.load(Ordering::Relaxed), decoded, "{q}");
        // The events of the blocks read were examined, and only those.
        assert_eq!(walk.examined(), examined, "{q}");
    }
}
