//! The decoding rules, case by case.

use super::*;

const MAX: usize = 1 << 20;

use crate::http::inflate::tests::gzip;

fn decode(query: &str, ct: Option<&str>, ce: Option<&str>, body: &[u8]) -> Result<Vec<u8>, Error> {
    payload(&Query::parse(Some(query)), ct, ce, body, MAX)
}

// Its base64 form contains "+", which form encoding would turn into a space.
const JSON: &[u8] = br#"{"event":"~~>?"}"#;

#[test]
fn plain_and_gzip() {
    assert_eq!(decode("", None, None, JSON).unwrap(), JSON);
    // By magic bytes, whatever the hint says.
    assert_eq!(decode("", None, None, &gzip(JSON)).unwrap(), JSON);
    assert_eq!(
        decode("compression=base64", None, None, &gzip(JSON)).unwrap(),
        JSON
    );
    assert_eq!(
        decode("compression=gzip-js", Some("text/plain"), None, &gzip(JSON)).unwrap(),
        JSON
    );
    assert_eq!(decode("", None, Some("gzip"), &gzip(JSON)).unwrap(), JSON);
    // Hinted gzip that is neither gzip, JSON nor base64 of either.
    assert_eq!(
        decode("compression=gzip", None, None, b"not gzip"),
        Err(Error::Gzip)
    );
    assert_eq!(
        decode("compression=gzip", None, None, b"QUJDRA=="),
        Err(Error::Gzip)
    );
}

#[test]
fn base64_forms() {
    let b64 = BASE64.encode(JSON);
    assert!(b64.contains('+') || b64.contains('/'));
    let form = format!("data={}&compression=base64", b64.replace('+', "%2B"));
    let ct = Some("application/x-www-form-urlencoded");
    assert_eq!(decode("", ct, None, form.as_bytes()).unwrap(), JSON);
    // A '+' that form encoding turned into a space still decodes.
    let spaced = format!("data={}", b64.replace('+', " "));
    assert_eq!(decode("", ct, None, spaced.as_bytes()).unwrap(), JSON);
    // Sniffed without a hint.
    assert_eq!(decode("", None, None, b64.as_bytes()).unwrap(), JSON);
    // GET with data= in the query string.
    let q = format!("data={}", b64.replace('+', "%2B").replace('/', "%2F"));
    assert_eq!(decode(&q, None, None, b"").unwrap(), JSON);
    // Hinted base64 that is not.
    assert_eq!(
        decode("compression=b64", None, None, b"!!!!"),
        Err(Error::Base64)
    );
    // Looks like base64 but is not: the raw bytes are kept.
    assert_eq!(decode("", None, None, b"abc=abcd").unwrap(), b"abc=abcd");
}

#[test]
fn hints_in_order() {
    assert_eq!(Compression::from_hint("GZIP"), Compression::Gzip);
    assert_eq!(Compression::from_hint("lz-string"), Compression::Lz64);
    assert_eq!(Compression::from_hint("zstd"), Compression::None);
    // The query's hint wins over the header's.
    let b64 = BASE64.encode(JSON);
    assert_eq!(
        decode("compression=base64", None, Some("gzip"), b64.as_bytes()).unwrap(),
        JSON
    );
    // An unknown hint is no compression.
    assert_eq!(
        decode("compression=brotli", None, None, JSON).unwrap(),
        JSON
    );
}

#[test]
fn caps_and_empties() {
    let bomb = gzip(&vec![b'a'; MAX + 1]);
    assert!(bomb.len() < 4096);
    assert_eq!(decode("", None, None, &bomb), Err(Error::TooLarge));
    assert_eq!(
        decode("", None, None, &gzip(&vec![b' '; MAX])).map(|v| v.len()),
        Ok(MAX)
    );
    assert_eq!(decode("", None, None, b"  \n"), Err(Error::Empty));
    assert_eq!(decode("data=", None, None, b""), Err(Error::Empty));
    // Truncated gzip.
    let g = gzip(JSON);
    assert_eq!(decode("", None, None, &g[..g.len() - 6]), Err(Error::Gzip));
}

