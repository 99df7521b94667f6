use serde_json::{json, Map, Value};

use super::*;
use crate::http::console::find::tests::stored_events;
use crate::http::matching::events_page;
use crate::persons::Person;
use crate::store::{keys, Trees};

fn parse(properties: &str) -> Result<Option<Filters>, ApiError> {
    let encoded: String = form_urlencoded::byte_serialize(properties.as_bytes()).collect();
    let query = format!("properties={encoded}");
    Filters::from_params(&Params::parse(Some(&query)))
}

fn props(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

/// Whether event properties `event` pass the event filters of `properties`.
fn passes(properties: &str, event: &Value) -> bool {
    let filters = parse(properties).unwrap().unwrap();
    assert!(filters.person.is_empty(), "{properties}");
    let event = props(event.clone());
    filters.event.iter().all(|m| m.matches("ada", &event))
}

/// The detail of the 400 `properties` gets, checked to name `properties`.
fn refusal(properties: &str) -> String {
    match parse(properties) {
        Err(ApiError::BadParam("properties", detail)) => detail,
        Err(e) => panic!("{properties}: {e:?}"),
        Ok(_) => panic!("{properties} was accepted"),
    }
}

#[test]
fn each_operator_is_posthogs_with_the_flags_coercion() {
    let e = json!({"$browser": "Chrome", "n": 12, "text_n": "12", "paid": true,
                   "sent": "2026-01-01T00:00:00Z", "none": null});
    let cases = [
        (r#"[{"key":"$browser","value":"Chrome"}]"#, true),
        (
            r#"[{"key":"$browser","value":"chrome","operator":"exact"}]"#,
            true,
        ),
        (
            r#"[{"key":"$browser","value":["Safari","Chrome"],"operator":"exact"}]"#,
            true,
        ),
        (
            r#"[{"key":"$browser","value":["Safari"],"operator":"exact"}]"#,
            false,
        ),
        (
            r#"[{"key":"$browser","value":[],"operator":"exact"}]"#,
            false,
        ),
        (
            r#"[{"key":"$browser","value":["Safari"],"operator":"is_not"}]"#,
            true,
        ),
        (
            r#"[{"key":"$browser","value":"Chrome","operator":"is_not"}]"#,
            false,
        ),
        (
            r#"[{"key":"$browser","value":"HRO","operator":"icontains"}]"#,
            true,
        ),
        (
            r#"[{"key":"$browser","value":"hro","operator":"not_icontains"}]"#,
            false,
        ),
        (
            r#"[{"key":"$browser","value":"^Chr","operator":"regex"}]"#,
            true,
        ),
        (
            r#"[{"key":"$browser","value":"^chr","operator":"regex"}]"#,
            false,
        ),
        (
            r#"[{"key":"$browser","value":"^Chr","operator":"not_regex"}]"#,
            false,
        ),
        (r#"[{"key":"$browser","operator":"is_set"}]"#, true),
        (r#"[{"key":"none","operator":"is_set"}]"#, true),
        (r#"[{"key":"$os","operator":"is_not_set"}]"#, true),
        (
            r#"[{"key":"$browser","operator":"is_not_set","value":"is_not_set"}]"#,
            false,
        ),
        // Numbers: numeric strings on either side compare as numbers.
        (r#"[{"key":"n","value":10,"operator":"gt"}]"#, true),
        (r#"[{"key":"n","value":"12","operator":"gte"}]"#, true),
        (r#"[{"key":"text_n","value":9,"operator":"gt"}]"#, true),
        (r#"[{"key":"n","value":12,"operator":"lt"}]"#, false),
        (r#"[{"key":"n","value":12,"operator":"lte"}]"#, true),
        (r#"[{"key":"$browser","value":1,"operator":"gt"}]"#, false),
        (r#"[{"key":"n","value":"12"}]"#, true),
        (r#"[{"key":"text_n","value":12}]"#, true),
        // Booleans: true and "true" are the same.
        (r#"[{"key":"paid","value":"true"}]"#, true),
        (r#"[{"key":"paid","value":["false"]}]"#, false),
        (
            r#"[{"key":"sent","value":"2026-06-01","operator":"is_date_before"}]"#,
            true,
        ),
        (
            r#"[{"key":"sent","value":"2026-06-01","operator":"is_date_after"}]"#,
            false,
        ),
        // A missing property: the positive operators fail, the negative ones pass.
        (r#"[{"key":"$os","value":"Mac"}]"#, false),
        (r#"[{"key":"$os","value":"Mac","operator":"is_not"}]"#, true),
        (
            r#"[{"key":"$os","value":"x","operator":"not_icontains"}]"#,
            true,
        ),
        (
            r#"[{"key":"$os","value":"x","operator":"not_regex"}]"#,
            true,
        ),
        (r#"[{"key":"$os","value":1,"operator":"lt"}]"#, false),
    ];
    for (properties, want) in cases {
        assert_eq!(passes(properties, &e), want, "{properties}");
    }
}

#[test]
fn every_shape_posthog_takes_and_all_must_pass() {
    let chrome_12 = json!({"$browser": "Chrome", "n": 12});
    let chrome_3 = json!({"$browser": "Chrome", "n": 3});
    let shapes = [
        r#"[{"key":"$browser","value":"Chrome","type":"event"},{"key":"n","value":10,"operator":"gt"}]"#,
        r#"{"type":"AND","values":[{"key":"$browser","value":"Chrome"},{"key":"n","value":10,"operator":"gt"}]}"#,
        r#"{"type":"and","values":[{"type":"AND","values":[{"key":"$browser","value":"Chrome"}]},
             {"type":"OR","values":[{"key":"n","value":10,"operator":"gt"}]}]}"#,
        r#"{"$browser":"Chrome","n__gt":10}"#,
    ];
    for shape in shapes {
        assert!(passes(shape, &chrome_12), "{shape}");
        assert!(!passes(shape, &chrome_3), "{shape}");
    }
    for none in ["", "[]", "null", "{}", r#"{"type":"AND","values":[]}"#] {
        assert!(parse(none).unwrap().is_none(), "{none:?}");
    }
    let person = parse(r#"[{"key":"plan","value":"pro","type":"person"},{"key":"n","value":1}]"#);
    let person = person.unwrap().unwrap();
    assert_eq!((person.event.len(), person.person.len()), (1, 1));
}

#[test]
fn what_cannot_be_answered_is_a_400_naming_properties() {
    assert_eq!(refusal("invalid_json"), "Properties are unparsable!");
    assert_eq!(refusal(r#"[{"key":"a""#), "Properties are unparsable!");
    let cases = [
        ("3", "must be a list of filters"),
        (
            r#"[{"key":"a","value":"x","operator":"ends_wth"}]"#,
            "properties[0]: ",
        ),
        (
            r#"[{"key":"a","value":"x","operator":"ends_wth"}]"#,
            r#"unknown operator "ends_wth""#,
        ),
        (
            r#"[{"key":"a","value":"(","operator":"regex"}]"#,
            "regex parse error",
        ),
        (
            r#"[{"key":"a","value":1},{"key":"b"}]"#,
            r#"properties[1]: value is required for operator "exact""#,
        ),
        (
            r#"[{"key":"id","value":2,"type":"cohort"}]"#,
            r#"filters of type "cohort" are not supported"#,
        ),
        (
            r#"[{"key":"a","value":1,"type":"group","group_type_index":0}]"#,
            "not supported",
        ),
        (r#"["a"]"#, "a filter must be an object"),
        (r#"[{"value":"x"}]"#, "key must be a property name"),
        (
            r#"[{"key":"a","value":"x","operator":3}]"#,
            "operator must be a string",
        ),
        (
            r#"{"type":"OR","values":[{"key":"a","value":1},{"key":"b","value":2}]}"#,
            "OR group",
        ),
        (
            r#"{"type":"XOR","values":[]}"#,
            "PropertyGroup is unparsable",
        ),
        (
            r#"{"type":"AND","values":3}"#,
            "PropertyGroup is unparsable",
        ),
    ];
    for (properties, says) in cases {
        let detail = refusal(properties);
        assert!(detail.contains(says), "{properties}: {detail}");
    }
}

#[test]
fn the_refusal_is_posthogs_error_shape() {
    let e = parse("invalid_json").err().unwrap();
    let response = e.into_response();
    assert_eq!(response.status(), 400);
    let body = body_json(response);
    assert_eq!(
        body,
        json!({"type": "validation_error", "code": "invalid_input",
               "detail": "Properties are unparsable!", "attr": "properties"})
    );
}

fn body_json(response: hyper::Response<crate::http::response::Body>) -> Value {
    use http_body_util::BodyExt;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let bytes = runtime
        .block_on(response.into_body().collect())
        .unwrap()
        .to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

/// Persons of the fixture's distinct ids u0..u4: u2 has none, u4 one without a plan.
fn store_persons(trees: &Trees) {
    let plans = [Some("pro"), Some("free"), None, Some("Pro"), None];
    for (i, plan) in plans.into_iter().enumerate() {
        let name = format!("u{i}");
        if i == 2 {
            continue;
        }
        let mut properties = Map::new();
        if let Some(plan) = plan {
            properties.insert("plan".into(), Value::from(plan));
        }
        properties.insert("age".into(), Value::from(30 + i));
        let p = Person {
            id: crate::persons::id_for(1, &name),
            created_at: 0,
            properties,
            distinct_ids: vec![name.clone()],
            is_identified: false,
            first_distinct_id: name.clone(),
        };
        let person = serde_json::to_vec(&p).unwrap();
        trees
            .persons
            .insert(keys::with_uuid(1, p.id), person)
            .unwrap();
        let id = p.id.as_bytes().to_vec();
        trees
            .distinct_ids
            .insert(keys::with_str(1, &name), id)
            .unwrap();
    }
}

/// Every event passing `properties`, newest first, each made whole and its person
/// read: the answer the pages must add up to.
fn plain(trees: &Trees, properties: &str) -> Vec<Value> {
    let f = parse(properties).unwrap().unwrap();
    query::events(trees, 1, query::EventFilter::default(), None)
        .map(Result::unwrap)
        .filter(|(_, e)| {
            f.event
                .iter()
                .all(|m| m.matches(&e.distinct_id, &e.properties))
        })
        .filter(|(_, e)| {
            let p = query::person_by_distinct_id(trees, 1, &e.distinct_id).unwrap();
            let props = p.map(|p| p.properties).unwrap_or_default();
            f.person.iter().all(|m| m.matches(&e.distinct_id, &props))
        })
        .map(|(_, e)| e.to_api())
        .collect()
}

#[test]
fn pages_of_several_filters_add_up_to_the_events_passing_them_all() {
    let (dir, trees) = stored_events();
    store_persons(&trees);
    let db = sled::open(dir.path().join("unused")).unwrap();
    let open = Arc::new(Open { db, trees });
    let cases = [
        r#"[{"key":"plan","value":"pro"},{"key":"n","value":100,"operator":"lt"}]"#,
        r#"[{"key":"$browser","operator":"is_set"},{"key":"n","value":"^1","operator":"not_regex"}]"#,
        r#"[{"key":"plan","value":"pro","type":"person"}]"#,
        r#"[{"key":"plan","operator":"is_not_set","type":"person"},{"key":"n","operator":"is_set"}]"#,
        r#"{"type":"AND","values":[{"key":"plan","operator":"is_not","value":["pro"]},
             {"key":"age","value":31,"operator":"gte","type":"person"}]}"#,
    ];
    for properties in cases {
        let want = plain(&open.trees, properties);
        assert!(!want.is_empty(), "{properties}");
        for (limit, budget) in [(1_000, 1), (3, 2), (5, 10_000)] {
            let mut got = Vec::new();
            let mut cursor: Option<[u8; 32]> = None;
            loop {
                let test = parse(properties).unwrap().unwrap().test(open.clone(), 1);
                let cursor_bytes = cursor.as_ref().map(|c| &c[..]);
                let walk = query::events(&open.trees, 1, Default::default(), cursor_bytes);
                let page = events_page(walk.tested(test, budget), 1, limit).unwrap();
                assert!(page.events.len() <= limit);
                got.extend(page.events);
                match page.next {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
            assert_eq!(got, want, "{properties} limit {limit} budget {budget}");
        }
    }
}

/// An event filter needing its key reads only the blocks holding it, whatever else
/// is asked; one that does not (a negative test, a person's) reads every block.
#[test]
fn the_first_key_an_event_filter_needs_narrows_the_read() {
    let (dir, trees) = stored_events();
    let db = sled::open(dir.path().join("unused")).unwrap();
    let open = Arc::new(Open { db, trees });
    let key = |properties: &str| {
        parse(properties)
            .unwrap()
            .unwrap()
            .test(open.clone(), 1)
            .key()
    };
    assert_eq!(
        key(r#"[{"key":"plan","operator":"is_not_set"},{"key":"n","value":3,"operator":"gt"}]"#),
        Some("n".to_owned())
    );
    assert_eq!(key(r#"[{"key":"plan","value":"x","type":"person"}]"#), None);
    assert_eq!(
        key(r#"[{"key":"plan","value":"x","operator":"is_not"}]"#),
        None
    );
}
