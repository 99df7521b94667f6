//! Persons across chunks: the decide cache sees every committed change, and the memo
//! never changes what is stored.

use super::*;
use crate::store::by_property::count;

#[test]
fn the_decide_cache_sees_every_committed_change_to_a_person() {
    let mut f = fixture(Compaction::default());
    let cache = Arc::new(PersonCache::new(crate::store::person_cache::DEFAULT_BYTES));
    f.compactor.person_cache = Some(cache.clone());
    let props = |f: &Fixture, d: &str| {
        cache
            .person(&f.trees, 1, d)
            .unwrap()
            .map(|p| Value::Object(p.properties.clone()))
    };
    let mut i = 0;
    let mut send = |f: &mut Fixture, event: Value| {
        i += 1;
        f.push(&[record(1, i, event)]);
        f.drain();
    };
    // Cached while unknown, then linked.
    assert_eq!(props(&f, "anon"), None);
    send(
        &mut f,
        json!({"event": "e", "distinct_id": "anon", "$set": {"a": 1}}),
    );
    assert_eq!(props(&f, "anon"), Some(json!({"a": 1})));
    // Changed in place.
    send(
        &mut f,
        json!({"event": "e", "distinct_id": "anon", "$set": {"a": 2}}),
    );
    assert_eq!(props(&f, "anon"), Some(json!({"a": 2})));
    // Another person, cached, then merged into by $identify: both ids see the merge.
    send(
        &mut f,
        json!({"event": "e", "distinct_id": "user", "$set": {"b": 1}}),
    );
    assert_eq!(props(&f, "user"), Some(json!({"b": 1})));
    send(
        &mut f,
        json!({"event": "$identify", "distinct_id": "user",
               "properties": {"$anon_distinct_id": "anon"}}),
    );
    let merged = props(&f, "user");
    assert_eq!(merged, props(&f, "anon"));
    assert_eq!(merged, Some(json!({"a": 2, "b": 1})));
    // What the cache serves is what sled holds.
    let stored = query::person_by_distinct_id(&f.trees, 1, "anon")
        .unwrap()
        .unwrap();
    assert_eq!(Some(Value::Object(stored.properties)), merged);
}

#[test]
fn the_decide_cache_sees_every_committed_change_to_a_group() {
    let mut f = fixture(Compaction::default());
    let cache = Arc::new(PersonCache::new(crate::store::person_cache::DEFAULT_BYTES));
    f.compactor.person_cache = Some(cache.clone());
    let props = |f: &Fixture, kind: &str, key: &str| {
        cache
            .group(&f.trees, 1, kind, key)
            .unwrap()
            .map(|p| Value::Object(Map::clone(&p)))
    };
    let mut i = 0;
    let mut send = |f: &mut Fixture, event: Value| {
        i += 1;
        f.push(&[record(1, i, event)]);
        f.drain();
    };
    let identify = |kind: &str, key: &str, set: Value| {
        json!({"event": "$groupidentify", "distinct_id": "u",
               "properties": {"$group_type": kind, "$group_key": key, "$group_set": set}})
    };
    // Both unknown, and cached so; an event naming the type gives it an index but
    // creates no group.
    assert_eq!(props(&f, "org", "o1"), None);
    send(
        &mut f,
        json!({"event": "e", "distinct_id": "u", "properties": {"$groups": {"org": "o1"}}}),
    );
    assert_eq!(props(&f, "org", "o1"), None);
    // Created, then changed.
    send(&mut f, identify("org", "o1", json!({"tier": "gold"})));
    assert_eq!(props(&f, "org", "o1"), Some(json!({"tier": "gold"})));
    send(&mut f, identify("org", "o1", json!({"seats": 5})));
    assert_eq!(
        props(&f, "org", "o1"),
        Some(json!({"tier": "gold", "seats": 5}))
    );
    // A type first named by `$groupidentify`, after a cached miss.
    assert_eq!(props(&f, "company", "c"), None);
    send(&mut f, identify("company", "c", json!({"size": 9})));
    assert_eq!(props(&f, "company", "c"), Some(json!({"size": 9})));
    // What the cache serves is what sled holds.
    let index = query::group_type_index(&f.trees, 1, "org")
        .unwrap()
        .unwrap();
    let stored = query::group(&f.trees, 1, index, "o1").unwrap().unwrap();
    assert_eq!(
        Some(Value::Object(stored.properties)),
        props(&f, "org", "o1")
    );
}

