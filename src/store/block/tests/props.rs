use serde_json::{json, Map, Value};

use super::*;
use crate::support::lcg::Lcg;

fn round_trip(texts: &[&[u8]]) -> Vec<u8> {
    let mut body = Vec::new();
    encode(texts.iter().copied(), &mut body);
    let (out, ends) = decode(&mut Cursor { rest: &body }, texts.len()).unwrap();
    let mut from = 0;
    for (text, &end) in texts.iter().zip(&ends) {
        assert_eq!(&out[from..end], *text, "{}", String::from_utf8_lossy(text));
        from = end;
    }
    assert_eq!(from, out.len());
    body
}

#[test]
fn objects_split_and_join_back_byte_for_byte() {
    let id = "01a216c2-1c6c-7536-a8b3-bcbfd45bc4b1";
    let texts: Vec<Vec<u8>> = vec![
        format!(r#"{{"$device_id":"{id}","$browser":"Chrome","n":1.5e3,"ok":true}}"#).into(),
        br#"{"$browser":"Firefox","nested":{"a":[1,{"b":"}]"}],"c":null},"n":-2}"#.to_vec(),
        br#"{}"#.to_vec(),
        br#"{"k\"ey":"v\\","\u00e9":"\u0001","":""}"#.to_vec(),
        "{\"ü\":\"ß\",\"$browser\":\"Chrome\"}".into(),
    ];
    let refs: Vec<&[u8]> = texts.iter().map(|t| &t[..]).collect();
    let body = round_trip(&refs);
    // Keys named once: "$browser" three times in the events, once in the body.
    let count = |needle: &[u8]| body.windows(needle.len()).filter(|w| *w == needle).count();
    assert_eq!(count(br#""$browser""#), 1);
    assert_eq!(count(b"Chrome"), 2);
}

#[test]
fn anything_else_is_kept_whole() {
    let odd: Vec<&[u8]> = vec![
        b"",
        b"{",
        b"}",
        b"[1,2]",
        b"\"text\"",
        b"{ \"a\": 1 }",
        b"{\"a\":1,}",
        b"{\"a\"}",
        b"{\"a\":}",
        b"{\"a\":1 \"b\":2}",
        b"{\"a\":\"unterminated}",
        b"{\"a\":{\"b\":1}",
        b"{\"a\":1}}",
        b"{\"a\\",
        b"\x01\x02{\"a\":\x01}",
        b"{\"a\":1,\"a\":2}",
    ];
    round_trip(&odd);
    let mut body = Vec::new();
    encode([&b"{\"a\":1,}"[..]].into_iter(), &mut body);
    assert_eq!(body[4], WHOLE, "no keys; the one shape says whole");
}

fn value(rng: &mut Lcg, depth: u32) -> Value {
    let keys = ["$browser", "$current_url", "a", "é\"x", "$set", "\\", ""];
    match rng.next(if depth > 2 { 5 } else { 7 }) {
        0 => Value::Null,
        1 => json!(rng.next(2) == 1),
        2 => json!(rng.next(1 << 40) as f64 / 7.0 - 1e9),
        3 => json!(
            [
                "Chrome",
                "héllo \"q\" \\ \u{1}",
                "01a216c2-1c6c-7536-a8b3-bcbfd45bc4b1"
            ][rng.next(3) as usize]
        ),
        4 => json!(rng.next(1000) as i64 - 500),
        5 => Value::Array((0..rng.next(4)).map(|_| value(rng, depth + 1)).collect()),
        _ => {
            let mut m = Map::new();
            for _ in 0..rng.next(6) {
                m.insert(keys[rng.next(7) as usize].into(), value(rng, depth + 1));
            }
            Value::Object(m)
        }
    }
}

/// Random objects, as serde_json writes them (the compactor's properties): each reads
/// back byte for byte, so its meaning and its order of keys are kept.
#[test]
fn random_objects_round_trip() {
    for seed in 0..200 {
        let mut rng = Lcg(seed);
        let texts: Vec<Vec<u8>> = (0..1 + rng.next(40))
            .map(|_| {
                let mut m = Map::new();
                for i in 0..rng.next(16) {
                    m.insert(format!("k{}", rng.next(20) + i), value(&mut rng, 0));
                }
                serde_json::to_vec(&m).unwrap()
            })
            .collect();
        let refs: Vec<&[u8]> = texts.iter().map(|t| &t[..]).collect();
        round_trip(&refs);
    }
}

#[test]
fn damage_is_refused_without_panic() {
    let texts: Vec<&[u8]> = vec![br#"{"a":1,"b":"x"}"#, b"whole", br#"{"b":"y"}"#];
    let body = round_trip(&texts);
    for n in 0..body.len() {
        assert!(
            decode(&mut Cursor { rest: &body[..n] }, 3).is_none(),
            "prefix {n}"
        );
    }
    let mut longer = body.clone();
    longer.push(0);
    assert!(decode(&mut Cursor { rest: &longer }, 3).is_none());
    for i in 0..body.len() {
        for byte in [0u8, 1, 2, 0xff] {
            let mut bad = body.clone();
            bad[i] = byte;
            // Anything may come out, but never a panic or a read out of bounds.
            let _ = decode(&mut Cursor { rest: &bad }, 3);
        }
    }
}
