use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;

use super::*;
use crate::store::layered::key::KEY_INLINE;
use crate::store::layered::Writer;

pub(in crate::store::layered) fn key(i: u32) -> Vec<u8> {
    format!("k{i:08}").into_bytes()
}

/// A value of a few hundred bytes that compresses like a person's JSON.
pub(in crate::store::layered) fn value(i: u32, version: u32) -> Vec<u8> {
    format!(
        r#"{{"id":"{i}","version":{version},"properties":{{"email":"user{i}@example.com","$initial_browser":"Chrome","n":{}}}}}"#,
        i.wrapping_mul(2654435761)
    )
    .into_bytes()
}

fn write_run(path: &Path, entries: &BTreeMap<Vec<u8>, Vec<u8>>) {
    let mut w = Writer::create(path).unwrap();
    for (k, v) in entries {
        w.push(k, v).unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn a_run_reads_back_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.run");
    let entries: BTreeMap<_, _> = (0..5_000).map(|i| (key(i * 2), value(i, 1))).collect();
    write_run(&path, &entries);
    let run = Run::open(&path).unwrap();
    assert_eq!(run.entries(), 5_000);
    assert!(run.block_count() > 10, "{} blocks", run.block_count());
    // Compressed: well under the raw bytes.
    assert!(run.file_bytes() < run.raw_bytes() * 2 / 3);
    for (k, v) in &entries {
        assert_eq!(run.get(k).as_ref(), Some(v));
    }
    // Absent keys: between, before and after every key.
    for i in 0..5_000 {
        assert_eq!(run.get(&key(i * 2 + 1)), None);
    }
    assert_eq!(run.get(b"a"), None);
    assert_eq!(run.get(b"z"), None);
    assert_eq!(run.verify().unwrap(), 5_000);

    let from = key(100);
    let to = key(120);
    let got = run.scan(Bound::Excluded(&from), Bound::Included(&to), 100);
    let want: Vec<_> = entries
        .range((Bound::Excluded(from.clone()), Bound::Included(to.clone())))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(got, want);
    assert_eq!(got.len(), 10);
    let limited = run.scan(Bound::Unbounded, Bound::Unbounded, 7);
    assert_eq!(limited.len(), 7);
    assert_eq!(limited[0].0, key(0));
}

#[test]
fn blocks_whose_first_keys_are_short_or_long_read_and_scan_alike() {
    // Keys from a few bytes to past the inline bound, so both kinds of first key
    // (inline, and in the run's shared bytes) meet in the binary searches.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.run");
    let long = |i: u32| {
        let mut k = key(i);
        k.resize(8 + (i as usize * 7) % (KEY_INLINE * 3), b'~');
        k
    };
    let entries: BTreeMap<_, _> = (0..4_000).map(|i| (long(i * 2), value(i, 1))).collect();
    write_run(&path, &entries);
    let run = Run::open(&path).unwrap();
    let firsts: Vec<&[u8]> = (0..run.block_count()).map(|i| run.first_key(i)).collect();
    assert!(firsts.windows(2).all(|w| w[0] < w[1]));
    assert!(firsts.iter().any(|k| k.len() <= KEY_INLINE));
    assert!(firsts.iter().any(|k| k.len() > KEY_INLINE));
    for k in &firsts {
        assert!(entries.contains_key(*k), "a first key is a key of the run");
    }
    for (k, v) in &entries {
        assert_eq!(run.get(k).as_ref(), Some(v));
    }
    for i in 0..4_000 {
        assert_eq!(run.get(&long(i * 2 + 1)), None);
    }
    for i in (0..4_000).step_by(97) {
        let from = long(i * 2);
        let got = run.scan(Bound::Included(&from), Bound::Unbounded, 50);
        let want: Vec<_> = entries
            .range(from..)
            .take(50)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(got, want);
    }
    assert_eq!(run.verify().unwrap(), 4_000);
}

#[test]
fn keys_out_of_order_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::create(&dir.path().join("r.run")).unwrap();
    w.push(b"b", b"1").unwrap();
    assert!(w.push(b"a", b"2").is_err());
    assert!(w.push(b"b", b"2").is_err());
}

#[test]
fn a_damaged_block_reads_as_absent_and_the_others_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.run");
    let entries: BTreeMap<_, _> = (0..3_000).map(|i| (key(i), value(i, 1))).collect();
    write_run(&path, &entries);
    // Flip a byte early in the file: inside the first block.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[40] ^= 0xFF;
    std::fs::write(&path, &bytes).unwrap();
    let run = Run::open(&path).unwrap();
    assert!(!run.damage_seen());
    assert_eq!(run.get(&key(0)), None);
    assert!(run.damage_seen());
    assert_eq!(run.get(&key(2_999)), Some(value(2_999, 1)));
    let all = run.scan(Bound::Unbounded, Bound::Unbounded, 10_000);
    assert!(all.len() > 2_500 && all.len() < 3_000, "{}", all.len());
    let err = run.verify().unwrap_err().to_string();
    assert!(err.contains("r.run is damaged: block 0"), "{err}");
}

