//! JSON parsing for ingestion, with simd-json, guarded against input that would
//! overflow the stack when turned into (or dropped as) a recursive value.

use serde_json::Value;
use simd_json::Node;

use super::Error;

/// Deeper nesting than any real event has; serde_json's own default limit.
pub const MAX_DEPTH: usize = 128;

/// Parse bytes into a JSON value. The buffer is used as scratch space by simd-json.
pub fn parse_value(bytes: &mut [u8]) -> Result<Value, Error> {
    check_depth(bytes, MAX_DEPTH)?;
    simd_json::serde::from_slice::<Value>(bytes).map_err(|e| Error::InvalidJson(e.to_string()))
}

/// Parse bytes into a simd-json tape that borrows its strings from `bytes`, with the
/// same checks and errors as [`parse_value`].
pub fn parse_tape(bytes: &mut [u8]) -> Result<Vec<Node<'_>>, Error> {
    check_depth(bytes, MAX_DEPTH)?;
    simd_json::to_tape(bytes)
        .map(|tape| tape.0)
        .map_err(|e| Error::InvalidJson(e.to_string()))
}

/// Reject nesting beyond `max` with one cheap pass over the bytes (brackets inside
/// strings do not count). Building a value from 100,000 nested arrays would otherwise
/// recurse that deep. String contents, most of a payload, are skipped with memchr.
fn check_depth(bytes: &[u8], max: usize) -> Result<(), Error> {
    let mut depth = 0usize;
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'"' => {
                i += 1;
                // To the closing quote, stepping over escaped characters.
                loop {
                    match memchr::memchr2(b'"', b'\\', &bytes[i.min(bytes.len())..]) {
                        Some(j) if bytes[i + j] == b'\\' => i += j + 2,
                        Some(j) => {
                            i += j + 1;
                            break;
                        }
                        None => return Ok(()),
                    }
                }
                continue;
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return Err(Error::InvalidJson(format!(
                        "nested deeper than {max} levels"
                    )));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_limit() {
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(parse_value(&mut ok.into_bytes()).is_ok());
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let err = parse_value(&mut deep.into_bytes()).unwrap_err();
        assert_eq!(
            err,
            Error::InvalidJson("nested deeper than 128 levels".into())
        );
        // Brackets inside strings, including after escaped quotes, do not count.
        let s = format!(r#"{{"a":"\"{}"}}"#, "[".repeat(1000));
        assert!(parse_value(&mut s.into_bytes()).is_ok());
        // An escaped backslash does not escape the quote after it.
        let s = format!(r#"{{"a":"\\\\","b":"x\"{}"}}"#, "[".repeat(1000));
        assert!(parse_value(&mut s.into_bytes()).is_ok());
        // An escape at the very end of the input does not read past it.
        assert!(check_depth(b"\"\\", 1).is_ok());
        assert!(check_depth(b"\"abc", 1).is_ok());
        assert!(check_depth(b"[[", 1).is_err());
    }

    #[test]
    fn parses_and_rejects() {
        let v = parse_value(&mut br#"{"a":[1,2.5,"x",null,true]}"#.to_vec()).unwrap();
        assert_eq!(v, serde_json::json!({"a":[1,2.5,"x",null,true]}));
        assert!(matches!(
            parse_value(&mut b"{\"a\":".to_vec()),
            Err(Error::InvalidJson(_))
        ));
        assert!(matches!(
            parse_value(&mut b"\xff\xfe".to_vec()),
            Err(Error::InvalidJson(_))
        ));
        // Integers beyond 64 bits become floats instead of failing.
        let big = parse_value(&mut b"123456789012345678901234567890".to_vec()).unwrap();
        assert!(big.as_f64().unwrap() > 1e29);
    }
}
