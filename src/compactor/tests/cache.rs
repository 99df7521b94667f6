use std::collections::BTreeMap;

use serde_json::json;

use serde_json::Value;

use super::*;

type Writes = BTreeMap<Vec<u8>, Vec<u8>>;

/// The writes `put` receives, the later of two to one key winning as in the table.
fn collect(write: impl FnOnce(&mut dyn FnMut(Vec<u8>, &[u8]))) -> Writes {
    let mut writes = Writes::new();
    write(&mut |k, v| {
        writes.insert(k, v.to_vec());
    });
    writes
}

fn person(created_at: i64, properties: Value) -> Person {
    Person {
        id: Uuid::from_u128(7),
        created_at,
        properties: properties.as_object().cloned().unwrap_or_default(),
        distinct_ids: vec!["ada".into()],
        is_identified: true,
        first_distinct_id: "ada".into(),
    }
}

/// The index's writes from the stored `was` (as its bytes) to `now`, and those of the
/// diff of both persons as they are in memory (`by_property::changes`), which they
/// must equal.
fn both(was: Option<&Person>, now: Option<&Person>) -> (Writes, Writes) {
    let born = was.map(|p| serde_json::to_vec(p).unwrap());
    let id = Uuid::from_u128(7);
    let got = collect(|put| by_property_writes(1, id, born.as_deref(), now, put));
    let indexed = |p: &Person| (p.created_at, p.properties.clone());
    let (was, now) = (was.map(indexed), now.map(indexed));
    let want = collect(|put| {
        let was = was.as_ref().map(|p| (p.0, &p.1));
        by_property::changes(1, id, was, now.as_ref().map(|p| (p.0, &p.1)), put)
    });
    (got, want)
}

#[test]
fn the_stored_person_read_back_gives_the_writes_of_the_person_itself() {
    let base = json!({"email": "ada@example.com", "plan": "pro", "n": 1.5, "tags": ["a", "b"],
                      "weird": "x\ny\"", "nested": {"k": [1, null]}, "none": null});
    let mut changed = base.clone();
    changed["plan"] = json!("free");
    changed["n"] = json!(2);
    changed["new"] = json!("é");
    changed.as_object_mut().unwrap().remove("tags");
    let mut escaped = base.clone();
    escaped["weird"] = json!("x\ty");
    let mut moved = changed.clone();
    moved.as_object_mut().unwrap().shift_remove("email");
    moved["email"] = json!("ada@example.org");
    // A key with an escape: the stored person is parsed whole.
    let mut key = base.clone();
    key["a \"key\""] = json!(1);
    let cases = [
        (None, Some(person(10, base.clone()))),
        (
            Some(person(10, base.clone())),
            Some(person(10, base.clone())),
        ),
        (
            Some(person(10, base.clone())),
            Some(person(10, changed.clone())),
        ),
        (
            Some(person(10, changed.clone())),
            Some(person(10, base.clone())),
        ),
        (Some(person(10, base.clone())), Some(person(10, escaped))),
        (
            Some(person(10, base.clone())),
            Some(person(5, changed.clone())),
        ),
        (
            Some(person(10, base.clone())),
            Some(person(5, base.clone())),
        ),
        (Some(person(10, base.clone())), None),
        (Some(person(10, json!({}))), Some(person(10, base.clone()))),
        (Some(person(10, base.clone())), Some(person(10, moved))),
        (
            Some(person(10, key.clone())),
            Some(person(10, changed.clone())),
        ),
        (Some(person(10, base.clone())), Some(person(10, key))),
    ];
    for (was, now) in &cases {
        let (got, want) = both(was.as_ref(), now.as_ref());
        assert_eq!(got, want, "{was:?} -> {now:?}");
    }
}

/// A change of one property of many writes its two entries only: the old value's
/// tombstone and the new one.
#[test]
fn one_property_changed_writes_two_entries() {
    let mut properties = json!({"plan": "pro"});
    for i in 0..40 {
        properties[format!("p{i}")] = json!(format!("value {i}"));
    }
    let was = person(10, properties.clone());
    properties["plan"] = json!("free");
    let (got, want) = both(Some(&was), Some(&person(10, properties)));
    assert_eq!(got, want);
    assert_eq!(got.len(), 2);
    assert_eq!(got.values().filter(|v| v[..] == *TOMBSTONE).count(), 1);
}
