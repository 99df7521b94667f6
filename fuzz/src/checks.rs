//! The properties each fuzz target asserts. The main test suite includes this file too
//! (`tests/integration/fuzz_regressions.rs`), so every input the fuzzers once found is
//! replayed through exactly these checks by `cargo test`.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use flagpost::capture::{self, timestamp, Context, Outcome};
use flagpost::flags::{self, Evaluation, ProjectRules};
use flagpost::http::decide::DecideRequest;
use flagpost::http::decode::{self, Compression, Query};
use flagpost::log::Record;
use flagpost::lz64;

use super::lzstring;

/// The server's "now" for every check, so results do not depend on the clock.
const NOW_MS: i64 = 1_700_000_000_000;
const NOW: time::OffsetDateTime = time::macros::datetime!(2023-11-14 22:13:20 UTC);

const HINTS: [&str; 9] = [
    "gzip",
    "gzip-js",
    "lz64",
    "lz-string",
    "base64",
    "b64",
    "GZIP ",
    "zstd",
    "",
];

/// `decode_body`: the first three bytes pick a compression hint, where it is given
/// (query, form field, header or nowhere), where the payload is (body, form `data=`,
/// query `data=`) and the cap; the rest is the payload. Whatever the route, the
/// decoded output never exceeds the cap, and each decompressor's cap is exact.
pub fn decode_body(data: &[u8]) {
    let Some((&[a, b, c], payload)) = data.split_first_chunk::<3>() else {
        return;
    };
    let hint = HINTS[usize::from(a) % HINTS.len()];
    let cap = match b >> 5 {
        0 => 0,
        1 => usize::from(c),
        2 => usize::from(c) * 64,
        3 => usize::from(c) * 4096,
        _ => 1 << 20,
    };
    let mut query = Vec::new();
    let mut form = Vec::new();
    let mut content_encoding = None;
    match (a / 16) % 4 {
        0 => query.push(format!("compression={}", percent(hint.as_bytes()))),
        1 => form.push(format!("compression={}", percent(hint.as_bytes()))),
        2 => content_encoding = Some(hint),
        _ => {}
    }
    let is_form = b & 1 == 1;
    let body: Vec<u8> = match (b >> 1) & 3 {
        // In the query string: the body is whatever else the client sent.
        0 => {
            query.push(format!("data={}", percent(payload)));
            form.push("ver=1".into());
            form.join("&").into_bytes()
        }
        1 => {
            form.push(format!("data={}", percent(payload)));
            form.join("&").into_bytes()
        }
        _ => payload.to_vec(),
    };
    if b & 8 == 8 {
        query.push("_=1700000000000&beacon=1".into());
    }
    let query = Query::parse(Some(&query.join("&")));
    let content_type = if is_form {
        Some("application/x-www-form-urlencoded; charset=utf-8")
    } else {
        Some("text/plain")
    };
    if let Ok(out) = decode::payload(&query, content_type, content_encoding, &body, cap) {
        assert!(out.len() <= cap, "{} bytes over a cap of {cap}", out.len());
        // What is decoded on the reactor must really be cheap: no bigger than it came.
        if !decode::may_expand(&query, content_type, content_encoding, &body) {
            let carried = body.len().max(query.data.as_ref().map_or(0, String::len));
            assert!(out.len() <= carried, "{} bytes from {carried}", out.len());
        }
    }
    for hint in [
        Compression::None,
        Compression::Gzip,
        Compression::Lz64,
        Compression::Base64,
    ] {
        exact_cap(payload, hint, cap);
    }
}

/// Output never over the cap; the same output fits a cap of exactly its size and is
/// refused as too large by a cap one byte smaller.
fn exact_cap(raw: &[u8], hint: Compression, cap: usize) {
    let Ok(out) = decode::decompress(raw, hint, cap) else {
        return;
    };
    assert!(out.len() <= cap, "{hint:?}: {} bytes over {cap}", out.len());
    assert_eq!(
        decode::decompress(raw, hint, out.len()).as_ref(),
        Ok(&out),
        "{hint:?}: a cap of exactly the output's size"
    );
    if let Some(smaller) = out.len().checked_sub(1) {
        assert_eq!(
            decode::decompress(raw, hint, smaller),
            Err(decode::Error::TooLarge),
            "{hint:?}: a cap one byte under the output"
        );
    }
}

