//! Run files: what is written reads back, page by page and whole; damage is refused.

use super::*;

#[test]
fn a_run_reads_back_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("1.run");
    let mut w = Writer::create(&path).unwrap();
    let mut keys: Vec<Vec<u8>> = (0..5000u32)
        .map(|i| format!("user-{i:05}").into())
        .collect();
    keys.sort();
    for (i, k) in keys.iter().enumerate() {
        w.entry(k, &[i as u64, i as u64 + 3, 100_000 + i as u64])
            .unwrap();
    }
    let blocks = [
        BlockRef {
            id: 3,
            project: 1,
            newest: 1_700_000_000_000,
            oldest: 1_699_999_000_000,
        },
        BlockRef {
            id: 9,
            project: 2,
            newest: 1_600_000_000_000,
            oldest: 1_600_000_000_000,
        },
    ];
    w.finish(&blocks).unwrap();
    let run = Run::open(&path).unwrap();
    assert!(run.pages.len() > 1, "{} pages", run.pages.len());
    assert_eq!(run.blocks, blocks);
    assert_eq!(run.entries, 5000);
    assert_eq!(run.get(b"user-04321").unwrap(), vec![4321, 4324, 104_321]);
    assert_eq!(run.get(b"user-00000").unwrap(), vec![0, 3, 100_000]);
    assert!(run.get(b"user-4").unwrap().is_empty());
    assert!(run.get(b"a").unwrap().is_empty());
    assert!(run.get(b"zzz").unwrap().is_empty());
    let all: Vec<_> = run.entries().collect::<io::Result<_>>().unwrap();
    assert_eq!(all.len(), 5000);
    assert_eq!(all[17], (keys[17].clone(), vec![17, 20, 100_017]));
    assert_eq!(run.block(9), Some(blocks[1]));
    assert_eq!(run.block(4), None);
}

#[test]
fn a_damaged_run_is_refused_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("1.run");
    let mut w = Writer::create(&path).unwrap();
    w.entry(b"k", &[1]).unwrap();
    w.finish(&[BlockRef {
        id: 1,
        project: 1,
        newest: 5,
        oldest: -3,
    }])
    .unwrap();
    let mut bytes = fs::read(&path).unwrap();
    bytes[2] ^= 0xff;
    fs::write(&path, &bytes).unwrap();
    let run = Run::open(&path).unwrap();
    assert!(run.get(b"k").is_err());
    fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    assert!(Run::open(&path).is_err());
}

#[test]
fn a_runs_names_are_kept_so_a_name_read_again_reads_no_page() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("1.run");
    // 64 blocks, newest first by id; "every" in each, "third" in one in three.
    let blocks: Vec<BlockRef> = (0..64)
        .map(|i| BlockRef {
            id: i,
            project: 1,
            newest: 1_000 + i as i64,
            oldest: 990 + i as i64,
        })
        .collect();
    let every: Vec<u64> = (0..64).collect();
    let third: Vec<u64> = (0..64).step_by(3).collect();
    let mut w = Writer::create(&path).unwrap();
    w.entry(b"every", &every).unwrap();
    w.entry(b"third", &third).unwrap();
    w.finish(&blocks).unwrap();
    let run = Run::open(&path).unwrap();
    let before = run.resident_bytes();
    let places = run.named(b"third").unwrap().unwrap();
    // Read order is newest first: block 63 at place 0.
    let first: Vec<usize> = (0..4)
        .scan(0, |at, _| {
            let p = places.next_from(*at)?;
            *at = p + 1;
            Some(p)
        })
        .collect();
    assert_eq!(first, [0, 3, 6, 9]);
    assert_eq!(run.blocks[run.by_newest().order[3] as usize].id, 60);
    assert!(run.named(b"nobody").unwrap().is_none());
    assert!(run.resident_bytes() > before);
    // With the file's pages gone, the names read before still answer; another fails.
    fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    assert!(run.named(b"third").unwrap().is_some());
    assert!(run.named(b"nobody").unwrap().is_none());
    assert!(run.named(b"every").is_err());
}
