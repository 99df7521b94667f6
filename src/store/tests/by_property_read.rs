use serde_json::{json, Map, Value};
use sled::IVec;
use uuid::Uuid;

use super::*;
use crate::store::by_property::count;
use crate::store::first_seen;
use crate::support::lcg::Lcg;

/// A value for the sieve to judge: the text in any case, at the start, the end or the
/// middle of a string, past a value's kept start, beside an escape, across the end of
/// the text; strings that repeat (blocks all of one value); numbers and nulls.
fn value(g: &mut Lcg) -> Value {
    let words = ["ab", "AB", "aB", "x", "free", "zz", "é", "\"", "\n", "q"];
    match g.next(10) {
        0..=2 => json!(["free", "pro", "team"][g.next(3) as usize]),
        3 => json!(g.next(30)),
        4 => Value::Null,
        5 => json!(format!("{}ab", "y".repeat(60 + g.next(8) as usize))),
        _ => {
            let n = 1 + g.next(5);
            let text: String = (0..n).map(|_| words[g.next(10) as usize]).collect();
            json!(text)
        }
    }
}

/// The test the sieve must agree with, from a value's text: a cut value, or one that
/// does not parse, may pass; a string is lowercased as `icontains` folds ASCII; any
/// other value is tested on its text.
fn tested(text: &[u8], cut: bool, needle: &[u8], holds: bool) -> bool {
    if cut {
        return true;
    }
    let Ok(value) = serde_json::from_slice::<Value>(text) else {
        return true;
    };
    let folded = match value {
        Value::String(s) => s.to_ascii_lowercase().into_bytes(),
        other => other.to_string().into_bytes(),
    };
    let found = memchr::memmem::find(&folded, needle).is_some();
    match (holds, value_is_string(text)) {
        (true, _) => found,
        (false, true) => !found,
        (false, false) => true,
    }
}

fn value_is_string(text: &[u8]) -> bool {
    text.first() == Some(&b'"')
}

/// The candidates as the entries of `persons` say, without the index: those whose
/// value's kept text passes, and if `absent_passes` those without the key.
fn expected(
    persons: &[(Uuid, i64, Map<String, Value>)],
    test: impl Fn(&[u8], bool) -> bool,
    absent_passes: bool,
) -> Vec<[u8; 32]> {
    let mut out: Vec<[u8; 32]> = (persons.iter())
        .filter(|(_, _, p)| match p.get("plan") {
            Some(v) => {
                let text = serde_json::to_vec(v).unwrap();
                let kept = text.len().min(VALUE_BYTES);
                test(&text[..kept], kept < text.len())
            }
            None => absent_passes,
        })
        .map(|(id, born, _)| keys::first_seen(1, *born, *id))
        .collect();
    out.sort();
    out
}

#[test]
fn a_sieved_search_finds_what_testing_every_value_finds() {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let trees = Trees::open(&db, dir.path()).unwrap();
    // Parts of a few hundred entries, so the key's entries cross parts and blocks.
    trees.by_property.set_part_bytes(16 << 10);
    let mut g = Lcg(5);
    let mut persons = Vec::new();
    let write = |persons: &[(Uuid, i64, Map<String, Value>)]| {
        let mut seen = Vec::new();
        for (id, born, _) in persons {
            let key = keys::first_seen(1, *born, *id);
            seen.push((IVec::from(&key[..]), IVec::from(first_seen::PRESENT)));
        }
        let changed = (persons.iter()).map(|(id, born, p)| (1, *id, None, Some((*born, p))));
        count::write_changes(&trees, changed);
        trees.first_seen.write(seen).unwrap();
    };
    let made = |g: &mut Lcg, i: u128| {
        let mut p = Map::new();
        if g.next(8) > 0 {
            p.insert("plan".to_owned(), value(g));
        }
        // Another key, beside it in the blocks, that holds the needle.
        p.insert("plam".to_owned(), json!("ab"));
        (Uuid::from_u128(i * 7919), g.next(1_000) as i64, p)
    };
    for i in 0..3_000 {
        persons.push(made(&mut g, i));
    }
    write(&persons);
    trees.by_property.fold().unwrap();
    trees.first_seen.fold().unwrap();
    // Some in the delta, over the runs.
    let recent: Vec<_> = (3_000..3_300).map(|i| made(&mut g, i)).collect();
    write(&recent);
    persons.extend(recent);
    let cases: [(&[u8], bool); 6] = [
        (b"ab", true),
        (b"x\"", true),
        (b"yab", true),
        (b"ab", false),
        (b"x\"", false),
        (b"1", false),
    ];
    for (needle, holds) in cases {
        let test = |text: &[u8], cut: bool| tested(text, cut, needle, holds);
        let sieve = if holds {
            Sieve::Holds(needle)
        } else {
            Sieve::Lacks(needle)
        };
        let absent_passes = !holds;
        let got = candidates(&trees, 1, "plan", None, absent_passes, Some(sieve), test);
        let got = got.unwrap().unwrap();
        let want = expected(&persons, test, absent_passes);
        let ctx = format!("{} {}", String::from_utf8_lossy(needle), holds);
        assert_eq!(got, want, "{ctx}");
        // From a cursor: only those after it.
        let after = want[want.len() / 2];
        let rest = candidates(
            &trees,
            1,
            "plan",
            Some(&after),
            absent_passes,
            Some(sieve),
            test,
        );
        assert_eq!(
            rest.unwrap().unwrap(),
            want[want.len() / 2 + 1..],
            "{ctx} after"
        );
    }
    // A key every person has, every value holding "ab": no one lacks it, and a block
    // of values all holding the text a test needs them to lack is passed over.
    let mut everyone: Vec<_> = (persons.iter())
        .map(|(id, born, _)| keys::first_seen(1, *born, *id))
        .collect();
    everyone.sort();
    for (needle, want) in [(&b"b"[..], Vec::new()), (b"z", everyone)] {
        let test = |text: &[u8], cut: bool| tested(text, cut, needle, false);
        let got = candidates(
            &trees,
            1,
            "plam",
            None,
            true,
            Some(Sieve::Lacks(needle)),
            test,
        );
        assert_eq!(got.unwrap().unwrap(), want);
    }
    // Blocks all of one value: a value no one has, one a third of them have.
    for plan in ["\"nobody\"", "\"free\""] {
        let test = |text: &[u8], _: bool| text == plan.as_bytes();
        let got = candidates(&trees, 1, "plan", None, false, None, test);
        let got = got.unwrap().unwrap();
        assert_eq!(got, expected(&persons, test, false), "{plan}");
    }
}
