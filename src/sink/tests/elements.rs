//! Expected chains come from PostHog's own tests where they have one
//! (`nodejs/src/common/utils/elements-chain.test.ts`: "derives the chain from a legacy
//! $elements array", "handles multiple classNames", the malformed payloads); the others
//! are what PostHog's `extractElements` + `elementsToString` return for the same
//! input, run in Node 20 (ICU `localeCompare`, V8 number printing).

use serde_json::{json, Value};

use super::*;

fn of(elements: Value) -> String {
    chain(&elements)
}

#[test]
fn posthogs_cases() {
    // PostHog: elementsChainFromProperties, "derives the chain from a legacy $elements array".
    assert_eq!(
        of(json!([{"tag_name": "a", "$el_text": "click", "nth_child": 1, "nth_of_type": 1}])),
        r#"a:nth-child="1"nth-of-type="1"text="click""#
    );
    // PostHog: "handles multiple classNames", as the element `extractElements` makes.
    assert_eq!(
        of(json!([{"attr__class": "something another"}])),
        r#".another.something:attr__class="something another"nth-child="0"nth-of-type="0""#
    );
    // PostHog's extractElements test input ("parses simple elements"), made a chain.
    assert_eq!(
        of(json!([
            {"tag_name": "a", "nth_child": 1, "nth_of_type": 2, "attr__class": "btn btn-sm"},
            {"tag_name": "div", "nth_child": 1, "nth_of_type": 2, "$el_text": "💻"}
        ])),
        r#"a.btn.btn-sm:attr__class="btn btn-sm"nth-child="1"nth-of-type="2";div:nth-child="1"nth-of-type="2"text="💻""#
    );
    // PostHog's "is reversible" elements, sent as $elements.
    assert_eq!(
        of(json!([
            {"tag_name": "a", "attr__href": "/a-url", "attr__class": ["small"], "$el_text": "bla bla",
             "attr__prop": "value", "attr__number": 33,
             "attr__data-attr": "something \" that; could mess up",
             "attr__style": "min-height: 100vh;", "nth_child": 1, "nth_of_type": 0},
            {"tag_name": "button", "attr__class": "btn btn-primary", "nth_child": 0, "nth_of_type": 0},
            {"tag_name": "div", "nth_child": 0, "nth_of_type": 0},
            {"tag_name": "div", "nth_child": 0, "nth_of_type": 0, "attr__id": "nested"}
        ])),
        [
            r#"a.small:attr__class="small"attr__data-attr="something \" that; could mess up"attr__href="/a-url"attr__number="33"attr__prop="value"attr__style="min-height: 100vh;"href="/a-url"nth-child="1"nth-of-type="0"text="bla bla""#,
            r#"button.btn.btn-primary:attr__class="btn btn-primary"nth-child="0"nth-of-type="0""#,
            r#"div:nth-child="0"nth-of-type="0""#,
            r#"div:attr__id="nested"attr_id="nested"nth-child="0"nth-of-type="0""#,
        ]
        .join(";")
    );
    assert_eq!(
        of(json!([{"tag_name": "div", "attr__empty": ""}])),
        r#"div:attr__empty=""nth-child="0"nth-of-type="0""#
    );
}

#[test]
fn text_and_href_are_cut_as_posthog_does() {
    // PostHog: "truncates $el_text to 400 chars and attr__href to 2048 chars".
    let long = "a".repeat(2050);
    let got = of(
        json!([{"tag_name": "a", "$el_text": long, "attr__href": long,
                         "nth_child": 1, "nth_of_type": 2, "attr__class": "btn btn-sm"}]),
    );
    let want = format!(
        r#"a.btn.btn-sm:attr__class="btn btn-sm"attr__href="{long}"href="{}"nth-child="1"nth-of-type="2"text="{}""#,
        &long[..2048],
        &long[..400]
    );
    assert_eq!(got, want);
    // UTF-16 units: 399 + an emoji's two would be 401; JavaScript keeps half of it.
    let text = format!("{}😀b", "a".repeat(399));
    let got = of(json!([{"$el_text": text}]));
    assert!(
        got.ends_with(&format!("text=\"{}\u{FFFD}\"", "a".repeat(399))),
        "{got}"
    );
}

