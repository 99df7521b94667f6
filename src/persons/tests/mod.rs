use std::collections::HashMap;
use std::convert::Infallible;

use serde_json::{json, Value};
use uuid::Uuid;

use super::*;

#[derive(Default)]
struct Mem {
    ids: HashMap<String, Uuid>,
    persons: HashMap<Uuid, Person>,
    /// Writes made, as the compactor's store would send them downstream.
    saved: usize,
    deleted: Vec<Uuid>,
}

impl Store for Mem {
    type Error = Infallible;
    fn project(&self) -> u64 {
        1
    }
    fn person_of(&mut self, d: &str) -> Result<Option<Uuid>, Infallible> {
        Ok(self.ids.get(d).copied())
    }
    fn link(&mut self, d: &str, p: Uuid) -> Result<(), Infallible> {
        self.ids.insert(d.to_string(), p);
        Ok(())
    }
    fn load(&mut self, id: Uuid) -> Result<Option<Person>, Infallible> {
        Ok(self.persons.get(&id).cloned())
    }
    fn save(&mut self, p: &Person) -> Result<(), Infallible> {
        self.persons.insert(p.id, p.clone());
        self.saved += 1;
        Ok(())
    }
    fn delete(&mut self, id: Uuid) -> Result<(), Infallible> {
        self.persons.remove(&id);
        self.deleted.push(id);
        Ok(())
    }
}

impl Mem {
    fn send(&mut self, ts: i64, event: Value) -> Option<Uuid> {
        let obj = event.as_object().unwrap().clone();
        let view = EventView::new(
            obj["event"].as_str().unwrap(),
            obj["distinct_id"].as_str().unwrap(),
            ts,
            &obj,
        );
        match apply(self, &view) {
            Ok(p) => p,
            Err(e) => match e {},
        }
    }

    fn of(&self, d: &str) -> &Person {
        &self.persons[&self.ids[d]]
    }
}

#[test]
fn set_set_once_unset() {
    let mut m = Mem::default();
    m.send(1, json!({"event": "e", "distinct_id": "u", "properties": {"$set": {"a": 1, "b": 1}, "$set_once": {"c": 1}}}));
    m.send(2, json!({"event": "e", "distinct_id": "u", "properties": {"$set": {"a": 2}, "$set_once": {"b": 9, "c": 9, "d": 1}}}));
    // Top-level forms, as posthog-python sends for identify.
    m.send(3, json!({"event": "e", "distinct_id": "u", "$set": {"e": true}, "$set_once": {"a": 0}, "properties": {"$unset": ["b"]}}));
    assert_eq!(
        Value::Object(m.of("u").properties.clone()),
        json!({"a": 2, "c": 1, "d": 1, "e": true})
    );
    assert_eq!(m.of("u").created_at, 1);
    assert_eq!(m.persons.len(), 1);
}

#[test]
fn process_person_profile_false_touches_nothing() {
    let mut m = Mem::default();
    let p = m.send(1, json!({"event": "e", "distinct_id": "u", "properties": {"$process_person_profile": false, "$set": {"a": 1}}}));
    assert_eq!(p, None);
    assert!(m.persons.is_empty() && m.ids.is_empty());
}

#[test]
fn identify_links_anonymous_to_identified() {
    let mut m = Mem::default();
    let anon = m.send(1, json!({"event": "$pageview", "distinct_id": "anon-1", "properties": {"$set_once": {"referrer": "x"}}})).unwrap();
    let after = m.send(2, json!({"event": "$identify", "distinct_id": "user@x", "properties": {"$anon_distinct_id": "anon-1", "$set": {"email": "user@x"}}})).unwrap();
    assert_eq!(
        anon, after,
        "the anonymous person is kept and gains the identified id"
    );
    let p = m.of("user@x");
    assert_eq!(p.distinct_ids, ["anon-1", "user@x"]);
    assert!(p.is_identified);
    assert_eq!(p.first_distinct_id, "anon-1");
    assert_eq!(
        Value::Object(p.properties.clone()),
        json!({"referrer": "x", "email": "user@x"})
    );
    // Later anonymous-id events land on the same person.
    assert_eq!(
        m.send(3, json!({"event": "e", "distinct_id": "anon-1"})),
        Some(anon)
    );
}

