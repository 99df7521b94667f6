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

/// Both ways of parsing to a tape give what scanning first, then parsing, gives:
/// the depth error wins over any other.
#[test]
fn tape_depth_as_scanned() {
    let deep = |n: usize, tail: &str| format!("{}{tail}{}", "[".repeat(n), "]".repeat(n));
    let inputs = [
        deep(MAX_DEPTH, "1"),
        deep(MAX_DEPTH + 1, "1"),
        deep(MAX_DEPTH + 1, "nope"),
        deep(MAX_DEPTH, "nope"),
        deep(100_000, ""),
        format!(r#"{{"a":{}}}"#, deep(MAX_DEPTH - 1, r#"{"b":""[[[["}"#)),
        format!(r#"{{"a":{}}}"#, deep(MAX_DEPTH, r#"{"b":""[[[["}"#)),
        format!(r#"{{"a":"\"{}"#, "[".repeat(300)),
        format!(r#"[{}, "x" "y"]"#, deep(MAX_DEPTH, "")),
        r#"{"a":[{"b":[]},{"c":{}}],"d":[[[]]]}"#.to_string(),
        "[1,2".to_string(),
        String::new(),
    ];
    let mut inputs: Vec<Vec<u8>> = inputs.into_iter().map(String::into_bytes).collect();
    // Invalid UTF-8, deep and not.
    inputs.push([r#"{"a":"#.repeat(200).as_bytes(), b"\xff"].concat());
    inputs.push([r#"{"a":"#.repeat(2).as_bytes(), b"\"\xff\"}}"].concat());
    for input in inputs {
        let scanned = check_depth(&input, MAX_DEPTH).and_then(|()| {
            simd_json::to_tape(&mut input.clone())
                .map(|_| ())
                .map_err(|e| Error::InvalidJson(e.to_string()))
        });
        let shown = String::from_utf8_lossy(&input[..input.len().min(80)]).into_owned();
        for scratch_max in [0, usize::MAX] {
            let got = parse_tape_within(&mut input.clone(), scratch_max).map(|_| ());
            assert_eq!(got, scanned, "{scratch_max}: {shown}");
        }
        let got = parse_large_keeping(&mut input.clone()).map(|_| ());
        assert_eq!(got, scanned, "kept: {shown}");
    }
    let sibling = format!("[{},{}]", deep(MAX_DEPTH - 1, ""), deep(MAX_DEPTH - 1, ""));
    assert!(parse_tape(&mut sibling.into_bytes()).is_ok());
}

#[test]
fn kept_values_are_few_and_counted() {
    let kept = Kept::<Vec<u8>>::new(1000);
    for _ in 0..10 {
        kept.give(vec![0u8; 100], 100);
    }
    assert_eq!(kept.lock().len(), KEPT_EACH);
    assert_eq!(kept.bytes(), KEPT_EACH * 100);
    assert_eq!(kept.take().map(|v| v.len()), Some(100));
    assert_eq!(kept.bytes(), (KEPT_EACH - 1) * 100);
    while kept.take().is_some() {}
    assert_eq!(kept.bytes(), 0);
}

#[test]
fn a_far_larger_value_is_freed_until_it_is_the_usual() {
    let kept = Kept::<Vec<u8>>::new(100);
    for _ in 0..20 {
        kept.give(Vec::new(), 100);
    }
    while kept.take().is_some() {}
    // Four times the usual (or the floor) is kept, more is not.
    kept.give(Vec::new(), 400);
    assert_eq!(kept.bytes(), 400);
    kept.give(Vec::new(), 10_000);
    assert_eq!(kept.bytes(), 400, "a rare large value is freed");
    // A run of them becomes the usual, and they are kept again.
    let gives = (1..=16).find(|_| {
        kept.give(Vec::new(), 10_000);
        kept.bytes() > 400
    });
    assert!(gives.is_some_and(|n| n > 1), "{gives:?}");
    assert_eq!(kept.bytes(), 10_400);
}

/// Parses on many threads at once share the few kept buffers, whatever sizes the
/// bodies before them had, and give the tapes a fresh parse gives; what is kept
/// stays within its bound and its count.
#[test]
fn kept_buffers_are_shared_across_threads() {
    let body = |events: usize, seed: usize| {
        let one = format!(
            r#"{{"event":"e{seed}","properties":{{"n":{seed},"s":"a\"b","l":[1,2,{{}}]}}}}"#
        );
        format!("[{}]", vec![one; events].join(","))
    };
    std::thread::scope(|s| {
        for t in 0..8 {
            s.spawn(move || {
                for i in 0..40 {
                    // Mostly small bodies, now and then one far larger.
                    let events = if (i + t) % 13 == 0 {
                        3000
                    } else {
                        1 + (i * 7 + t) % 40
                    };
                    let text = body(events, i * 8 + t);
                    let mut reference = text.clone().into_bytes();
                    let want = simd_json::to_tape(&mut reference).unwrap().0;
                    let mut bytes = text.clone().into_bytes();
                    let parsed = parse_tape_keeping(&mut bytes).unwrap();
                    assert_eq!(parsed.tape, want);
                    assert_eq!(parsed.original.as_deref(), Some(text.as_bytes()));
                    recycle(parsed.tape);
                    recycle_original(parsed.original.unwrap());
                }
            });
        }
    });
    fn check<T>(kept: &Kept<T>, max: usize) {
        let items = kept.lock();
        assert!(items.len() <= KEPT_EACH);
        assert_eq!(kept.bytes(), items.iter().map(|(_, w)| w).sum::<usize>());
        assert!(items.iter().all(|(_, w)| *w <= max));
    }
    check(&WORKING, 2 * SCRATCH_MAX_BYTES + 96 + SCRATCH_MAX_BYTES * 4);
    check(&TAPES, SCRATCH_MAX_NODES * size_of::<Node<'static>>());
    check(&ORIGINALS, SCRATCH_MAX_BYTES);
}

#[test]
fn finds_quotes_and_backslashes() {
    for b in 0u8..=255 {
        for len in 0..20 {
            for at in 0..len {
                let mut s = vec![b'a'; len];
                s[at] = b;
                let want = (b == b'"' || b == b'\\').then_some(at);
                assert_eq!(quote_or_backslash(&s, 0), want, "{b} at {at} of {len}");
                if at > 0 {
                    assert_eq!(quote_or_backslash(&s, 1), want, "{b} at {at} of {len}");
                }
            }
        }
    }
    // Both, in either order: the first wins.
    assert_eq!(quote_or_backslash(b"abcdefgh\\ij\"", 0), Some(8));
    assert_eq!(quote_or_backslash(b"abcdefgh\"ij\\", 0), Some(8));
    assert_eq!(quote_or_backslash(b"ab", 3), None);
    assert_eq!(quote_or_backslash(b"ab", 2), None);
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
