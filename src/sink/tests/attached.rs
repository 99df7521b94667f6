//! The columns and the properties sent for stored properties: exact bytes, compared with
//! what serde_json writes for the object without `$elements_chain` and `$elements`.

use serde_json::{json, Value};

use super::*;

/// Properties as the store keeps them: serde_json's compact text.
fn stored(v: Value) -> Vec<u8> {
    serde_json::to_vec(&v).unwrap()
}

/// What the row's properties should be: the stored object without the two keys.
fn sent(mut v: Value) -> Vec<u8> {
    let map = v.as_object_mut().unwrap();
    map.shift_remove("$elements_chain");
    map.shift_remove("$elements");
    stored(v)
}

#[test]
fn group_columns() {
    assert_eq!(Attached::of(br#"{"a":1}"#), Attached::default());
    let a = Attached::of(br#"{"$group_0":"acme","$group_3":42,"$group_1":null}"#);
    assert_eq!(a.groups, ["acme", "", "", "42", ""].map(String::from));
    assert_eq!(a.properties, None, "nothing to leave out");
    let nested = br#"{"$set":{"$group_1":"no"},"$group_2":"y\"es","n":[1,{"a":null}]}"#;
    let a = Attached::of(nested);
    assert_eq!(a.groups, ["", "", "y\"es", "", ""].map(String::from));
    assert_eq!(Attached::of(b"{not json \"$group_0\""), Attached::default());
    assert_eq!(Attached::of(br#"["$group_0"]"#), Attached::default());
}

#[test]
fn the_chain_and_elements_leave_properties() {
    // posthog-js's chain, as before, now also out of the properties.
    let p = json!({"$elements_chain": "a:href=\"/x\"", "$group_0": "acme", "ü": [1, {"a\"b": 2}]});
    let a = Attached::of(&stored(p.clone()));
    assert_eq!(a.elements_chain, "a:href=\"/x\"");
    assert_eq!(a.groups[0], "acme");
    assert_eq!(a.properties, Some(sent(p)));
    // An `$elements` array: the chain PostHog builds (elements_tests.rs has the rules).
    let p = json!({"$event_type": "click", "$elements": [
        {"tag_name": "a", "$el_text": "click", "nth_child": 1, "nth_of_type": 1}
    ], "$current_url": "https://shop/"});
    let a = Attached::of(&stored(p.clone()));
    assert_eq!(
        a.elements_chain,
        r#"a:nth-child="1"nth-of-type="1"text="click""#
    );
    assert_eq!(
        a.properties.as_deref(),
        Some(&br#"{"$event_type":"click","$current_url":"https://shop/"}"#[..])
    );
    assert_eq!(a.properties, Some(sent(p)));
}

#[test]
fn which_one_counts() {
    let elements = json!([{"tag_name": "p"}]);
    let built = r#"p:nth-child="0"nth-of-type="0""#;
    // PostHog's create-event test: "prefers $elements_chain over $elements when both
    // are present, and removes both"; falsy chains give way to the list.
    for (chain, want) in [
        (json!("span:nth-child=\"3\""), "span:nth-child=\"3\""),
        (json!(""), built),
        (json!(null), built),
        (json!(false), built),
        (json!(0), built),
        (json!(-0.0), built),
        (json!(12), "12"),
        (json!(true), ""),
        (json!({"a": 1}), ""),
    ] {
        let p = json!({"x": 1, "$elements_chain": chain, "$elements": elements});
        let a = Attached::of(&stored(p));
        assert_eq!(a.elements_chain, want, "{chain}");
        assert_eq!(a.properties.as_deref(), Some(&br#"{"x":1}"#[..]), "{chain}");
    }
    // PostHog: "returns empty string and removes both keys when $elements is an empty
    // array"; anything but a list of elements is no chain, and still left out.
    for list in [
        json!([]),
        json!(null),
        json!("a"),
        json!({"length": 1}),
        json!([null]),
    ] {
        let p = json!({"$elements": list, "y": "z"});
        let a = Attached::of(&stored(p));
        assert_eq!(a.elements_chain, "", "{list}");
        assert_eq!(
            a.properties.as_deref(),
            Some(&br#"{"y":"z"}"#[..]),
            "{list}"
        );
    }
    // Only top-level keys count.
    let p = br#"{"$set":{"$elements":[{"tag_name":"a"}]},"k":"\"$elements_chain\""}"#;
    assert_eq!(Attached::of(p), Attached::default());
    // The last of a key given twice counts, and every copy is left out.
    let p = br#"{"$elements_chain":"a:","b":1,"$elements_chain":"b:"}"#;
    let a = Attached::of(p);
    assert_eq!(a.elements_chain, "b:");
    assert_eq!(a.properties.as_deref(), Some(&br#"{"b":1}"#[..]));
    assert_eq!(
        Attached::of(br#"{"$elements":1}"#).properties.as_deref(),
        Some(&b"{}"[..])
    );
}

#[test]
fn members_are_cut_out_wherever_they_are() {
    // Every order of the two keys among others, and with fewer others.
    let keys = ["a", CHAIN, "b", ELEMENTS];
    let orders = (0..24).map(|mut n| {
        let mut left = keys.to_vec();
        let mut order = Vec::new();
        while !left.is_empty() {
            order.push(left.remove(n % left.len()));
            n /= left.len() + 1;
        }
        order
    });
    for order in orders {
        for len in 1..=order.len() {
            let mut map = serde_json::Map::new();
            for key in &order[..len] {
                map.insert(key.to_string(), json!([{"tag_name": key}]));
            }
            let p = Value::Object(map);
            let a = Attached::of(&stored(p.clone()));
            let has = |k| order[..len].contains(&k);
            let want = (has(CHAIN) || has(ELEMENTS)).then(|| sent(p.clone()));
            assert_eq!(a.properties, want, "{p}");
        }
    }
}

#[test]
fn rewritten_properties_keep_every_other_member_as_stored() {
    let p = json!({
        "$elements": [{"tag_name": "a"}], "esc\"aped\n\u{1}": "v\\\"", "ü": "ü", "😀": 1.5e300,
        "n": null, "deep": {"$elements": [1], "x": [[[]]]}, "big": 12345678901234567890u64,
        "neg": -7, "t": true, "$elements_chain": ""
    });
    let a = Attached::of(&stored(p.clone()));
    assert_eq!(a.properties, Some(sent(p)));
    assert_eq!(a.elements_chain, r#"a:nth-child="0"nth-of-type="0""#);
    // Hostile: large and deep, no panic, linear work.
    let mut deep = json!([]);
    for _ in 0..120 {
        deep = json!([deep]);
    }
    let list = vec![json!({"attr__x": deep, "tag_name": "a"}); 10_000];
    let p = json!({"$elements": list, "other": deep});
    let a = Attached::of(&stored(p.clone()));
    assert_eq!(a.properties, Some(sent(p)));
    assert_eq!(a.elements_chain.matches(';').count(), 9_999);
}
