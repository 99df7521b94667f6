//! The read API's events filtered by PostHog's `properties` parameter over loopback:
//! event and person filters in each shape PostHog takes (AND and OR groups nested),
//! compared as its events API compares (`exact` case-sensitive), with `event`,
//! `distinct_id`, `after` and `limit` beside them, paged by `next` and exported as
//! NDJSON; and the 400s in PostHog's error shape for what cannot be answered.

use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::util::*;

/// Ten events a minute apart, oldest first: `n` is 0..9, `$browser` Chrome for n < 6
/// else Safari, `signup` for n divisible by 3 else `$pageview`, distinct id `a` (whose
/// person's plan is pro) for even n, `b` (free) for odd. Returns the times.
fn capture(server: &Server) -> Vec<String> {
    let now = OffsetDateTime::now_utc();
    let times: Vec<String> = (0..10)
        .map(|n| {
            (now - time::Duration::minutes(10 - n))
                .format(&Rfc3339)
                .unwrap()
        })
        .collect();
    let batch: Vec<Value> = (0..10usize)
        .map(|n| {
            let (who, plan) = if n % 2 == 0 {
                ("a", "pro")
            } else {
                ("b", "free")
            };
            json!({"event": if n % 3 == 0 { "signup" } else { "$pageview" },
                   "distinct_id": who, "timestamp": times[n],
                   "properties": {"$browser": if n < 6 { "Chrome" } else { "Safari" }, "n": n,
                                  "$set": {"plan": plan}}})
        })
        .collect();
    let body = json!({"api_key": KEY_ONE, "batch": batch});
    assert_eq!(server.post("/batch/", body.to_string()).status, 200);
    server.wait_for_events(1, 10);
    times
}

fn url(properties: &str, rest: &str) -> String {
    format!(
        "/api/projects/1/events/?properties={}{rest}",
        urlencode(properties)
    )
}

/// The `n` of each event of a page, and the path of the next page.
fn page(server: &Server, path: &str) -> (Vec<i64>, Option<String>) {
    let r = server.api(path, PERSONAL_ONE);
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    let body = r.json();
    let ns = (body["results"].as_array().unwrap().iter())
        .map(|e| e["properties"]["n"].as_i64().unwrap())
        .collect();
    let next = (body["next"].as_str()).map(|n| n[n.find("/api/").unwrap()..].to_owned());
    (ns, next)
}

/// Every page from `path` on, by `next`.
fn all(server: &Server, path: &str) -> Vec<i64> {
    let (mut ns, mut next) = page(server, path);
    while let Some(path) = next {
        let (more, after) = page(server, &path);
        ns.extend(more);
        next = after;
    }
    ns
}

