//! Inputs the fuzzers found, replayed through the fuzz targets' own property checks
//! (`fuzz/src/checks.rs`), so what they once caught stays fixed without a fuzzer.
//! Each file in `tests/fixtures/fuzz/<target>/` is one input, named after the bug.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

#[path = "../../fuzz/src/checks.rs"]
mod checks;
#[path = "../../fuzz/src/lzstring.rs"]
mod lzstring;

/// The inputs kept for a target, by file name. A missing folder is an error, not an
/// empty list: a replay of nothing would pass.
fn inputs(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fuzz")
        .join(target);
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: the kept inputs cannot be read: {e}", dir.display()));
    let mut out: Vec<(String, Vec<u8>)> = entries
        .map(|e| e.expect("a directory entry").path())
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).expect("a fixture"))
        })
        .collect();
    out.sort();
    out
}

/// Run every kept input of `target` through `check`; fail naming each input that fails,
/// and when fewer than `at_least` inputs were found (the count committed today), so a
/// folder emptied or renamed does not pass by replaying nothing.
fn replay(target: &str, at_least: usize, check: impl Fn(&[u8])) {
    let inputs = inputs(target);
    assert!(
        inputs.len() >= at_least,
        "{target}: {} kept inputs, expected at least {at_least}",
        inputs.len()
    );
    let failed: Vec<String> = inputs
        .into_iter()
        .filter(|(_, bytes)| catch_unwind(AssertUnwindSafe(|| check(bytes))).is_err())
        .map(|(name, _)| name)
        .collect();
    assert!(failed.is_empty(), "{target}: {failed:?} fail again");
}

#[test]
fn decode_body_regressions() {
    replay("decode_body", 5, checks::decode_body);
}

#[test]
fn lz64_regressions() {
    replay("lz64", 2, checks::lz64);
}

#[test]
fn capture_parse_regressions() {
    replay("capture_parse", 3, checks::capture_parse);
}

#[test]
fn decide_request_regressions() {
    replay("decide_request", 2, checks::decide_request);
}

#[test]
fn flag_definitions_regressions() {
    replay("flag_definitions", 1, checks::flag_definitions);
}

/// These inputs are [`checks::PropertyCase`]s written as JSON.
#[test]
fn property_match_regressions() {
    replay("property_match", 6, |bytes| {
        let case: checks::PropertyCase = serde_json::from_slice(bytes).expect("a property case");
        checks::property_match(&case);
    });
}

/// The fuzzers' LZ-String compressor writes exactly what lz-string 1.5.0 writes, so the
/// round trips of the `lz64` target test the decoder against the real format.
#[test]
fn lz_string_compressor_matches_the_reference() {
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("../fixtures/lz64_vectors.json")).unwrap();
    let vectors = fixture["vectors"].as_array().unwrap();
    let mut compared = 0;
    for v in vectors {
        let name = v["name"].as_str().unwrap();
        // Their plain text is the decoded form, with U+FFFD for the lone surrogate.
        if name.contains("surrogate") {
            continue;
        }
        let units: Vec<u16> = v["plain"].as_str().unwrap().encode_utf16().collect();
        assert_eq!(
            lzstring::compress_to_base64(&units),
            v["compressed"].as_str().unwrap(),
            "{name}"
        );
        compared += 1;
    }
    assert_eq!(compared, vectors.len() - 2);
    // lz-string's encoding of "a\u{D800}b", which holds a lone surrogate.
    assert_eq!(
        lzstring::compress_to_base64(&[0x61, 0xD800, 0x62]),
        "IaAA2EZA"
    );
}

#[test]
fn block_regressions() {
    replay("block", 3, checks::block);
}
