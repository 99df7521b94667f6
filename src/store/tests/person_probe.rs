use serde_json::{json, Map, Value};

use super::*;
use crate::persons::Person;

fn person(properties: Value, ids: &[&str]) -> Person {
    Person {
        id: crate::persons::id_for(1, "p"),
        created_at: 1_764_000_000_123,
        properties: properties.as_object().unwrap().clone(),
        distinct_ids: ids.iter().map(|s| s.to_string()).collect(),
        is_identified: false,
        first_distinct_id: "first \"one\"".into(),
    }
}

fn persons() -> Vec<Person> {
    vec![
        person(
            json!({"email": "a@example.com", "plan": "pro"}),
            &["a", "b"],
        ),
        person(json!({}), &[]),
        person(
            json!({"we\"ird\\key": 1, "tab\tkey": [1, {"plan": "nested"}]}),
            &["c"],
        ),
        person(
            json!({"ünï": {"x": null}, "id": "a property named as a field"}),
            &["d"],
        ),
        person(json!({"plan": null, "n": 1.5e300, "big": u64::MAX}), &["e"]),
    ]
}

const KEYS: &[&str] = &[
    "email",
    "plan",
    "we\"ird\\key",
    "tab\tkey",
    "ünï",
    "id",
    "n",
    "big",
    "none",
    "",
];

#[test]
fn a_probe_keeps_what_the_whole_person_says() {
    for p in persons() {
        let bytes = serde_json::to_vec(&p).unwrap();
        for key in KEYS {
            let probe = probe(&bytes, &[*key]).unwrap();
            assert_eq!(probe.created_at, p.created_at);
            assert_eq!(probe.distinct_ids, p.distinct_ids.len());
            assert_eq!(probe.last_id.as_ref(), p.distinct_ids.last());
            assert_eq!(probe.first_distinct_id, p.first_distinct_id);
            assert_eq!(
                probe.properties.get(*key),
                p.properties.get(*key),
                "{key:?} of {p:?}"
            );
            assert!(probe.properties.len() <= 1);
            // The key's text is there whenever the person has the key.
            let has = Needle::new(key).may_be_in(&bytes);
            assert!(has || !p.properties.contains_key(*key), "{key:?} of {p:?}");
        }
        assert!(probe(&bytes, &[]).unwrap().properties.is_empty());
        // Several keys at once, each as the whole person has it.
        let all = probe(&bytes, KEYS).unwrap().properties;
        let want: Map<String, Value> = (p.properties.iter())
            .filter(|(k, _)| KEYS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(all, want);
    }
    // A key nested in another value, or a field's name, is only a "maybe".
    let nested = serde_json::to_vec(&persons()[2]).unwrap();
    assert!(Needle::new("plan").may_be_in(&nested));
    assert!(probe(&nested, &["plan"]).unwrap().properties.is_empty());
    let only = serde_json::to_vec(&persons()[1]).unwrap();
    assert!(!Needle::new("email").may_be_in(&only));
}

/// Whatever the bytes, the probe reads a person exactly when decoding one does.
#[test]
fn a_probe_refuses_what_decoding_a_person_refuses() {
    let mut cases: Vec<Vec<u8>> = Vec::new();
    for p in persons() {
        let bytes = serde_json::to_vec(&p).unwrap();
        // Cut short anywhere, and with trailing text.
        for end in 0..bytes.len() {
            cases.push(bytes[..end].to_vec());
        }
        cases.push([&bytes[..], b" x"].concat());
        cases.push([&bytes[..], b"  "].concat());
    }
    let mut fields = Map::new();
    for (k, v) in serde_json::to_value(persons()[0].clone())
        .unwrap()
        .as_object()
        .unwrap()
    {
        fields.insert(k.clone(), v.clone());
    }
    let with = |change: &dyn Fn(&mut Map<String, Value>)| {
        let mut f = fields.clone();
        change(&mut f);
        serde_json::to_vec(&f).unwrap()
    };
    for field in [
        "id",
        "created_at",
        "properties",
        "distinct_ids",
        "is_identified",
        "first_distinct_id",
    ] {
        cases.push(with(&|f| {
            f.remove(field);
        }));
        for wrong in [
            json!(null),
            json!("text"),
            json!(12),
            json!([1]),
            json!({"a": 1}),
            json!(true),
        ] {
            cases.push(with(&|f| {
                f.insert(field.into(), wrong.clone());
            }));
        }
    }
    cases.push(with(&|f| {
        f.insert("unknown".into(), json!({"nested": [1, 2]}));
    }));
    cases.push(with(&|f| {
        f.insert("distinct_ids".into(), json!(["a", 2]));
    }));
    cases.push(with(&|f| {
        f.insert("created_at".into(), json!(1.5));
    }));
    let text = String::from_utf8(serde_json::to_vec(&persons()[0]).unwrap()).unwrap();
    cases.push(
        text.replacen("\"plan\"", "\"id\":\"x\",\"plan\"", 1)
            .into_bytes(),
    );
    cases.push(text.replacen("{", "{\"created_at\":1,", 1).into_bytes());
    cases.push(b"[]".to_vec());
    let id = crate::persons::id_for(1, "p");
    for seq in [
        json!([id, 5, {"plan": "pro"}, ["a"], true, "a"]),
        json!([id, 5, {"plan": "pro"}, ["a"], true]),
        json!([id, 5, {"plan": "pro"}, ["a"], true, "a", 7]),
        json!([id, 5, [], ["a"], true, "a"]),
    ] {
        cases.push(serde_json::to_vec(&seq).unwrap());
    }
    cases.push(b"\"person\"".to_vec());
    let mut decoded = 0;
    for bytes in &cases {
        let whole = serde_json::from_slice::<Person>(bytes);
        let probed = probe(bytes, &["plan"]);
        assert_eq!(
            probed.is_some(),
            whole.is_ok(),
            "{}: {whole:?}",
            String::from_utf8_lossy(bytes)
        );
        if let (Some(probed), Ok(whole)) = (probed, whole) {
            decoded += 1;
            assert_eq!(probed.created_at, whole.created_at);
            assert_eq!(probed.distinct_ids, whole.distinct_ids.len());
            assert_eq!(probed.properties.get("plan"), whole.properties.get("plan"));
            assert_eq!(probed.last_id.as_ref(), whole.distinct_ids.last());
        }
    }
    assert!(
        decoded >= persons().len() * 2,
        "{decoded} of the cases decode"
    );
}

#[test]
fn a_glance_reads_the_time_and_ids_where_serde_json_puts_them() {
    let mut all = persons();
    let mut tricky = person(
        json!({"x": {"distinct_ids": []}, "distinct_ids": ["y"]}),
        &[],
    );
    tricky.first_distinct_id = ",\"distinct_ids\":[\"z\"]".into();
    tricky.created_at = -42;
    all.push(tricky);
    for p in all {
        let bytes = serde_json::to_vec(&p).unwrap();
        let want = Glance {
            created_at: p.created_at,
            has_ids: !p.distinct_ids.is_empty(),
        };
        assert_eq!(glance(&bytes), Some(want), "{p:?}");
    }
    // Laid out otherwise: not read.
    assert_eq!(glance(br#"{"created_at":1,"id":"x"}"#), None);
    assert_eq!(glance(b"[]"), None);
}