#[test]
fn events_are_filtered_by_properties_as_posthog_takes_them() {
    let server = Server::start();
    let times = capture(&server);
    let chrome = r#"[{"key":"$browser","value":"Chrome","operator":"exact","type":"event"}]"#;
    let cases: &[(&str, &str, &[i64])] = &[
        (chrome, "", &[5, 4, 3, 2, 1, 0]),
        (
            r#"[{"key":"$browser","value":"Chrome"},{"key":"n","value":2,"operator":"gt"}]"#,
            "",
            &[5, 4, 3],
        ),
        // Case-sensitive, as PostHog's events API (the flags ignore case).
        (r#"[{"key":"$browser","value":"chrome"}]"#, "", &[]),
        (
            r#"[{"key":"$browser","value":"chrome","operator":"is_not"}]"#,
            "&limit=3",
            &[9, 8, 7, 6, 5, 4, 3, 2, 1, 0],
        ),
        (
            r#"[{"key":"$browser","value":"chrome","operator":"icontains"}]"#,
            "",
            &[5, 4, 3, 2, 1, 0],
        ),
        (
            r#"{"type":"OR","values":[{"key":"n","value":8,"operator":"gte"},
                {"type":"AND","values":[{"key":"$browser","value":"Chrome"},{"key":"n","value":2,"operator":"lt"}]}]}"#,
            "&limit=2",
            &[9, 8, 1, 0],
        ),
        (
            r#"{"type":"OR","values":[{"key":"plan","value":"free","type":"person"},{"key":"n","value":[0,4]}]}"#,
            "&event=%24pageview",
            &[7, 5, 4, 1],
        ),
        (r#"{"$browser":"Safari","n__lt":8}"#, "", &[7, 6]),
        (
            r#"{"type":"AND","values":[{"type":"AND","values":[{"key":"n","value":["1","4","7"]}]}]}"#,
            "",
            &[7, 4, 1],
        ),
        (
            r#"[{"key":"$browser","value":"^S","operator":"regex"}]"#,
            "",
            &[9, 8, 7, 6],
        ),
        (
            r#"[{"key":"$os","operator":"is_not_set"}]"#,
            "&limit=2",
            &[9, 8, 7, 6, 5, 4, 3, 2, 1, 0],
        ),
        (
            r#"[{"key":"plan","value":"pro","type":"person"}]"#,
            "",
            &[8, 6, 4, 2, 0],
        ),
        (
            r#"[{"key":"plan","value":"pro","type":"person"}]"#,
            "&event=signup",
            &[6, 0],
        ),
        (chrome, "&distinct_id=b", &[5, 3, 1]),
        (
            chrome,
            &format!("&after={}", urlencode(&times[2])),
            &[5, 4, 3, 2],
        ),
        (chrome, "&limit=4", &[5, 4, 3, 2, 1, 0]),
        ("[]", "&event=signup", &[9, 6, 3, 0]),
    ];
    for (properties, rest, want) in cases {
        assert_eq!(
            all(&server, &url(properties, rest)),
            *want,
            "{properties} {rest}"
        );
    }
    // A full page goes on from its last event, keeping the filter.
    let (first, next) = page(&server, &url(chrome, "&limit=4"));
    assert_eq!(first, [5, 4, 3, 2]);
    let next = next.unwrap();
    assert!(next.contains("properties="), "{next}");
    assert_eq!(page(&server, &next), (vec![1, 0], None));

    // The export streams every match.
    let r = server.request(
        Req::get(&url(r#"[{"key":"n","value":6,"operator":"gte"}]"#, ""))
            .header("Authorization", &format!("Bearer {PERSONAL_ONE}"))
            .header("Accept", "application/x-ndjson"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let ns: Vec<i64> = (r.text().lines())
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["properties"]["n"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(ns, [9, 8, 7, 6]);
}

#[test]
fn what_cannot_be_answered_is_a_400_in_posthogs_shape() {
    let server = Server::start();
    let r = server.api(
        "/api/projects/1/events/?properties=invalid_json",
        PERSONAL_ONE,
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json(),
        json!({"type": "validation_error", "code": "invalid_input",
               "detail": "Properties are unparsable!", "attr": "properties"})
    );
    let filter = r#"{"key":"a","value":1}"#;
    let abusive = format!("[{}]", vec![filter; 101].join(","));
    let mut deep = filter.to_owned();
    for _ in 0..9 {
        deep = format!(r#"{{"type":"OR","values":[{deep},{filter}]}}"#);
    }
    for (properties, says) in [
        (
            r#"[{"key":"a","value":"x","operator":"ends_wth"}]"#,
            "unknown operator",
        ),
        (r#"[{"key":"a","value":"(","operator":"regex"}]"#, "regex"),
        (
            r#"[{"key":"id","value":7,"type":"cohort"}]"#,
            "not supported",
        ),
        (abusive.as_str(), "100 filters at most"),
        (deep.as_str(), "nest 8 deep at most"),
    ] {
        for accept in ["application/json", "application/x-ndjson"] {
            let r = server.request(
                Req::get(&url(properties, ""))
                    .header("Authorization", &format!("Bearer {PERSONAL_ONE}"))
                    .header("Accept", accept),
            );
            assert_eq!(r.status, 400, "{properties}: {}", r.text());
            let body = r.json();
            assert_eq!(
                (&body["type"], &body["code"], &body["attr"]),
                (
                    &json!("validation_error"),
                    &json!("invalid_input"),
                    &json!("properties")
                )
            );
            let detail = body["detail"].as_str().unwrap();
            assert!(detail.contains(says), "{properties}: {detail}");
        }
    }
}
