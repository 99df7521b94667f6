use super::*;

/// Block `b` of a run: `len` bytes of `fill`, an entry every 10 bytes.
fn block(fill: u8, len: usize) -> Decoded {
    Decoded {
        bytes: vec![fill; len],
        starts: (0..len as u32).step_by(10).collect(),
        cut: len % 2 == 1,
    }
}

/// What a read of a block hands back to check: its bytes, starts and cut.
fn seen(v: View<'_>) -> (Vec<u8>, Vec<usize>, bool) {
    let starts = (0..v.len()).map(|n| v.start(n)).collect();
    (v.bytes.to_vec(), starts, v.cut)
}

fn want(fill: u8, len: usize) -> (Vec<u8>, Vec<usize>, bool) {
    let d = block(fill, len);
    (
        d.bytes,
        d.starts.iter().map(|&s| s as usize).collect(),
        d.cut,
    )
}

fn read(cache: &Cache, key: Key, fill: u8, len: usize) -> (Vec<u8>, Vec<usize>, bool) {
    cache
        .read(key, || Ok::<_, ()>(block(fill, len)), seen)
        .unwrap()
}

#[test]
fn holds_what_it_loaded_within_its_budget() {
    let cache = Cache::new(SHARDS * 30_000);
    let mut loads = 0;
    for round in 0..3 {
        for b in 0..20u32 {
            let got = cache
                .read(
                    (7, b),
                    || {
                        loads += 1;
                        Ok::<_, ()>(block(b as u8, 1000))
                    },
                    seen,
                )
                .unwrap();
            assert_eq!(got, want(b as u8, 1000), "round {round}");
        }
    }
    assert_eq!(loads, 20, "a block is loaded once while it fits");
    assert_eq!(cache.counts(), (40, 20));
    assert_eq!(cache.blocks(), 20);
    // Another run's block of the same number is another block.
    assert_eq!(read(&cache, (8, 0), 99, 11), want(99, 11));
    assert_eq!(cache.blocks(), 21);
}

#[test]
fn stays_within_its_slabs_and_keeps_what_is_read_again() {
    let per_shard = 4 * 1000;
    let cache = Cache::new(SHARDS * per_shard);
    // One block read over and over among many read once, of sizes that do not divide
    // the slab, so the hand wraps at varying places and moves the busy block.
    assert_eq!(read(&cache, (1, 0), 1, 900), want(1, 900));
    for b in 1..2000u32 {
        let len = 300 + (b as usize * 37) % 700;
        assert_eq!(read(&cache, (1, b), b as u8, len), want(b as u8, len));
        let kept = read(&cache, (1, 0), 3, 900);
        assert_eq!(
            kept,
            want(1, 900),
            "the busy block is still the one loaded first"
        );
    }
    assert_eq!(cache.counts(), (1999, 2000), "the busy one was loaded once");
    let map = std::mem::size_of::<(Key, Place)>() + 1;
    for shard in &cache.shards {
        let s = shard.lock().unwrap();
        assert!(s.touched <= per_shard, "{}", s.touched);
        assert!(s.slab.len() == per_shard || s.slab.is_empty());
        // Every held block's record is whole where its place says.
        for (key, place) in &s.map {
            assert_eq!(record_key(&s.slab[place.at..]).0, *key);
        }
    }
    let slabs: usize = cache.shards.iter().map(|s| s.lock().unwrap().touched).sum();
    assert!(cache.bytes() >= slabs && cache.bytes() <= slabs + SHARDS * 64 * map);
}

#[test]
fn every_block_held_reads_back_after_many_laps() {
    let cache = Cache::new(SHARDS * 10_000);
    // Blocks read once and some read again in a pattern, across many laps of the hand.
    for b in 0..5000u32 {
        let len = 1 + (b as usize * 131) % 2500;
        assert_eq!(read(&cache, (2, b), b as u8, len), want(b as u8, len));
        if b % 3 == 0 {
            let back = b / 2;
            let len = 1 + (back as usize * 131) % 2500;
            assert_eq!(
                read(&cache, (2, back), back as u8, len),
                want(back as u8, len)
            );
        }
    }
    let (hits, misses) = cache.counts();
    assert_eq!(hits + misses, 5000 + 1667);
    assert!(hits > 0 && misses >= 5000, "{hits} {misses}");
}

#[test]
fn a_block_larger_than_its_shard_is_read_not_kept() {
    let cache = Cache::new(SHARDS * 1000);
    assert_eq!(read(&cache, (4, 0), 4, 2000), want(4, 2000));
    assert_eq!(read(&cache, (4, 0), 4, 2000), want(4, 2000));
    assert_eq!(cache.counts(), (0, 2));
    assert_eq!(cache.blocks(), 0);
}

#[test]
fn a_failed_load_is_not_kept() {
    let cache = Cache::new(SHARDS * 10_000);
    let failed = cache.read((3, 1), || Err::<Decoded, _>("damaged"), seen);
    assert_eq!(failed.err(), Some("damaged"));
    assert_eq!(cache.blocks(), 0);
    let got = cache.read((3, 1), || Ok::<_, &str>(block(5, 10)), seen);
    assert_eq!(got.unwrap(), want(5, 10));
    assert_eq!(cache.blocks(), 1);
}

#[test]
fn search_finds_as_a_slice_search_does() {
    let d = Decoded {
        bytes: Vec::new(),
        starts: vec![2, 5, 9, 14, 20],
        cut: false,
    };
    let mut record = vec![0; record_len(&d)];
    write_record(&mut record, (1, 1), &d);
    let v = view(&record);
    for probe in 0..25 {
        assert_eq!(
            v.search(|s| s.cmp(&probe)),
            d.starts.binary_search(&(probe as u32)),
            "{probe}"
        );
    }
}
