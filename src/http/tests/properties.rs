use serde_json::{json, Map, Value};

use super::*;
use crate::http::matching::events_page;
use crate::http::matching::tests::stored_events;
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

/// Whether an event of `distinct_id` with properties `event`, of a person with
/// properties `person`, passes `filters`: each filter matched on the whole properties.
fn holds(
    filters: &Filters,
    distinct_id: &str,
    event: &Map<String, Value>,
    person: &Map<String, Value>,
) -> bool {
    let holds = |f: &Filters| holds(f, distinct_id, event, person);
    match filters {
        Filters::Event(m) => m.matches(distinct_id, event),
        Filters::Person(m) => m.matches(distinct_id, person),
        Filters::All(all) => all.iter().all(holds),
        Filters::Any(any) => any.iter().any(holds),
    }
}

/// Whether event properties `event` (of a person without any) pass `properties`.
fn passes(properties: &str, event: &Value) -> bool {
    let filters = parse(properties).unwrap().unwrap();
    holds(&filters, "ada", &props(event.clone()), &Map::new())
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
fn each_operator_is_posthogs_events_apis() {
    let e = json!({"$browser": "Chrome", "n": 12, "text_n": "12", "paid": true,
                   "sent": "2026-01-01T00:00:00Z", "none": null});
    let cases = [
        (r#"[{"key":"$browser","value":"Chrome"}]"#, true),
        // Case-sensitive, as HogQL's `=`: not the flags' comparison.
        (
            r#"[{"key":"$browser","value":"chrome","operator":"exact"}]"#,
            false,
        ),
        (
            r#"[{"key":"$browser","value":"chrome","operator":"is_not"}]"#,
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
        // An empty list filters nothing, as PostHog's `Constant(1)`.
        (
            r#"[{"key":"$browser","value":[],"operator":"exact"}]"#,
            true,
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
        // A JSON null is no value.
        (r#"[{"key":"none","operator":"is_set"}]"#, false),
        (r#"[{"key":"none","operator":"is_not_set"}]"#, true),
        (r#"[{"key":"none","value":"x","operator":"is_not"}]"#, true),
        (r#"[{"key":"$os","operator":"is_not_set"}]"#, true),
        (
            r#"[{"key":"$browser","operator":"is_not_set","value":"is_not_set"}]"#,
            false,
        ),
        // Numbers as PostHog's Numeric properties: text that reads as a number too.
        (r#"[{"key":"n","value":10,"operator":"gt"}]"#, true),
        (r#"[{"key":"n","value":"12","operator":"gte"}]"#, true),
        (r#"[{"key":"text_n","value":9,"operator":"gt"}]"#, true),
        (r#"[{"key":"n","value":12,"operator":"lt"}]"#, false),
        (r#"[{"key":"n","value":12,"operator":"lte"}]"#, true),
        (r#"[{"key":"$browser","value":1,"operator":"gt"}]"#, false),
        (r#"[{"key":"n","value":"12"}]"#, true),
        (r#"[{"key":"text_n","value":12}]"#, true),
        // Booleans as its Boolean properties: true and "true" are the same.
        (r#"[{"key":"paid","value":"true"}]"#, true),
        (r#"[{"key":"paid","value":"TRUE"}]"#, false),
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
        (
            r#"[{"key":"$browser","value":["x","ROM"],"operator":"icontains_multi"}]"#,
            true,
        ),
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
    let Some(Filters::All(both)) = person.unwrap() else {
        panic!("not a list of filters")
    };
    assert!(matches!(both[..], [Filters::Person(_), Filters::Event(_)]));
}

/// `OR` groups, nested in `AND` ones and the other way round, as PostHog's
/// `PropertyGroup`s: an empty group passes every event, one of one filter is it.
#[test]
fn or_and_groups_nest() {
    let events = [
        json!({"$browser": "Chrome", "n": 12}),
        json!({"$browser": "Safari", "n": 12}),
        json!({"$browser": "Firefox", "n": 3}),
        json!({"n": 30}),
        json!({}),
    ];
    let cases = [
        (
            r#"{"type":"OR","values":[{"key":"$browser","value":"Chrome"},{"key":"n","value":20,"operator":"gt"}]}"#,
            [true, false, false, true, false],
        ),
        (
            r#"{"type":"AND","values":[{"type":"OR","values":[{"key":"$browser","value":"Chrome"},
                {"key":"$browser","value":"Safari"}]},{"key":"n","value":12}]}"#,
            [true, true, false, false, false],
        ),
        (
            r#"{"type":"OR","values":[{"type":"AND","values":[{"key":"$browser","value":"Firefox"},
                {"key":"n","value":5,"operator":"lt"}]},{"key":"$browser","operator":"is_not_set"}]}"#,
            [false, false, true, true, true],
        ),
        (
            r#"[{"type":"OR","values":[{"key":"n","value":3},{"key":"n","value":30}]},
                {"key":"$browser","value":"Firefox","operator":"is_not"}]"#,
            [false, false, false, true, false],
        ),
        (
            r#"{"type":"OR","values":[{"type":"OR","values":[]},{"key":"n","value":3}]}"#,
            [true; 5],
        ),
    ];
    for (properties, want) in cases {
        let got = events.clone().map(|e| passes(properties, &e));
        assert_eq!(got, want, "{properties}");
    }
}

/// A filter of more filters than [`MAX_FILTERS`] or groups deeper than [`MAX_DEPTH`]
/// is refused; one at the bounds is read.
#[test]
fn an_abusive_filter_is_refused() {
    let filter = r#"{"key":"n","value":1,"operator":"gte"}"#;
    let list = |n: usize| format!("[{}]", vec![filter; n].join(","));
    assert!(parse(&list(MAX_FILTERS)).unwrap().is_some());
    assert!(refusal(&list(MAX_FILTERS + 1)).contains("100 filters at most"));
    let nested = |depth: usize| {
        let mut text = filter.to_owned();
        for _ in 0..depth {
            text = format!(r#"{{"type":"OR","values":[{text},{filter}]}}"#);
        }
        text
    };
    assert!(passes(&nested(MAX_DEPTH), &json!({"n": 1})));
    assert!(refusal(&nested(MAX_DEPTH + 1)).contains("nest 8 deep at most"));
    // OR groups of lists of groups count too.
    let and = |n| format!(r#"{{"type":"AND","values":{}}}"#, list(n));
    let wide = format!(r#"{{"type":"OR","values":[{},{}]}}"#, and(60), and(41));
    assert!(parse(&format!(
        r#"{{"type":"OR","values":[{},{}]}}"#,
        and(60),
        and(40)
    ))
    .is_ok());
    assert!(refusal(&wide).contains("filters at most"));
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
            r#"{"type":"OR","values":[{"key":"a","value":1},{"key":"b","value":"(","operator":"regex"}]}"#,
            "properties[1]: ",
        ),
        (
            r#"[{"key":"a","value":true,"operator":"flag_evaluates_to"}]"#,
            "properties[0]: ",
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
            let p = query::person_by_distinct_id(trees, 1, &e.distinct_id).unwrap();
            let person = p.map(|p| p.properties).unwrap_or_default();
            holds(&f, &e.distinct_id, &e.properties, &person)
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
        r#"{"type":"OR","values":[{"key":"plan","value":"Free"},{"key":"plan","value":"pro","type":"person"}]}"#,
        r#"{"type":"OR","values":[{"key":"n","value":"^1","operator":"regex"},
             {"type":"AND","values":[{"key":"plan","operator":"is_set"},
               {"key":"age","value":32,"operator":"lt","type":"person"}]}]}"#,
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
    // An OR needs a key when each of its filters needs the same one.
    let or = |a: &str, b: &str| format!(r#"{{"type":"OR","values":[{a},{b}]}}"#);
    let (plan, n) = (
        r#"{"key":"plan","value":"x"}"#,
        r#"{"key":"n","operator":"is_set"}"#,
    );
    assert_eq!(key(&or(plan, plan)), Some("plan".to_owned()));
    assert_eq!(key(&or(plan, n)), None);
    assert_eq!(key(&format!("[{},{n}]", or(plan, n))), Some("n".to_owned()));
    assert_eq!(
        key(r#"[{"key":"plan","value":"x","operator":"is_not"}]"#),
        None
    );
}
