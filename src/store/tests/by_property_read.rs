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
/// value of `plan` has a kept text that passes, and if `absent_passes` those without
/// the key.
fn expected(
    persons: &[(Uuid, i64, Map<String, Value>)],
    test: impl Fn(&[u8], bool) -> bool,
    absent_passes: bool,
) -> Vec<[u8; 32]> {
    expected_of("plan", persons, test, absent_passes)
}

/// [`expected`] of the key `key`.
fn expected_of(
    key: &str,
    persons: &[(Uuid, i64, Map<String, Value>)],
    test: impl Fn(&[u8], bool) -> bool,
    absent_passes: bool,
) -> Vec<[u8; 32]> {
    let mut out: Vec<[u8; 32]> = (persons.iter())
        .filter(|(_, _, p)| match p.get(key) {
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

/// An empty index in parts of a few hundred entries, so a key's entries cross parts
/// and blocks.
fn table() -> (tempfile::TempDir, sled::Db, Trees) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let trees = Trees::open(&db, dir.path()).unwrap();
    trees.by_property.set_part_bytes(16 << 10);
    (dir, db, trees)
}

/// Store new `persons` in the index, its counts and the first-seen index.
fn stored(trees: &Trees, persons: &[(Uuid, i64, Map<String, Value>)]) {
    let mut seen = Vec::new();
    for (id, born, _) in persons {
        let key = keys::first_seen(1, *born, *id);
        seen.push((IVec::from(&key[..]), IVec::from(first_seen::PRESENT)));
    }
    let changed = (persons.iter()).map(|(id, born, p)| (1, *id, None, Some((*born, p))));
    count::write_changes(trees, changed);
    trees.first_seen.write(seen).unwrap();
}

/// A search of `key` with a sieve (`text`, and whether values must hold it, as
/// `icontains`, or lack it, as `not_icontains`) finds what testing every value of
/// `persons` finds, and from a cursor only those after it.
fn agrees(
    trees: &Trees,
    key: &str,
    persons: &[(Uuid, i64, Map<String, Value>)],
    (text, holds): (&[u8], bool),
    absent_passes: bool,
    ctx: &str,
) {
    let test = |value: &[u8], cut: bool| tested(value, cut, text, holds);
    let sieve = match holds {
        true => Sieve::Holds(text),
        false => Sieve::Lacks(text),
    };
    let search = |after| candidates(trees, 1, key, after, absent_passes, Some(sieve), test);
    let want = expected_of(key, persons, test, absent_passes);
    assert_eq!(search(None).unwrap().unwrap(), want, "{ctx}");
    let after = want.get(want.len() / 3).copied().unwrap_or_default();
    let rest: Vec<_> = want.into_iter().filter(|w| *w > after).collect();
    assert_eq!(search(Some(&after)).unwrap().unwrap(), rest, "{ctx} after");
}

#[test]
fn a_sieved_search_finds_what_testing_every_value_finds() {
    let (_dir, _db, trees) = table();
    let mut g = Lcg(5);
    let mut persons = Vec::new();
    let write = |persons: &[(Uuid, i64, Map<String, Value>)]| stored(&trees, persons);
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
        let ctx = format!("{} {}", String::from_utf8_lossy(needle), holds);
        agrees(&trees, "plan", &persons, (needle, holds), !holds, &ctx);
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

/// An email-like value: most share their end (the domain), in either case; some have
/// an escape, are cut, or are not strings.
fn mail(g: &mut Lcg, i: u128) -> Value {
    let domain = ["acme.example", "globex.example"][g.next(2) as usize];
    match g.next(20) {
        0 => json!(format!("U{i}@{}", domain.to_ascii_uppercase())),
        1 => json!(format!("u{i}\"@{domain}")),
        2 => json!(format!("u{i}@{}.{domain}", "y".repeat(70))),
        3 => json!(i as u64),
        4 => json!(format!("u{i}@nowhere")),
        _ => json!(format!("u{i}@{domain}")),
    }
}

/// A person of the noted tests: `mail` (some escaped, cut or not strings), `some`
/// (lacking for a tenth) and `addr`, a plain email every time (in either case).
fn noted_person(g: &mut Lcg, i: u128) -> (Uuid, i64, Map<String, Value>) {
    let mut p = Map::new();
    p.insert("mail".to_owned(), mail(g, i));
    if g.next(10) > 0 {
        p.insert("some".to_owned(), mail(g, i));
    }
    let domains = [
        "acme.example",
        "globex.example",
        "ACME.EXAMPLE",
        "zeta.example",
    ];
    let domain = domains[g.next(4) as usize];
    p.insert("addr".to_owned(), json!(format!("u{}@{domain}", i % 977)));
    (Uuid::from_u128(i * 7919), g.next(1_000) as i64, p)
}

type Persons = [(Uuid, i64, Map<String, Value>)];

/// Searches of every key of [`noted_person`] for texts values hold and lack (across a
/// value's end, in either case, of one to three bytes every value holds or not), with
/// those lacking the key passing a negative test and not: each finds what testing
/// every value finds, from the start and from a cursor.
fn searches_agree(trees: &Trees, persons: &Persons, state: &str) {
    let cases: [(&[u8], bool); 19] = [
        (b"z", false),
        (b"ze", false),
        (b"eta", false),
        (b"example", false),
        (b".example", false),
        (b"acme", false),
        (b"@", false),
        (b"u", false),
        (b"le", false),
        (b"@a", false),
        (b"xam", false),
        (b"u1", true),
        (b"u2345@", true),
        (b"e\"", true),
        (b"zzz", true),
        (b"@n", true),
        (b"example\"", true),
        (b"@", true),
        (b"7@a", true),
    ];
    let keys = [
        ("mail", true),
        ("some", true),
        ("some", false),
        ("addr", true),
    ];
    for (key, absent_passes) in keys {
        for (needle, holds) in cases {
            let absent_passes = absent_passes && !holds;
            let ctx = format!("{state} {key} {} {holds}", String::from_utf8_lossy(needle));
            agrees(trees, key, persons, (needle, holds), absent_passes, &ctx);
        }
    }
}

/// Open the database in `dir` again, as a restart does.
fn restarted(dir: &std::path::Path, db: &sled::Db, trees: Trees) -> Trees {
    drop(trees);
    let trees = Trees::open(db, dir).unwrap();
    trees.by_property.set_part_bytes(16 << 10);
    trees
}

/// Change the values of every seventh person (values lost, others gained), in the
/// delta.
fn change(trees: &Trees, persons: &mut [(Uuid, i64, Map<String, Value>)], g: &mut Lcg) {
    let mut writes = Vec::new();
    for i in (0..persons.len()).step_by(7) {
        let (id, born, was) = persons[i].clone();
        let (_, _, now) = noted_person(g, i as u128 + 100_000);
        writes.push((id, born, was, now.clone()));
        persons[i].2 = now;
    }
    let changes = (writes.iter())
        .map(|(id, born, was, now)| (1, *id, Some((*born, was)), Some((*born, now))));
    count::write_changes(trees, changes);
}

/// The fold notes every block of the index it writes, in the run's file, and searches
/// of any text leave unread the blocks their notes answer: their answers stay those of
/// testing every value, for a key every person has and one some lack, with changes in
/// the delta over noted blocks, after a fold, after a restart, and with the notes of
/// every run damaged.
#[test]
fn a_search_over_noted_blocks_finds_what_testing_every_value_finds() {
    let (dir, db, mut trees) = table();
    let mut g = Lcg(11);
    let mut persons: Vec<_> = (0..3_000).map(|i| noted_person(&mut g, i)).collect();
    stored(&trees, &persons);
    trees.by_property.fold().unwrap();
    trees.first_seen.fold().unwrap();
    searches_agree(&trees, &persons, "noted by the fold");
    change(&trees, &mut persons, &mut g);
    searches_agree(&trees, &persons, "changed");
    trees.by_property.fold().unwrap();
    searches_agree(&trees, &persons, "folded");
    trees = restarted(dir.path(), &db, trees);
    searches_agree(&trees, &persons, "restarted");
    assert_eq!(trees.by_property.memory_bytes().1, {
        let runs = trees.by_property.run().unwrap();
        runs.parts()
            .iter()
            .map(|p| p.run.resident_bytes())
            .sum::<u64>()
    });
    // Every run's notes damaged, here and there: those blocks are read.
    for part in trees.by_property.run().unwrap().parts() {
        let path = part.run.path();
        let bytes = std::fs::read(path).unwrap();
        let index_at = u64::from_le_bytes(bytes[bytes.len() - 24..][..8].try_into().unwrap());
        let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        for back in [5, 300, 1_000] {
            let at = index_at.saturating_sub(back);
            let byte = [bytes[at as usize] ^ 0x5a];
            std::os::unix::fs::FileExt::write_all_at(&file, &byte, at).unwrap();
        }
    }
    searches_agree(&trees, &persons, "damaged notes");
    assert!(trees.by_property.verify().unwrap().is_err());
}

/// Runs written before the fold noted blocks (a database of an earlier build) search
/// right: noted by the searches that read them, in memory; then beside runs a fold
/// wrote with notes, and after a restart.
#[test]
fn runs_written_without_notes_search_right_beside_noted_ones() {
    let (dir, db, mut trees) = table();
    trees.by_property.note_blocks(None);
    let mut g = Lcg(17);
    let mut persons: Vec<_> = (0..3_000).map(|i| noted_person(&mut g, i)).collect();
    stored(&trees, &persons);
    trees.by_property.fold().unwrap();
    trees.first_seen.fold().unwrap();
    searches_agree(&trees, &persons, "noting");
    assert!(trees.by_property.memory_bytes().1 > 0);
    searches_agree(&trees, &persons, "noted in memory");
    trees = restarted(dir.path(), &db, trees);
    searches_agree(&trees, &persons, "restarted");
    // Only the parts changed are written again, with notes.
    let mut some = persons[..200].to_vec();
    change(&trees, &mut some, &mut g);
    persons[..200].clone_from_slice(&some);
    trees
        .by_property
        .fold_taking(crate::store::layered::Take::Due)
        .unwrap();
    searches_agree(&trees, &persons, "partly noted on disk");
    trees = restarted(dir.path(), &db, trees);
    searches_agree(&trees, &persons, "partly noted, restarted");
}
