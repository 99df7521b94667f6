use super::*;
use crate::store::block::{self, tests::value};

fn names(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = match fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    };
    out.sort();
    out
}

#[test]
fn blocks_read_back_as_written_and_count_without_reading() {
    let dir = tempfile::tempdir().unwrap();
    let files = Files::open(dir.path()).unwrap();
    // Opening creates nothing: a read-only open leaves the directory as it was.
    assert!(!dir.path().join(DIR_NAME).exists());
    let values: Vec<Vec<u8>> = (0..5).map(|i| value(i * 10, 3 + i)).collect();
    let pointers: Vec<_> = values.iter().map(|v| files.append(v).unwrap()).collect();
    files.sync().unwrap();
    assert_eq!(names(files.dir()), vec!["0000000000.blk"]);
    let mut offset = 0;
    for (i, (v, p)) in values.iter().zip(&pointers).enumerate() {
        assert_eq!(files.resolve(p).unwrap().as_ref(), &v[..]);
        assert_eq!(block::count(p), Some(3 + i as u32));
        let decoded = Pointer::decode(p).unwrap();
        assert_eq!((decoded.file, decoded.offset), (0, offset));
        assert_eq!(decoded.len as usize, v.len());
        offset += v.len() as u64;
        let block = files.decode(b"k", p).unwrap();
        assert_eq!(block.heads().len(), 3 + i);
        assert_eq!(block.heads()[0].uuid.as_u128(), i as u128 * 10);
    }
    // A block held in the tree itself (written before the files) reads as it is.
    assert!(matches!(
        files.resolve(&values[0]).unwrap(),
        Cow::Borrowed(_)
    ));
    // A pointer is no block: decoding it as one is refused.
    assert!(Block::decode(&pointers[0]).is_none());
}

#[test]
fn every_open_appends_to_a_new_file_and_reads_the_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let first = Files::open(dir.path()).unwrap();
    let a = first.append(&value(0, 4)).unwrap();
    first.sync().unwrap();
    drop(first);
    let second = Files::open(dir.path()).unwrap();
    let b = second.append(&value(100, 2)).unwrap();
    second.sync().unwrap();
    assert_eq!(Pointer::decode(&b).unwrap().file, 1);
    assert_eq!(second.decode(b"a", &a).unwrap().heads().len(), 4);
    assert_eq!(second.decode(b"b", &b).unwrap().heads().len(), 2);
    assert_eq!(
        names(second.dir()),
        vec!["0000000000.blk", "0000000001.blk"]
    );
}

#[test]
fn a_full_file_is_followed_by_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let files = Files::open(dir.path()).unwrap();
    let v = value(0, 40);
    let mut pointers: Vec<[u8; POINTER_LEN]> = Vec::new();
    while pointers.len() < 3 || Pointer::decode(&pointers[pointers.len() - 1]).unwrap().file < 2 {
        pointers.push(files.append(&v).unwrap());
    }
    files.sync().unwrap();
    for p in &pointers {
        let p = Pointer::decode(p).unwrap();
        // No file grows past the size by more than the block that reached it.
        assert!(p.offset < FILE_BYTES, "{p:?}");
    }
    for (n, len) in files.list().unwrap() {
        assert!(len < FILE_BYTES + v.len() as u64, "file {n}: {len}");
    }
    for p in &pointers {
        assert_eq!(files.resolve(p).unwrap().as_ref(), &v[..]);
    }
}

#[test]
fn damage_is_named_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let files = Files::open(dir.path()).unwrap();
    let (a, b) = (value(0, 5), value(10, 5));
    let pa = files.append(&a).unwrap();
    let pb = files.append(&b).unwrap();
    files.sync().unwrap();
    drop(files);
    let path = dir.path().join(DIR_NAME).join("0000000000.blk");
    // One byte of the first block changed: it is refused, the second still reads.
    let mut bytes = fs::read(&path).unwrap();
    bytes[20] ^= 0x40;
    fs::write(&path, &bytes).unwrap();
    let files = Files::open(dir.path()).unwrap();
    let err = files.resolve(&pa).unwrap_err().to_string();
    assert_eq!(
        err,
        "block file 0000000000.blk does not hold the block's bytes at offset 0 (damaged or cut short)"
    );
    assert!(files.decode(b"a", &pa).is_none());
    assert_eq!(files.resolve(&pb).unwrap().as_ref(), &b[..]);
    // Cut short inside the second block.
    fs::write(&path, &bytes[..a.len() + b.len() / 2]).unwrap();
    let err = files.resolve(&pb).unwrap_err().to_string();
    assert!(err.contains("damaged or cut short"), "{err}");
    // A pointer cut short, or naming an absurd length, is no pointer.
    assert!(matches!(
        files.resolve(&pb[..20]),
        Err(ReadError::BadPointer)
    ));
    let mut huge = Pointer::decode(&pb).unwrap();
    huge.len = u32::MAX;
    assert!(matches!(
        files.resolve(&huge.encode()),
        Err(ReadError::BadPointer)
    ));
    // The file gone.
    fs::remove_file(&path).unwrap();
    let fresh = Files::open(dir.path()).unwrap();
    let err = fresh.resolve(&pb).unwrap_err().to_string();
    assert_eq!(err, "block file 0000000000.blk is missing");
}