#[test]
fn a_cut_or_foreign_file_is_refused_at_open_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.run");
    let entries: BTreeMap<_, _> = (0..100).map(|i| (key(i), value(i, 1))).collect();
    write_run(&path, &entries);
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut.run");
    std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
    let err = Run::open(&cut).unwrap_err().to_string();
    assert!(err.contains("cut.run is damaged"), "{err}");
    let mut index_hit = bytes.clone();
    let at = index_hit.len() - 30;
    index_hit[at] ^= 1;
    std::fs::write(&cut, &index_hit).unwrap();
    let err = Run::open(&cut).unwrap_err().to_string();
    assert!(err.contains("damaged"), "{err}");
    std::fs::write(&cut, b"not a run at all, just some text of some length").unwrap();
    let err = Run::open(&cut).unwrap_err().to_string();
    assert!(err.contains("does not start as a run"), "{err}");
}

#[test]
fn a_cached_block_knows_where_each_whole_entry_starts() {
    let mut bytes = Vec::new();
    let mut want = Vec::new();
    for (k, v) in [(&b"a"[..], &b"1"[..]), (b"bb", b""), (b"ccc", b"333")] {
        want.push(bytes.len() as u32);
        bytes.extend_from_slice(&(k.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&(v.len() as u32).to_le_bytes());
        bytes.extend_from_slice(k);
        bytes.extend_from_slice(v);
    }
    let whole = decoded(bytes.clone());
    assert_eq!(
        (whole.starts.as_slice(), whole.cut),
        (want.as_slice(), false)
    );
    let mut at = whole.starts[2] as usize;
    assert_eq!(
        entry_at(&whole.bytes, &mut at),
        Some((&b"ccc"[..], &b"333"[..]))
    );

    // A fourth entry claiming more bytes than follow: the three before still count.
    bytes.extend_from_slice(&9u32.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.extend_from_slice(b"dd");
    let cut = decoded(bytes);
    assert_eq!((cut.starts.as_slice(), cut.cut), (want.as_slice(), true));
}

#[test]
fn a_huge_run_then_a_small_one_leaves_the_kept_buffers_under_their_bound() {
    use crate::support::reuse::START_BYTES;
    let dir = tempfile::tempdir().unwrap();
    // One value of 3 MiB that does not compress, and 200,000 keys: both buffers grow
    // past their bound.
    let mut seed = 1u64;
    let huge: Vec<u8> = (0..3 << 20)
        .map(|_| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            (seed >> 56) as u8
        })
        .collect();
    let mut big: BTreeMap<_, _> = (0..200_000).map(|i| (key(i), b"v".to_vec())).collect();
    big.insert(key(7), huge.clone());
    write_run(&dir.path().join("big.run"), &big);
    let (out, hashes) = crate::store::layered::write::kept_capacities();
    assert!(
        out <= START_BYTES && hashes <= START_BYTES / 8,
        "{out} {hashes}"
    );
    let small: BTreeMap<_, _> = (0..100).map(|i| (key(i), value(i, 2))).collect();
    write_run(&dir.path().join("small.run"), &small);
    let (out, hashes) = crate::store::layered::write::kept_capacities();
    assert_eq!((out, hashes), (START_BYTES, START_BYTES / 8));
    // Each reads back whole, the small one written in the buffer the big one left.
    for (name, entries) in [("big.run", &big), ("small.run", &small)] {
        let run = Run::open(&dir.path().join(name)).unwrap();
        assert_eq!(run.entries(), entries.len() as u64);
        for i in [0, 7, 99] {
            let got = run.get(&key(i));
            assert_eq!(got.as_ref(), entries.get(&key(i)), "{name} {i}");
        }
    }
}

#[test]
fn an_index_naming_notes_past_any_file_names_none() {
    // Where the notes start, one part, its length: arrays whose end does not fit in a
    // u64, which a damaged index may name.
    let named = |at: u64, len: u32| {
        let mut rest = at.to_le_bytes().to_vec();
        rest.extend_from_slice(&1u32.to_le_bytes());
        rest.extend_from_slice(&len.to_le_bytes());
        rest
    };
    let ends_past = Notes::stored(&named(u64::MAX - 10, u32::MAX), 1 << 30, u64::MAX);
    assert!(!ends_past.on_disk());
    let too_many = Notes::stored(&named(64, u32::MAX), usize::MAX, u64::MAX);
    assert!(!too_many.on_disk());
    // The same shape that fits is read.
    let fits = Notes::stored(&named(64, 16), 10, 64 + 20 * 10);
    assert!(fits.on_disk());
}