/// A hint that contradicts the body is no error when the body decodes as what it
/// is: the cases clients and proxies were seen to send.
#[test]
fn the_body_wins_over_a_contradicting_hint() {
    let form = Some("application/x-www-form-urlencoded");
    let b64 = BASE64.encode(JSON).replace('+', "%2B");
    // posthog-js's form body on a gzip-js URL.
    let body = format!("data={b64}");
    assert_eq!(
        decode("compression=gzip-js", form, None, body.as_bytes()).unwrap(),
        JSON
    );
    // The form's own hint says gzip too.
    let body = format!("data={b64}&compression=gzip-js");
    assert_eq!(decode("", form, None, body.as_bytes()).unwrap(), JSON);
    // Plain JSON with a gzip hint in the query or the header.
    assert_eq!(decode("compression=gzip", None, None, JSON).unwrap(), JSON);
    assert_eq!(decode("", None, Some("gzip"), JSON).unwrap(), JSON);
    let array = br#" [{"event":"a"}] "#;
    assert_eq!(
        decode("compression=gzip-js", None, None, array).unwrap(),
        array.trim_ascii()
    );
    // A form of plain base64 on an lz64 URL.
    let body = format!("data={b64}");
    assert_eq!(
        decode("compression=lz64", form, None, body.as_bytes()).unwrap(),
        JSON
    );
    // JSON with an lz64 or base64 hint.
    assert_eq!(decode("compression=lz64", None, None, JSON).unwrap(), JSON);
    assert_eq!(
        decode("compression=base64", None, None, JSON).unwrap(),
        JSON
    );
    // Base64 of gzip with a gzip hint.
    let packed = BASE64.encode(gzip(JSON));
    assert_eq!(
        decode("compression=gzip", None, None, packed.as_bytes()).unwrap(),
        JSON
    );
    // Real lz64 with its hint still decodes as lz64 ("a").
    assert_eq!(
        decode("compression=lz64", None, None, b"IZA=").unwrap(),
        b"a"
    );
}

#[test]
fn json_sniffing() {
    assert!(starts_as_json(br#"{"a":1}"#));
    assert!(starts_as_json(b" [1] \n"));
    assert!(!starts_as_json(b"{"));
    assert!(!starts_as_json(b"[1}"));
    assert!(!starts_as_json(b"eyJhIjoxfQ=="));
    assert!(is_json_text("{\"é\":1}".as_bytes()));
    assert!(!is_json_text(b"{\xff}"));
}

#[test]
fn small_decodes_as_the_full_one() {
    let big = vec![b'x'; 10_000];
    for (query, body) in [
        ("", gzip(JSON)),
        ("", gzip(&big)),
        ("", JSON.to_vec()),
        ("compression=gzip", JSON.to_vec()),
        ("compression=lz64", b"IZA=".to_vec()),
        ("compression=lz64", b"!!".to_vec()),
        ("", b"   ".to_vec()),
    ] {
        let body = Bytes::from(body);
        let located = Located::find(&Query::parse(Some(query)), None, None, &body);
        for max in [0, 1, 100, MAX] {
            let full = located.decode(max);
            assert_eq!(located.decode_small(MAX, max), full.clone().map(Some));
            match located.decode_small(64, max) {
                // Left to a full decode, which gives `full` (an error past 64
                // bytes of output is found there).
                Ok(None) => assert!(max > 64 && !full.is_ok_and(|v| v.len() <= 64)),
                small => assert_eq!(small, full.map(Some), "{query} {max}"),
            }
        }
    }
}

/// Found by the `decode_body` fuzzer: an lz64 payload over the cap was reported as
/// invalid lz64 (400) instead of too large (413) like gzip.
#[test]
fn lz64_over_the_cap_is_too_large() {
    // lz-string's "a".
    assert_eq!(decompress(b"IZA=", Compression::Lz64, 1), Ok(b"a".to_vec()));
    assert_eq!(
        decompress(b"IZA=", Compression::Lz64, 0),
        Err(Error::TooLarge)
    );
}

#[test]
fn what_may_expand() {
    let expands = |query: &str, ct: Option<&str>, ce: Option<&str>, body: &[u8]| {
        may_expand(&Query::parse(Some(query)), ct, ce, body)
    };
    let form = Some("application/x-www-form-urlencoded");
    assert!(expands("compression=lz64", None, None, b"IZA="));
    assert!(expands(
        "",
        form,
        None,
        b"data=IZA%3D&compression=lz-string"
    ));
    assert!(expands("", None, Some("gzip"), JSON));
    assert!(expands("", None, None, &gzip(JSON)));
    assert!(!expands("", None, None, JSON));
    assert!(!expands("compression=base64", form, None, b"data=e30%3D"));
    assert!(!expands("data=e30%3D", None, None, b""));
}

#[test]
fn query_fields() {
    let q = Query::parse(Some("_=1700000000123&beacon=1&ver=1.2&compression=lz64"));
    assert_eq!(q.sent_at_ms, Some(1_700_000_000_123));
    assert!(q.beacon);
    assert_eq!(q.compression.as_deref(), Some("lz64"));
    assert!(q.data.is_none());
}