#[test]
fn only_files_no_pointer_names_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path().join("db")).unwrap();
    let tree = db.open_tree("event_blocks").unwrap();
    // Three files: 0 and 1 by earlier opens, 2 being appended to.
    for first in [0u128, 100] {
        let files = Files::open(dir.path()).unwrap();
        let p = files.append(&value(first, 3)).unwrap();
        files.sync().unwrap();
        tree.insert(first.to_be_bytes(), &p[..]).unwrap();
    }
    let files = Files::open(dir.path()).unwrap();
    let current = files.append(&value(200, 3)).unwrap();
    files.sync().unwrap();
    // A block still in the tree itself names no file.
    tree.insert(300u128.to_be_bytes(), value(300, 2)).unwrap();
    assert_eq!(files.remove_unreferenced(&tree).unwrap(), 0);
    tree.remove(0u128.to_be_bytes()).unwrap();
    tree.remove(100u128.to_be_bytes()).unwrap();
    // File 2 holds a block no pointer names yet (its transaction not committed), but
    // it is the one being appended to, so it stays; 0 and 1 go.
    assert_eq!(files.remove_unreferenced(&tree).unwrap(), 2);
    assert_eq!(names(files.dir()), vec!["0000000002.blk"]);
    assert_eq!(files.resolve(&current).unwrap().len(), value(200, 3).len());
}

#[test]
fn files_are_made_whole_and_lose_their_unused_end_when_left() {
    let dir = tempfile::tempdir().unwrap();
    let files = Files::open(dir.path()).unwrap();
    let v = value(0, 3);
    let first = files.append(&v).unwrap();
    files.sync().unwrap();
    // Made whole before use, so a sync writes no new size.
    assert_eq!(files.list().unwrap(), vec![(0, FILE_BYTES)]);
    // Appended until the next file: the one left is cut to its blocks.
    let mut last = first;
    while Pointer::decode(&last).unwrap().file == 0 {
        last = files.append(&v).unwrap();
    }
    files.sync().unwrap();
    let blocks_in_first = FILE_BYTES / v.len() as u64;
    assert_eq!(
        files.list().unwrap(),
        vec![(0, blocks_in_first * v.len() as u64), (1, FILE_BYTES)]
    );
    // A clean stop cuts the file being written.
    files.finish().unwrap();
    assert_eq!(files.list().unwrap()[1], (1, v.len() as u64));
    assert_eq!(files.resolve(&last).unwrap().as_ref(), &v[..]);
    assert_eq!(files.resolve(&first).unwrap().as_ref(), &v[..]);
}

#[test]
fn a_start_after_a_crash_cuts_a_whole_file_to_its_last_named_block() {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path().join("db")).unwrap();
    let tree = db.open_tree("event_blocks").unwrap();
    let files = Files::open(dir.path()).unwrap();
    let (a, b) = (value(0, 4), value(10, 6));
    let pa = files.append(&a).unwrap();
    // `b` was appended and synced but its transaction never committed.
    files.append(&b).unwrap();
    files.sync().unwrap();
    tree.insert(b"a", &pa[..]).unwrap();
    // A crash: neither left nor finished; a file was being made too.
    drop(files);
    let making = dir.path().join(DIR_NAME).join("0000000001.blk.new");
    fs::write(&making, b"partial").unwrap();
    let files = Files::open(dir.path()).unwrap();
    assert_eq!(files.list().unwrap(), vec![(0, FILE_BYTES)]);
    files.trim(&tree).unwrap();
    assert_eq!(files.list().unwrap(), vec![(0, a.len() as u64)]);
    assert!(!making.exists());
    assert_eq!(files.resolve(&pa).unwrap().as_ref(), &a[..]);
    // Files already cut are left alone, and need no read of the tree.
    files.trim(&tree).unwrap();
    assert_eq!(files.list().unwrap(), vec![(0, a.len() as u64)]);
}