/// One chunk per event, so the memo carries each chunk's persons into the next: an
/// event it answers for must change nothing, and a person changed through another of
/// its distinct ids, by a merge, or by an event that takes the round trip must not be
/// answered for.
#[test]
fn the_memo_across_chunks_never_skips_an_event_that_changes_a_person() {
    let mut f = fixture(Compaction::default());
    let mut i = 0;
    let mut send = |f: &mut Fixture, event: Value, pretty: bool| {
        i += 1;
        let mut r = record(1, i, event.clone());
        if pretty {
            // Not as serde_json writes it: the compactor parses it whole.
            r.data = serde_json::to_vec_pretty(&event).unwrap();
        }
        f.push(&[r]);
        f.drain();
        let by_anon = query::person_by_distinct_id(&f.trees, 1, "anon").unwrap();
        by_anon.map(|p| (p.id, Value::Object(p.properties)))
    };
    let set = |id: &str, props: Value| json!({"event": "e", "distinct_id": id, "$set": props});

    send(&mut f, set("anon", json!({"x": 1})), false);
    let (first, props) = send(&mut f, set("anon", json!({"x": 1})), false).unwrap();
    assert_eq!(props, json!({"x": 1}));
    assert_eq!(f.compactor.memo.person_of(1, "anon"), Some(first));

    // Changed through another distinct id of the same person.
    send(
        &mut f,
        json!({"event": "$identify", "distinct_id": "user",
               "properties": {"$anon_distinct_id": "anon"}}),
        false,
    );
    send(&mut f, set("user", json!({"x": 2})), false);
    let (_, props) = send(&mut f, set("anon", json!({"x": 1})), false).unwrap();
    assert_eq!(props, json!({"x": 1}), "anon's $set after user's");

    // Changed by an event that takes the round trip.
    send(&mut f, set("user", json!({"x": 3})), true);
    let (_, props) = send(&mut f, set("anon", json!({"x": 1})), false).unwrap();
    assert_eq!(props, json!({"x": 1}), "anon's $set after a round trip");

    // The same, both in one chunk: the round trip changes the person the memo knows.
    let mut round_trip = record(1, 100, set("user", json!({"x": 4})));
    round_trip.data = serde_json::to_vec_pretty(&set("user", json!({"x": 4}))).unwrap();
    f.push(&[round_trip, record(1, 101, set("anon", json!({"x": 1})))]);
    f.drain();
    let person = query::person_by_distinct_id(&f.trees, 1, "anon").unwrap();
    assert_eq!(
        person.map(|p| Value::Object(p.properties)),
        Some(json!({"x": 1})),
        "anon's $set after a round trip in the same chunk"
    );

    // Merged into another person: anon's events now belong to the survivor.
    send(&mut f, set("other", json!({"y": 1})), false);
    send(
        &mut f,
        json!({"event": "$create_alias", "distinct_id": "anon",
               "properties": {"alias": "other"}}),
        false,
    );
    let survivor = query::person_by_distinct_id(&f.trees, 1, "other")
        .unwrap()
        .unwrap()
        .id;
    let (now, props) = send(&mut f, set("anon", json!({"x": 1})), false).unwrap();
    assert_eq!(now, survivor);
    assert_eq!(props, json!({"x": 1, "y": 1}));
    let last = f.events(1)[0].clone();
    assert_eq!(
        (last.distinct_id.as_str(), last.person_id),
        ("anon", Some(survivor))
    );
    assert_eq!(f.compactor.memo.person_of(1, "anon"), Some(survivor));
}