#[test]
fn malformed_payloads_give_no_chain() {
    // PostHog: "returns an empty string for" these (its code throws and catches).
    for elements in [
        json!("not-an-array"),
        json!([null]),
        json!([{"$el_text": 42}]),
        json!([{"attr__class": 42}]),
        // Further values PostHog's code throws on.
        json!([{"attr__x": null}]),
        json!([{"attr__class": ["b", 3]}]),
        json!([{"attr__href": true}]),
        json!([{"tag_name": "a"}, null]),
        json!({"0": {"tag_name": "p"}, "length": 1}),
        json!([]),
        json!(null),
        json!(7),
    ] {
        assert_eq!(of(elements.clone()), "", "{elements}");
    }
}

#[test]
fn values_become_text_as_javascript_makes_them() {
    // Property reads of a non-object element find nothing.
    assert_eq!(
        of(json!([0, "x", [1], true, {}])),
        [r#":nth-child="0"nth-of-type="0""#; 5].join(";")
    );
    assert_eq!(
        of(
            json!([{"tag_name": 7, "nth_child": false, "nth_of_type": [1, [2, null], {}],
                   "attr__B": 1e21, "attr__a": 1e-7, "attr__c_d": 0.000001, "attr__c-d": 123.456,
                   "attr__c1": 12345678901234567890u64, "attr__Z": -0.5, "attr__z": []}])
        ),
        r#"7:attr__a="1e-7"attr__B="1e+21"attr__c_d="0.000001"attr__c-d="123.456"attr__c1="12345678901234567000"attr__z=""attr__Z="-0.5"nth-child="false"nth-of-type="1,2,,[object Object]""#
    );
    assert_eq!(
        of(
            json!([{"tag_name": true, "attr__class": "z  a \"q\"", "$el_text": ["a", null, "b"],
                   "attr__href": "", "attr__id": 0}])
        ),
        r#"true..q.a.z:attr__class="z  a \"q\""attr__href=""attr__id="0"nth-child="0"nth-of-type="0"text="a,,b""#
    );
    assert_eq!(
        of(json!([{"tag_name": [], "attr__class": [], "$el_text": "", "attr__id": {"x": 1}}])),
        r#":attr__class=""attr__id="[object Object]"attr_id="[object Object]"nth-child="0"nth-of-type="0""#
    );
    assert_eq!(
        of(json!([{"tag_name": "a", "attr__class": "\"x\" y"}, {"tag_name": "b\"c"}])),
        r#"a.x.y:attr__class="\"x\" y"nth-child="0"nth-of-type="0";b"c:nth-child="0"nth-of-type="0""#
    );
}

#[test]
fn numbers_print_as_in_javascript() {
    // Node 20's String(x) for each.
    for (x, want) in [
        (json!(0), "0"),
        (json!(-0.0), "0"),
        (json!(-5), "-5"),
        (json!(1.5), "1.5"),
        (json!(1e21), "1e+21"),
        (json!(1e20), "100000000000000000000"),
        (json!(123e18), "123000000000000000000"),
        (json!(1e-7), "1e-7"),
        (json!(-1e-7), "-1e-7"),
        (json!(1.2e-5), "0.000012"),
        (json!(0.1 + 0.2), "0.30000000000000004"),
        (json!(f64::MAX), "1.7976931348623157e+308"),
        (json!(5e-324), "5e-324"),
        (json!(9007199254740992u64), "9007199254740992"),
        (json!(9007199254740993u64), "9007199254740992"),
        (json!(12345678901234567890u64), "12345678901234567000"),
    ] {
        let Value::Number(n) = &x else { unreachable!() };
        assert_eq!(js_number(n), want, "{x}");
    }
}

#[test]
fn keys_sort_as_localecompare_and_classes_by_utf16() {
    assert_eq!(
        of(
            json!([{"tag_name": "a", "$el_text": "x", "attr__href": "/b", "attr__id": "i",
                   "attr__data-x": "1", "attr__data_x": "2", "attr__data1": "3", "attr__DATA": "4",
                   "attr__aria-label": "5", "attr__a": "6", "attr__viewBox": "7",
                   "attr__viewbox": "8"}])
        ),
        r#"a:attr__a="6"attr__aria-label="5"attr__DATA="4"attr__data_x="2"attr__data-x="1"attr__data1="3"attr__href="/b"attr__id="i"attr__viewbox="8"attr__viewBox="7"attr_id="i"href="/b"nth-child="0"nth-of-type="0"text="x""#
    );
    assert_eq!(
        of(
            json!([{"attr__a b": "5", "attr__a\tb": "6", "attr__a~b": "7", "attr__a$b": "8",
                   "attr__a\"b": "9", "attr__a\\b": "10"}])
        ),
        ":attr__a\tb=\"6\"attr__a b=\"5\"attr__a\\\"b=\"9\"attr__a\\b=\"10\"attr__a~b=\"7\"\
         attr__a$b=\"8\"nth-child=\"0\"nth-of-type=\"0\""
    );
    // The list itself stays in the order sent: PostHog's "does not reorder the input
    // $elements class array" (its older code sorted the sent array in place, so the
    // `attr__class` value came out sorted too).
    assert_eq!(
        of(json!([{"attr__class": ["Zeta", "alpha", "éa", "ea", "😀", "\u{ffff}"]}])),
        ".Zeta.alpha.ea.éa.😀.\u{ffff}:attr__class=\"Zeta,alpha,éa,ea,😀,\u{ffff}\"nth-child=\"0\"nth-of-type=\"0\""
    );
}

#[test]
fn hostile_input_is_bounded() {
    // Two bytes of input per element, thirty of chain: cut at an element's end.
    let many = Value::Array(vec![json!(0); 200_000]);
    let got = of(many);
    assert!(got.len() <= MAX_CHAIN_BYTES && got.len() > MAX_CHAIN_BYTES - 40);
    assert!(got.ends_with(r#":nth-child="0"nth-of-type="0""#));
    // One element past the limit on its own: nothing fits.
    let huge = "x".repeat(MAX_CHAIN_BYTES);
    assert_eq!(of(json!([{"attr__data": huge}, {"tag_name": "a"}])), "");
    // Objects written out as "[object Object]" (15 bytes for 2 of input): the text
    // stops growing at the cap, and the element is left out.
    let objects = Value::Array(vec![json!({}); 200_000]);
    assert_eq!(
        of(json!([{"attr__data": objects.clone(), "attr__href": objects}, {"tag_name": "a"}])),
        ""
    );
    // Spaces split into more classes than fit: not listed one by one.
    let spaces = " ".repeat(MAX_CHAIN_BYTES);
    assert_eq!(
        of(json!([{"tag_name": "a"}, {"attr__class": spaces}])),
        r#"a:nth-child="0"nth-of-type="0""#
    );
    // As deep as stored properties can be, in every place a value is read.
    let mut deep = json!("end");
    for _ in 0..126 {
        deep = json!([deep]);
    }
    let got = of(
        json!([{"tag_name": deep, "nth_child": deep, "$el_text": deep,
                         "attr__class": "a", "attr__x": deep}]),
    );
    assert_eq!(
        got,
        r#"end.a:attr__class="a"attr__x="end"nth-child="end"nth-of-type="0"text="end""#
    );
    // Many keys and classes.
    let mut el = serde_json::Map::new();
    for i in 0..5_000 {
        el.insert(format!("attr__k{}", 5_000 - i), json!(i));
    }
    el.insert("attr__class".into(), json!(vec!["c"; 5_000].join(" ")));
    let got = of(json!([el]));
    assert!(got.starts_with(".c.c"), "{}", &got[..40]);
    assert!(got.contains(r#"attr__k1="4999"attr__k10="4990"attr__k100="4900""#));
}