#[test]
fn identify_with_no_prior_person_creates_one_for_both() {
    let mut m = Mem::default();
    let p = m.send(5, json!({"event": "$identify", "distinct_id": "u", "properties": {"$anon_distinct_id": "a"}})).unwrap();
    assert_eq!(m.ids["a"], p);
    assert_eq!(m.of("u").first_distinct_id, "a");
}

#[test]
fn identify_merges_anonymous_person_into_existing_identified_one() {
    let mut m = Mem::default();
    let known = m.send(1, json!({"event": "e", "distinct_id": "u", "properties": {"$set": {"plan": "pro", "name": "U"}}})).unwrap();
    m.send(2, json!({"event": "e", "distinct_id": "anon-2", "properties": {"$set": {"plan": "free", "browser": "ff"}}}));
    let merged = m.send(3, json!({"event": "$identify", "distinct_id": "u", "properties": {"$anon_distinct_id": "anon-2"}})).unwrap();
    assert_eq!(merged, known);
    assert_eq!(m.persons.len(), 1);
    let p = m.of("anon-2");
    assert_eq!(p.id, known);
    // The surviving person's values win; the merged one fills gaps.
    assert_eq!(
        Value::Object(p.properties.clone()),
        json!({"plan": "pro", "name": "U", "browser": "ff"})
    );
    assert_eq!(p.created_at, 1);
}

#[test]
fn identify_never_merges_two_identified_persons() {
    let mut m = Mem::default();
    m.send(1, json!({"event": "$identify", "distinct_id": "alice", "properties": {"$anon_distinct_id": "a1"}}));
    m.send(2, json!({"event": "$identify", "distinct_id": "bob", "properties": {"$anon_distinct_id": "b1"}}));
    // Someone logs in as bob on alice's device.
    m.send(3, json!({"event": "$identify", "distinct_id": "bob", "properties": {"$anon_distinct_id": "alice"}}));
    assert_ne!(m.ids["alice"], m.ids["bob"]);
    assert_eq!(m.persons.len(), 2);
}

#[test]
fn alias_merges_event_id_into_alias_person() {
    let mut m = Mem::default();
    let target = m
        .send(
            1,
            json!({"event": "e", "distinct_id": "account-9", "properties": {"$set": {"a": 1}}}),
        )
        .unwrap();
    m.send(
        2,
        json!({"event": "e", "distinct_id": "device-3", "properties": {"$set": {"a": 2, "b": 2}}}),
    );
    let p = m.send(3, json!({"event": "$create_alias", "distinct_id": "device-3", "properties": {"alias": "account-9"}})).unwrap();
    assert_eq!(p, target);
    assert_eq!(m.persons.len(), 1);
    assert_eq!(
        Value::Object(m.of("device-3").properties.clone()),
        json!({"a": 1, "b": 2})
    );
    // The merged id keeps sending events to the alias's person.
    assert_eq!(
        m.send(4, json!({"event": "e", "distinct_id": "device-3"})),
        Some(target)
    );
}

#[test]
fn alias_chains_collapse_into_one_person() {
    let mut m = Mem::default();
    m.send(1, json!({"event": "e", "distinct_id": "a"}));
    m.send(
        2,
        json!({"event": "$create_alias", "distinct_id": "a", "properties": {"alias": "b"}}),
    );
    m.send(
        3,
        json!({"event": "$create_alias", "distinct_id": "c", "properties": {"alias": "b"}}),
    );
    m.send(4, json!({"event": "e", "distinct_id": "d"}));
    m.send(
        5,
        json!({"event": "$create_alias", "distinct_id": "d", "properties": {"alias": "c"}}),
    );
    let p = m.of("a").clone();
    for id in ["b", "c", "d"] {
        assert_eq!(m.of(id).id, p.id, "{id}");
    }
    assert_eq!(m.persons.len(), 1);
    let mut ids = p.distinct_ids.clone();
    ids.sort();
    assert_eq!(ids, ["a", "b", "c", "d"]);
    assert_eq!(p.first_distinct_id, "a");
    // Aliasing to oneself is a no-op.
    m.send(
        6,
        json!({"event": "$create_alias", "distinct_id": "a", "properties": {"alias": "a"}}),
    );
    assert_eq!(m.persons.len(), 1);
}

