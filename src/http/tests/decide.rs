//! Decide's request parsing and answers, case by case.

use super::*;

fn parse(s: &str) -> Result<DecideRequest, ApiError> {
    DecideRequest::parse(&mut s.as_bytes().to_vec())
}

#[test]
fn versions() {
    assert_eq!(version(Some("v=3"), false), 3);
    assert_eq!(version(None, false), 1);
    assert_eq!(version(Some("v=9"), false), 4);
    assert_eq!(version(Some("v=0"), false), 1);
    assert_eq!(version(Some("v=2"), true), 4);
    assert_eq!(version(Some("v=3&config=true"), true), 4);
    assert_eq!(version(None, true), 3);
    assert_eq!(version(Some("v=1"), true), 3);
    assert_eq!(version(Some("v=x&ip=1"), false), 1);
}

#[test]
fn request_ids_are_distinct_v7() {
    let ids: std::collections::HashSet<uuid::Uuid> = (0..1000).map(|_| request_id()).collect();
    assert_eq!(ids.len(), 1000);
    assert!(ids.iter().all(|id| id.get_version_num() == 7));
}

#[test]
fn flag_keys_under_either_name() {
    let r = parse(r#"{"token":"k","distinct_id":"d","flag_keys_to_evaluate":["a","b"]}"#).unwrap();
    assert_eq!(r.flag_keys, Some(vec!["a".to_owned(), "b".to_owned()]));
    let r = parse(r#"{"token":"k","distinct_id":"d","flag_keys":[]}"#).unwrap();
    assert_eq!(r.flag_keys, Some(vec![]));
    let r = parse(r#"{"token":"k","distinct_id":"d","flag_keys":null}"#).unwrap();
    assert_eq!(r.flag_keys, None);
    assert!(matches!(
        parse(r#"{"token":"k","distinct_id":"d","flag_keys":"a"}"#),
        Err(ApiError::Decide(Error::InvalidBody(_)))
    ));
    assert!(matches!(
        parse(r#"{"token":"k","distinct_id":"d","flag_keys_to_evaluate":[1]}"#),
        Err(ApiError::Decide(Error::InvalidBody(_)))
    ));
}

#[test]
fn request_fields() {
    let r = parse(r#"{"token":"phc_k","distinct_id":42,"groups":{"org":"o"},"$anon_distinct_id":"a",
                     "person_properties":{"p":1},"group_properties":{"org":{"g":1}},"disable_flags":true}"#)
    .unwrap();
    assert_eq!((r.key.as_str(), r.distinct_id.as_str()), ("phc_k", "42"));
    assert_eq!(r.anon_distinct_id.as_deref(), Some("a"));
    assert_eq!(r.groups["org"], "o");
    assert!(r.disable_flags);
    assert!(matches!(
        parse(r#"{"distinct_id":"d"}"#),
        Err(ApiError::Decide(Error::MissingKey))
    ));
    assert!(matches!(
        parse(r#"{"api_key":"k"}"#),
        Err(ApiError::Decide(Error::MissingDistinctId))
    ));
    assert!(matches!(
        parse(r#"{"api_key":"k","distinct_id":""}"#),
        Err(ApiError::Decide(Error::MissingDistinctId))
    ));
    assert!(matches!(
        parse(r#"{"api_key":"k","distinct_id":{}}"#),
        Err(ApiError::Decide(Error::InvalidBody(_)))
    ));
    assert!(matches!(
        parse(r#"{"api_key":"k","distinct_id":"d","groups":[]}"#),
        Err(ApiError::Decide(Error::InvalidBody(_)))
    ));
    assert!(matches!(
        parse("[1]"),
        Err(ApiError::Decide(Error::InvalidBody(_)))
    ));
    assert!(matches!(
        parse("{"),
        Err(ApiError::Capture(capture::Error::InvalidJson(_)))
    ));
}

/// The members as serde_json would read them: null is absent, a repeated key
/// keeps its last value, numbers in serde_json's form.
#[test]
fn request_members_read_as_serde_json_would() {
    let r = parse(
        r#"{"api_key":null,"token":"phc_t","distinct_id":2.5,"$anon_distinct_id":7,
            "person_properties":{"a":1},"person_properties":{"b":[1,{"c":null}],"a":2,"b":0},
            "groups":{"z":"1","a":2},"group_properties":null,"disable_flags":1}"#,
    )
    .unwrap();
    assert_eq!((r.key.as_str(), r.distinct_id.as_str()), ("phc_t", "2.5"));
    assert_eq!(r.anon_distinct_id.as_deref(), Some("7"));
    assert_eq!(
        Value::Object(r.person_properties),
        serde_json::json!({"b": 0, "a": 2})
    );
    let keys: Vec<&str> = r.groups.keys().map(String::as_str).collect();
    assert_eq!(keys, ["z", "a"]);
    assert!(r.group_properties.is_empty());
    assert!(!r.disable_flags, "only true disables");
    let anon = parse(r#"{"token":"k","distinct_id":"d","$anon_distinct_id":""}"#).unwrap();
    assert_eq!(anon.anon_distinct_id, None);
    assert!(matches!(
        parse(r#"{"api_key":5,"distinct_id":"d"}"#),
        Err(ApiError::Decide(Error::InvalidBody(_)))
    ));
    assert!(matches!(
        parse(r#"{"api_key":5,"token":"k","distinct_id":"d"}"#),
        Ok(DecideRequest { key, .. }) if key == "k"
    ));
    assert!(matches!(
        parse(r#"{"token":null,"distinct_id":"d"}"#),
        Err(ApiError::Decide(Error::MissingKey))
    ));
    assert!(matches!(
        parse(r#"{"token":"k","distinct_id":null}"#),
        Err(ApiError::Decide(Error::MissingDistinctId))
    ));
}