/// Percent-encode every byte that is not alphanumeric.
fn percent(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| {
            if b.is_ascii_alphanumeric() {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `lz64`: the first byte picks the mode. Even: the rest is lz64 text, decoded under a
/// cap that must hold exactly. Odd: the rest is UTF-16 (pairs of bytes, lone surrogates
/// included), compressed with LZ-String and decoded back to the same text.
pub fn lz64(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        let cap = match mode >> 6 {
            0 => usize::from(mode),
            1 => usize::from(mode) * 64,
            _ => 1 << 20,
        };
        let Ok(text) = lz64::decompress_from_base64(rest, cap) else {
            return;
        };
        assert!(
            text.len() <= cap,
            "{} bytes over a cap of {cap}",
            text.len()
        );
        assert_eq!(
            lz64::decompress_from_base64(rest, text.len()).as_ref(),
            Ok(&text)
        );
        if let Some(smaller) = text.len().checked_sub(1) {
            assert_eq!(
                lz64::decompress_from_base64(rest, smaller),
                Err(lz64::Error::TooLarge)
            );
        }
    } else {
        let units: Vec<u16> = rest
            .chunks_exact(2)
            .map(|p| u16::from_le_bytes([p[0], p[1]]))
            .collect();
        let expected = String::from_utf16_lossy(&units);
        let compressed = lzstring::compress_to_base64(&units);
        assert_eq!(
            lz64::decompress_from_base64(compressed.as_bytes(), expected.len()).as_ref(),
            Ok(&expected),
            "round trip of {units:04x?} through {compressed}"
        );
        if let Some(smaller) = expected.len().checked_sub(1) {
            assert_eq!(
                lz64::decompress_from_base64(compressed.as_bytes(), smaller),
                Err(lz64::Error::TooLarge)
            );
        }
    }
}

/// A distinct id as stored: non-empty, at most 200 characters, no NUL.
fn check_distinct_id(id: &str) {
    assert!(!id.is_empty(), "empty distinct id");
    assert!(
        id.chars().count() <= capture::MAX_DISTINCT_ID_CHARS,
        "distinct id of {} characters",
        id.chars().count()
    );
    assert!(!id.contains('\0'), "NUL in distinct id {id:?}");
}

/// `capture_parse`: the first byte sets `/engage` and whether the request had a send
/// time; the rest is the decoded body. Every kept event becomes a record that survives
/// the log's encoding unchanged, with a clean distinct id and a time not too far ahead.
pub fn capture_parse(data: &[u8]) {
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    let mut bytes = body.to_vec();
    let Ok(payload) = capture::parse(&mut bytes, flags & 1 == 1) else {
        return;
    };
    assert!(!payload.is_empty(), "a payload without events parsed");
    let _ = payload.key();
    let ctx = Context {
        project: 7,
        now: NOW_MS,
        sent_at: payload
            .sent_at
            .and_then(timestamp::parse_ms)
            .or((flags & 2 == 2).then_some(NOW_MS - 1_000)),
        historical: payload.historical,
        ip: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
    };
    for event in payload.events() {
        let Ok(Outcome::Keep(record)) = capture::normalise_event(event, &ctx) else {
            continue;
        };
        assert_eq!(Record::decode(&record.encode()).as_ref(), Ok(&*record));
        check_distinct_id(&record.distinct_id);
        assert!(!record.event.is_empty(), "kept an event without a name");
        assert!(record.timestamp <= NOW_MS + timestamp::MAX_FUTURE_MS);
        assert_eq!(
            (record.project, record.received_at, record.historical),
            (7, NOW_MS, ctx.historical)
        );
        let stored: Value = serde_json::from_slice(&record.data).expect("the event as JSON");
        assert!(stored.is_object());
    }
}

/// `decide_request`: a parsed request names a key and a clean distinct id.
pub fn decide_request(data: &[u8]) {
    let Ok(request) = DecideRequest::parse(&mut data.to_vec()) else {
        return;
    };
    check_distinct_id(&request.distinct_id);
    if let Some(anon) = &request.anon_distinct_id {
        check_distinct_id(anon);
    }
}

/// Every flag key of a definitions file.
fn defined_keys(definitions: &Value) -> HashSet<String> {
    definitions["flags"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["key"].as_str())
        .map(str::to_owned)
        .collect()
}

/// Every `key: value` pair of a property filter anywhere in the file, as properties
/// that make conditions reachable.
fn properties_from(definitions: &Value, out: &mut Map<String, Value>) {
    match definitions {
        Value::Object(obj) => {
            if let (Some(Value::String(k)), Some(v)) = (obj.get("key"), obj.get("value")) {
                let v = match v {
                    Value::Array(items) => items.first().cloned().unwrap_or(Value::Null),
                    other => other.clone(),
                };
                out.insert(k.clone(), v);
            }
            obj.values().for_each(|v| properties_from(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| properties_from(v, out)),
        _ => {}
    }
}

/// One evaluation, checked: deterministic, only flags of the file, each at most once,
/// none inactive or deleted, `errors` set exactly when some flag failed, and every
/// response version renders.
fn check_evaluation(rules: &ProjectRules, ctx: &flags::Context<'_>) -> Evaluation {
    let evaluation = rules.evaluate(ctx);
    assert_eq!(
        rules.evaluate(ctx),
        evaluation,
        "evaluation is not deterministic"
    );
    let definitions = rules.definitions_json();
    let keys = defined_keys(definitions);
    let mut seen = HashSet::new();
    let results = evaluation.flags.iter().map(|f| &f.key);
    for key in results.chain(evaluation.failed.iter().map(|f| &f.key)) {
        assert!(keys.contains(key), "flag {key:?} is not in the file");
        assert!(seen.insert(key.clone()), "flag {key:?} answered twice");
    }
    for result in &evaluation.flags {
        let def = definitions["flags"]
            .as_array()
            .and_then(|all| {
                all.iter()
                    .filter(|f| f["deleted"] != json!(true))
                    .find(|f| f["key"] == json!(result.key))
            })
            .expect("a live definition for every result");
        assert_ne!(def["active"], json!(false), "inactive flag {}", result.key);
        assert!(result.enabled || result.variant.is_none());
        assert!(result.enabled || result.payload.is_none());
    }
    assert_eq!(evaluation.errors, !evaluation.failed.is_empty());
    for version in 1..=4 {
        let body = flags::response(version, &evaluation, uuid::Uuid::nil());
        assert!(body.is_object());
    }
    evaluation
}

/// `flag_definitions`: a file that compiles evaluates, for several callers, to results
/// that pass [`check_evaluation`].
pub fn flag_definitions(data: &[u8]) {
    let Ok(rules) = ProjectRules::compile(data) else {
        return;
    };
    let mut props = Map::new();
    properties_from(rules.definitions_json(), &mut props);
    let empty = Map::new();
    let mut groups = Map::new();
    let mut group_properties = HashMap::new();
    for name in rules.group_type_mapping().values() {
        groups.insert(name.clone(), json!("g-1"));
        group_properties.insert(name.clone(), Some(props.clone()));
    }
    let no_groups = Map::new();
    let no_group_properties = HashMap::new();
    let callers = [
        ("user-1", Some(&props), &groups, &group_properties),
        ("user-2", Some(&empty), &no_groups, &no_group_properties),
        ("user-3", None, &groups, &no_group_properties),
    ];
    for (distinct_id, person, groups, group_properties) in callers {
        let ctx = flags::Context {
            distinct_id,
            anon_distinct_id: Some("anon"),
            hash_key_override: None,
            person_properties: person,
            groups,
            group_properties,
            now: NOW,
        };
        check_evaluation(&rules, &ctx);
    }
}

/// One property filter on one flag, and the properties of the person (or group) it is
/// evaluated for. The regression files of `property_match` are this, as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PropertyCase {
    pub operator: String,
    pub key: String,
    pub value: Value,
    pub negation: bool,
    /// A group flag reading group properties instead of a person flag.
    pub group: bool,
    pub properties: Map<String, Value>,
}

impl PropertyCase {
    /// A person filter sits in a cohort the flag requires, since PostHog honours
    /// `negation` on cohort leaves only; a group filter sits in the flag's condition.
    fn definitions(&self, negation: bool) -> Vec<u8> {
        let filter = json!({
            "key": self.key,
            "type": if self.group { "group" } else { "person" },
            "value": self.value,
            "operator": self.operator,
            "negation": negation,
        });
        let (condition, cohorts) = if self.group {
            (filter, json!({}))
        } else {
            let cohort = json!({"type": "AND", "values": [filter]});
            (
                json!({"key": "id", "type": "cohort", "value": 1}),
                json!({ "1": cohort }),
            )
        };
        let flag = json!({
            "id": 1, "key": "the-flag", "active": true, "deleted": false,
            "filters": {
                "groups": [{"properties": [condition], "rollout_percentage": 100}],
                "aggregation_group_type_index": if self.group { json!(0) } else { Value::Null },
            },
        });
        let file = json!({"flags": [flag], "group_type_mapping": {"0": "org"}, "cohorts": cohorts});
        serde_json::to_vec(&file).expect("serialisable")
    }
}

/// `property_match`: compile and evaluate twice with the same answer; the one flag
/// is answered (never failed), and negating the filter flips it in a cohort and
/// changes nothing in a flag's own condition.
pub fn property_match(case: &PropertyCase) {
    let Ok(rules) = ProjectRules::compile(&case.definitions(case.negation)) else {
        return;
    };
    let negated = ProjectRules::compile(&case.definitions(!case.negation))
        .expect("the negated filter compiles too");
    let empty = Map::new();
    let groups = Map::from_iter([("org".to_owned(), json!("acme"))]);
    let group_properties = HashMap::from([("org".to_owned(), Some(case.properties.clone()))]);
    let ctx = flags::Context {
        distinct_id: "user-1",
        anon_distinct_id: None,
        hash_key_override: None,
        person_properties: Some(if case.group { &empty } else { &case.properties }),
        groups: &groups,
        group_properties: &group_properties,
        now: NOW,
    };
    let plain = check_evaluation(&rules, &ctx);
    let flipped = check_evaluation(&negated, &ctx);
    assert!(plain.failed.is_empty() && flipped.failed.is_empty());
    let (a, b) = (&plain.flags[..], &flipped.flags[..]);
    assert!(a.len() == 1 && b.len() == 1, "the flag is answered: {a:?}");
    if case.group {
        assert_eq!(
            a[0].enabled, b[0].enabled,
            "negation counts in cohorts only"
        );
    } else {
        assert_ne!(a[0].enabled, b[0].enabled, "negation flips the answer");
    }
}

/// `block`: the first byte picks the mode. Even: the rest is a stored block's value,
/// read both ways a block is read; either both refuse it or both give the same events,
/// and whatever is read of it is whole. Odd: the rest is cut into rows (at each `0xff`:
/// a row's first 16 bytes give its times and uuid, the rest its name, distinct id and
/// properties, split at `0xfe`), which are built into blocks and read back byte for byte.
pub fn block(data: &[u8]) {
    use flagpost::store::block::{self, Block, Entry, Rows};
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        let (rows, whole) = (Rows::decode(rest), Block::decode(rest));
        assert_eq!(
            rows.is_some(),
            whole.is_some(),
            "one way reads what the other refuses"
        );
        let (Some(rows), Some(whole)) = (rows, whole) else {
            return;
        };
        assert_eq!(rows.heads().len(), whole.heads().len());
        assert_eq!(block::count(rest), Some(rows.heads().len() as u32));
        for (i, h) in whole.heads().iter().enumerate() {
            let mut properties = Vec::new();
            rows.properties(i, &mut properties);
            assert_eq!(properties, whole.properties(h));
            let r = &rows.heads()[i];
            assert_eq!(
                (rows.event(r), rows.distinct_id(r)),
                (whole.event(h), whole.distinct_id(h))
            );
        }
        return;
    }
    let mut entries: Vec<Entry> = rest
        .split(|&b| b == 0xff)
        .map(|row| {
            let mut fixed = [0u8; 16];
            let n = row.len().min(16);
            fixed[..n].copy_from_slice(&row[..n]);
            let mut parts = row[n..].splitn(3, |&b| b == 0xfe);
            let mut text =
                || String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
            let (event, distinct_id) = (text(), text());
            let time = i64::from_le_bytes(fixed[..8].try_into().expect("8 bytes"));
            Entry {
                // Times near one another, as a chunk's are, unless the row says otherwise.
                timestamp: if mode & 2 == 0 {
                    NOW_MS + i64::from(fixed[0])
                } else {
                    time
                },
                created_at: time.rotate_left(u32::from(fixed[9])),
                uuid: uuid::Uuid::from_bytes(fixed),
                person_id: (fixed[15] & 1 == 1)
                    .then(|| uuid::Uuid::from_u128(u128::from(fixed[14]))),
                event,
                distinct_id,
                properties: parts.next().unwrap_or_default().to_vec(),
            }
        })
        .collect();
    let built = block::build(entries.clone());
    let mut read = Vec::new();
    for (newest, value) in &built {
        let whole = Block::decode(value).expect("a block just built reads");
        let rows = Rows::decode(value).expect("a block just built reads");
        assert_eq!(whole.heads().last().map(|h| h.timestamp), Some(*newest));
        for (i, h) in whole.heads().iter().enumerate() {
            let mut properties = Vec::new();
            rows.properties(i, &mut properties);
            assert_eq!(properties, whole.properties(h));
            read.push(Entry {
                timestamp: h.timestamp,
                created_at: h.created_at,
                uuid: h.uuid,
                person_id: h.person_id,
                event: whole.event(h).to_owned(),
                distinct_id: whole.distinct_id(h).to_owned(),
                properties,
            });
        }
    }
    // Rows of the same time and uuid may come out in either order.
    let order = |e: &Entry| {
        format!(
            "{:?}",
            (
                e.timestamp,
                e.uuid,
                &e.event,
                &e.distinct_id,
                &e.properties,
                e.created_at,
                e.person_id
            )
        )
    };
    read.sort_by_cached_key(order);
    entries.sort_by_cached_key(order);
    assert_eq!(read, entries);
}