#[test]
fn numeric_and_odd_ids_are_cleaned() {
    let mut m = Mem::default();
    m.send(
        1,
        json!({"event": "$identify", "distinct_id": "u", "properties": {"$anon_distinct_id": 42}}),
    );
    assert_eq!(m.ids["42"], m.ids["u"]);
    // An empty or non-scalar anon id is ignored.
    m.send(
        2,
        json!({"event": "$identify", "distinct_id": "v", "properties": {"$anon_distinct_id": ""}}),
    );
    m.send(3, json!({"event": "$identify", "distinct_id": "w", "properties": {"$anon_distinct_id": {"x": 1}}}));
    assert_eq!(m.persons.len(), 3);
}

/// The ids PostHog gives (Python's `uuid5(PERSON_UUIDV5_NAMESPACE, f"{team_id}:{distinct_id}")`).
const POSTHOG_1_U: &str = "a3f809d2-8688-5e0c-b374-3a81f639ed8d";
const POSTHOG_2_U: &str = "c38ca46b-cb44-59cb-841c-b20bb75df961";

#[test]
fn a_new_person_is_named_as_posthog_names_it() {
    assert_eq!(id_for(1, "u").to_string(), POSTHOG_1_U);
    assert_eq!(id_for(2, "u").to_string(), POSTHOG_2_U);
    let mut m = Mem::default();
    let p = m
        .send(1, json!({"event": "e", "distinct_id": "u"}))
        .unwrap();
    assert_eq!(p.to_string(), POSTHOG_1_U);
}

#[test]
fn identify_of_two_unseen_ids_names_the_person_after_the_identified_id() {
    let mut m = Mem::default();
    let p = m.send(1, json!({"event": "$identify", "distinct_id": "u", "properties": {"$anon_distinct_id": "anon"}})).unwrap();
    assert_eq!(p.to_string(), POSTHOG_1_U);
    assert_eq!(m.ids["anon"], p);
    assert_eq!(m.of("u").first_distinct_id, "anon");
}

#[test]
fn alias_of_two_unseen_ids_names_the_person_after_the_event_id() {
    let mut m = Mem::default();
    let p = m.send(1, json!({"event": "$create_alias", "distinct_id": "u", "properties": {"alias": "account"}})).unwrap();
    assert_eq!(p.to_string(), POSTHOG_1_U);
    assert_eq!(m.ids["account"], p);
}

#[test]
fn a_person_stored_with_a_random_id_keeps_it() {
    let mut m = Mem::default();
    // As flagpost stored persons before ids were derived: a UUIDv7.
    let old = Uuid::parse_str("0190f1a2-3b4c-7d5e-8f60-718293a4b5c6").unwrap();
    m.link("old", old).unwrap();
    m.save(&Person {
        id: old,
        created_at: 1,
        properties: Map::new(),
        distinct_ids: vec!["old".into()],
        is_identified: false,
        first_distinct_id: "old".into(),
    })
    .unwrap();
    let set = json!({"event": "e", "distinct_id": "old", "$set": {"a": 1}});
    assert_eq!(m.send(2, set), Some(old));
    let identify = json!({"event": "$identify", "distinct_id": "u", "properties": {"$anon_distinct_id": "old"}});
    assert_eq!(m.send(3, identify), Some(old));
    assert_eq!(m.ids["u"], old);
    assert_eq!(m.persons.len(), 1);
    assert_eq!(m.of("u").properties["a"], json!(1));
}