/// The memo against no memo: random streams of linking, merging and person-changing
/// events over six distinct ids, some taking the round trip, the historical lane or
/// the overflow lane, some with GeoIP, one chunk per round, through two compactors
/// alike but for the memo (on some seeds a memo of one to four ids, so it is emptied
/// all the time) and for folds of the persons' and distinct ids' deltas into their
/// runs, which the one with the memo does after a third of the rounds, so its later
/// chunks read persons and links from runs, through deltas that remove some of them.
/// Everything stored must be the same.
#[test]
fn the_memo_and_folds_change_nothing_that_is_stored() {
    let ids = ["a", "b", "c", "d", "e", "f"];
    let (mut hits, mut folds) = (0, 0);
    for seed in 1..=200u64 {
        let mut g =
            crate::compactor::apply::tests::Gen(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let settings = Compaction {
            overflow_burst: 3.0,
            overflow_rate: 1.0,
            ..Compaction::default()
        };
        let mut with = fixture(settings.clone());
        let mut without = fixture(settings);
        without.compactor.memo_off = true;
        if seed % 3 == 0 {
            with.compactor.memo = Memo::with_capacity(1 + g.next(4) as usize);
        }
        let mut i = 0i64;
        for _round in 0..12 {
            let mut chunk = Vec::new();
            for _ in 0..1 + g.next(5) {
                i += 1;
                let id = ids[g.next(6) as usize];
                let other = ids[g.next(6) as usize];
                let mut props = serde_json::Map::new();
                let name = match g.next(16) {
                    0 => {
                        props.insert("$anon_distinct_id".into(), json!(other));
                        "$identify"
                    }
                    1 => {
                        props.insert("alias".into(), json!(other));
                        "$create_alias"
                    }
                    2 => {
                        props.insert("alias".into(), json!(other));
                        "$merge_dangerously"
                    }
                    _ => "e",
                };
                let mut event = json!({"event": name, "distinct_id": id});
                let value = json!(g.next(2));
                match g.next(8) {
                    0 => drop(props.insert("$set".into(), json!({"x": value}))),
                    1 => drop(props.insert("$set_once".into(), json!({"y": value}))),
                    2 => drop(props.insert("$unset".into(), json!(["x"]))),
                    3 => event["$set"] = json!({"x": value}),
                    _ => {}
                }
                if g.next(10) == 0 {
                    props.insert("$process_person_profile".into(), json!(false));
                }
                if g.next(8) == 0 {
                    props.insert("$geoip_disable".into(), json!(true));
                }
                event["properties"] = Value::Object(props);
                let mut r = record(1, i, event.clone());
                if g.next(3) == 0 {
                    r.data = serde_json::to_vec_pretty(&event).unwrap();
                }
                r.historical = g.next(6) == 0;
                if g.next(2) == 0 {
                    r.ip = Some("81.2.69.160".parse().unwrap());
                }
                if g.next(4) == 0 {
                    r.timestamp -= 1_000_000;
                }
                chunk.push(r);
            }
            for f in [&mut with, &mut without] {
                f.push(&chunk);
                f.drain();
            }
            if g.next(3) == 0 {
                with.trees.persons.fold().unwrap();
                with.trees.distinct_ids.fold().unwrap();
                folds += 1;
            }
        }
        assert_eq!(with.state(1), without.state(1), "seed {seed}");
        let everyone = |f: &Fixture| {
            let persons = query::persons(&f.trees, 1, 100).unwrap();
            let persons: Vec<_> = persons
                .into_iter()
                .map(|p| (p.id, p.distinct_ids))
                .collect();
            let links: Vec<_> = f.trees.distinct_ids.iter().map(|kv| kv.unwrap()).collect();
            (persons, links)
        };
        assert_eq!(everyone(&with), everyone(&without), "seed {seed}");
        // The first-seen index names every person at its first event, and nothing else:
        // merges move the survivor's key and remove the merged-away one's.
        for f in [&with, &without] {
            let mut indexed: Vec<_> = f
                .trees
                .first_seen
                .iter()
                .map(|kv| keys::split_first_seen(&kv.unwrap().0).unwrap())
                .collect();
            let mut stored: Vec<_> = query::persons(&f.trees, 1, 100)
                .unwrap()
                .into_iter()
                .map(|p| (p.created_at, p.id))
                .collect();
            indexed.sort();
            stored.sort();
            assert_eq!(indexed, stored, "seed {seed}");
        }
        // The index by property holds every stored person's properties, and nothing
        // else: what a build from the persons as they are would write.
        for f in [&with, &without] {
            let held = f.trees.by_property.iter().map(|kv| kv.unwrap());
            let held: Vec<_> = held.filter(|(k, _)| !count::is_count(k)).collect();
            let mut built = Vec::new();
            for p in query::persons(&f.trees, 1, 100).unwrap() {
                let now = Some((p.created_at, &p.properties));
                crate::store::by_property::changes(1, p.id, None, now, |k, v| {
                    built.push((sled::IVec::from(k), sled::IVec::from(v)))
                });
            }
            built.sort();
            assert_eq!(held, built, "seed {seed}");
            // Its counts: the persons, and the holders of each key, as a count of the
            // persons as they are gives them.
            let mut moves = count::Moves::default();
            for p in query::persons(&f.trees, 1, 100).unwrap() {
                moves.person(1, None, Some((p.created_at, &p.properties)));
            }
            let counts = count::held(&f.trees.by_property);
            assert_eq!(counts, moves.totals(), "seed {seed}");
        }
        for id in ids {
            let person = |f: &Fixture| {
                query::person_by_distinct_id(&f.trees, 1, id)
                    .unwrap()
                    .map(|p| {
                        let mut ids = p.distinct_ids;
                        ids.sort();
                        let props = Value::Object(p.properties);
                        (
                            ids,
                            props,
                            p.is_identified,
                            p.created_at,
                            p.first_distinct_id,
                        )
                    })
            };
            assert_eq!(person(&with), person(&without), "seed {seed}, id {id}");
        }
        hits += with.compactor.memo.hits.get();
        assert_eq!(without.compactor.memo.hits.get(), 0);
    }
    assert!(hits > 100, "the memo answered for {hits} events only");
    assert!(folds > 400, "{folds} folds only");
}

/// A database written before person ids were derived holds persons with random (v7)
/// ids. They keep them: events of their distinct ids, a new distinct id linked to one,
/// and a restart change nothing of it; only a person created now gets a derived id.
#[test]
fn persons_stored_with_random_ids_keep_them() {
    let mut f = fixture(Compaction::default());
    let old = Uuid::parse_str("0190f1a2-3b4c-7d5e-8f60-718293a4b5c6").unwrap();
    // What the compactor wrote for a person: the person by id, the link by distinct id.
    let person = crate::persons::Person {
        id: old,
        created_at: NOW - 1000,
        properties: json!({"plan": "free"}).as_object().unwrap().clone(),
        distinct_ids: vec!["old".into()],
        is_identified: false,
        first_distinct_id: "old".into(),
    };
    let trees = &f.trees;
    let person_key = keys::with_uuid(1, old);
    let person_bytes = serde_json::to_vec(&person).unwrap();
    trees.persons.insert(&person_key[..], person_bytes).unwrap();
    let link = keys::with_str(1, "old");
    trees
        .distinct_ids
        .insert(link, &old.as_bytes()[..])
        .unwrap();
    f.restart();

    let set = json!({"event": "e", "distinct_id": "old", "$set": {"plan": "pro"}});
    let identify = json!({"event": "$identify", "distinct_id": "user",
                          "properties": {"$anon_distinct_id": "old"}});
    f.push(&[record(1, 1, set), record(1, 2, identify)]);
    f.drain();
    f.restart();
    f.push(&[
        record(1, 3, json!({"event": "e", "distinct_id": "user"})),
        record(1, 4, json!({"event": "e", "distinct_id": "fresh"})),
    ]);
    f.drain();

    let by = |d: &str| {
        query::person_by_distinct_id(&f.trees, 1, d)
            .unwrap()
            .unwrap()
    };
    assert_eq!(by("old").id, old);
    assert_eq!(by("user").id, old);
    assert_eq!(by("old").properties["plan"], json!("pro"));
    assert_eq!(by("fresh").id, crate::persons::id_for(1, "fresh"));
    let person_of: BTreeMap<String, Option<Uuid>> = f
        .events(1)
        .into_iter()
        .map(|e| {
            (
                format!("{} {}", e.timestamp - NOW, e.distinct_id),
                e.person_id,
            )
        })
        .collect();
    assert_eq!(
        person_of,
        BTreeMap::from([
            ("1 old".to_string(), Some(old)),
            ("2 user".to_string(), Some(old)),
            ("3 user".to_string(), Some(old)),
            (
                "4 fresh".to_string(),
                Some(crate::persons::id_for(1, "fresh"))
            ),
        ])
    );
}

#[test]
fn an_event_without_person_operations_takes_the_person_its_id_is_linked_to() {
    let mut f = fixture(Compaction::default());
    let events = [
        json!({"event": "$pageview", "distinct_id": "anon"}),
        json!({"event": "e", "distinct_id": "user", "$set": {"a": 1}}),
        json!({"event": "$identify", "distinct_id": "user",
               "properties": {"$anon_distinct_id": "anon"}}),
        // Merged away: the id now names the survivor, read without its person.
        json!({"event": "$pageview", "distinct_id": "anon"}),
        // Never seen: a person is made for it.
        json!({"event": "$pageview", "distinct_id": "new"}),
    ];
    for (i, event) in events.into_iter().enumerate() {
        f.push(&[record(1, i as i64 + 1, event)]);
        f.drain();
    }
    let person_of = |i: i64| {
        let uuid = record(1, i, json!({"event": "e", "distinct_id": "x"})).uuid;
        f.events(1)
            .into_iter()
            .find(|e| e.uuid == uuid)
            .unwrap()
            .person_id
    };
    let user = query::person_by_distinct_id(&f.trees, 1, "user")
        .unwrap()
        .unwrap();
    assert_eq!(person_of(4), Some(user.id));
    assert_eq!(Value::Object(user.properties), json!({"a": 1}));
    let mut ids = user.distinct_ids;
    ids.sort();
    assert_eq!(ids, ["anon", "user"]);
    let new = query::person(&f.trees, 1, crate::persons::id_for(1, "new"))
        .unwrap()
        .unwrap();
    assert_eq!(person_of(5), Some(new.id));
    assert_eq!(new.distinct_ids, ["new"]);
}