/// `$create_alias` between two persons that both exist: the event's person merges into
/// the alias's, whether or not it was identified (an alias is asked for explicitly;
/// only `$identify` refuses to merge an identified person away).
#[test]
fn alias_merges_two_existing_persons_identified_or_not() {
    for identified in [false, true] {
        let mut m = Mem::default();
        let target = m
            .send(1, json!({"event": "e", "distinct_id": "account", "properties": {"$set": {"plan": "pro"}}}))
            .unwrap();
        let merged_away = if identified {
            m.send(2, json!({"event": "$identify", "distinct_id": "login", "properties": {"$anon_distinct_id": "device", "$set": {"plan": "free", "name": "L"}}}))
        } else {
            m.send(2, json!({"event": "e", "distinct_id": "login", "properties": {"$set": {"plan": "free", "name": "L"}}}))
        }
        .unwrap();
        assert_ne!(merged_away, target);
        assert_eq!(m.of("login").is_identified, identified);
        let p = m.send(3, json!({"event": "$create_alias", "distinct_id": "login", "properties": {"alias": "account"}}));
        assert_eq!(p, Some(target), "identified: {identified}");
        assert_eq!(m.persons.len(), 1, "identified: {identified}");
        let person = m.of("account");
        let mut ids = person.distinct_ids.clone();
        ids.sort();
        let expected: &[&str] = if identified {
            &["account", "device", "login"]
        } else {
            &["account", "login"]
        };
        assert_eq!(ids, expected);
        for id in expected {
            assert_eq!(m.ids[*id], target, "{id}");
        }
        assert_eq!(
            Value::Object(person.properties.clone()),
            json!({"plan": "pro", "name": "L"})
        );
        assert_eq!(person.is_identified, identified);
        assert_eq!(person.created_at, 1);
        assert_eq!(person.first_distinct_id, "account");
    }
}

/// The same two persons asked to merge by `$identify` instead: an identified person is
/// never merged away, an anonymous one is.
#[test]
fn identify_merges_two_existing_persons_only_when_the_other_is_anonymous() {
    for identified in [false, true] {
        let mut m = Mem::default();
        m.send(1, json!({"event": "e", "distinct_id": "account"}));
        if identified {
            m.send(2, json!({"event": "$identify", "distinct_id": "login", "properties": {"$anon_distinct_id": "device"}}));
        } else {
            m.send(2, json!({"event": "e", "distinct_id": "login"}));
        }
        m.send(3, json!({"event": "$identify", "distinct_id": "account", "properties": {"$anon_distinct_id": "login"}}));
        let merged = m.ids["login"] == m.ids["account"];
        assert_eq!(merged, !identified, "identified: {identified}");
        assert_eq!(m.persons.len(), if identified { 2 } else { 1 });
    }
}

/// Ids that already share a person, linked again by each kind of event: nothing is
/// written (a person merged into itself would be saved, a change sent downstream,
/// and deleted on the way).
#[test]
fn linking_ids_of_one_person_again_writes_nothing() {
    let mut m = Mem::default();
    let identify = json!({"event": "$identify", "distinct_id": "user", "properties": {"$anon_distinct_id": "anon"}});
    m.send(1, identify.clone());
    let person = m.of("user").clone();
    assert_eq!(m.of("anon").id, person.id);
    let saved = m.saved;
    m.send(2, identify);
    m.send(
        3,
        json!({"event": "$create_alias", "distinct_id": "user", "properties": {"alias": "anon"}}),
    );
    m.send(
        4,
        json!({"event": "$create_alias", "distinct_id": "anon", "properties": {"alias": "user"}}),
    );
    m.send(5, json!({"event": "$merge_dangerously", "distinct_id": "anon", "properties": {"alias": "user"}}));
    assert_eq!(m.saved, saved, "nothing saved");
    assert!(m.deleted.is_empty(), "nothing deleted: {:?}", m.deleted);
    assert_eq!(m.of("user"), &person);
    assert_eq!(m.persons.len(), 1);
}

/// A merge keeps the older person's creation time and first distinct id, whichever of
/// the two survives; at the same instant the surviving person keeps its own.
#[test]
fn a_merge_keeps_the_older_creation_and_first_id() {
    for (merged_away_at, survivor_at, created_at, first) in [
        (1, 5, 1, "login"),
        (5, 1, 1, "account"),
        (3, 3, 3, "account"),
    ] {
        let mut m = Mem::default();
        m.send(survivor_at, json!({"event": "e", "distinct_id": "account"}));
        m.send(
            merged_away_at,
            json!({"event": "e", "distinct_id": "login"}),
        );
        m.send(9, json!({"event": "$create_alias", "distinct_id": "login", "properties": {"alias": "account"}}));
        assert_eq!(m.persons.len(), 1);
        let person = m.of("account");
        let case = (merged_away_at, survivor_at);
        assert_eq!(person.created_at, created_at, "{case:?}");
        assert_eq!(person.first_distinct_id, first, "{case:?}");
    }
}
