//! Every sled tree of a database in one file, and back. sled 0.34's own
//! `export`/`import` would do, but its `import` panics on anything unexpected; this
//! format is as plain (each tree's name, then its keys and values in order) and a
//! file cut short or out of shape is an error that says where. The event blocks'
//! tree goes out with each block's bytes, wherever the database keeps them (the block
//! files or the tree), and comes back into the new database's block files.
//!
//! ```text
//! "flagpost-backup-trees 1\n"
//! per tree:  'T' name_len u32 LE, name | per pair: 'P' key_len u32, value_len u32, key, value
//!            'E' pairs u64 LE
//! at the end: 'Z'
//! ```

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;

use crate::store::block::Files;
use crate::store::layered;
use crate::store::{EVENTS_TREE, LAYERED_TABLES};
use crate::support::hex;

const MAGIC: &[u8] = b"flagpost-backup-trees 1\n";
/// Pairs applied to sled in one batch on import.
const BATCH: usize = 10_000;

/// Write every tree of `db` (whose directory is `dir`) to `path` (synced); the pairs
/// per tree, by name. A layered table (persons, distinct ids) goes out as one tree of
/// what it holds, its runs and its delta merged (the journal's record in `meta` left
/// out), and comes back as a sled tree, moved into the journal when the restored
/// database is opened (`store::migrate`).
pub fn export(
    db: &sled::Db,
    dir: &Path,
    files: &Files,
    path: &Path,
) -> io::Result<BTreeMap<String, u64>> {
    let mut out = BufWriter::new(File::create(path)?);
    out.write_all(MAGIC)?;
    let mut counts = BTreeMap::new();
    // The tables as they read, the journal only read (the compactor is paused).
    let tables = layered::open_all(db, dir, &LAYERED_TABLES, false).map_err(io::Error::other)?;
    let sled_trees = db.tree_names().into_iter().filter(|n| !is_layered(n));
    let names: Vec<sled::IVec> = tables
        .iter()
        .map(|t| sled::IVec::from(t.name()))
        .chain(sled_trees)
        .collect();
    // The journal is not in the backup: what it holds goes out with its tables.
    let journal_key = tables.first().map(|t| t.journal().key());
    for name in names {
        let pairs_in: Box<dyn Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>> =
            match tables.iter().find(|t| t.name().as_bytes() == &name[..]) {
                Some(table) => Box::new(table.iter()),
                None => {
                    let key = journal_key.clone();
                    let tree = db.open_tree(&name).map_err(io::Error::other)?;
                    Box::new(tree.iter().filter(
                        move |kv| !matches!((kv, &key), (Ok((k, _)), Some(j)) if k[..] == j[..]),
                    ))
                }
            };
        out.write_all(b"T")?;
        write_bytes(&mut out, &name)?;
        let is_events = name == EVENTS_TREE.as_bytes();
        let mut pairs = 0u64;
        for pair in pairs_in {
            let (key, value) = pair.map_err(io::Error::other)?;
            // Blocks go out whole, whether the tree holds them or points at them.
            let value = match is_events {
                false => Cow::Borrowed(&value[..]),
                true => match files.resolve(&value) {
                    Ok(bytes) => bytes,
                    Err(e) => {
                        tracing::error!(key = %hex(&key), error = %e, "backup: an event block cannot be read and is left out (run `flagpost check`)");
                        continue;
                    }
                },
            };
            out.write_all(b"P")?;
            out.write_all(&len32(&key)?.to_le_bytes())?;
            out.write_all(&len32(&value)?.to_le_bytes())?;
            out.write_all(&key)?;
            out.write_all(&value)?;
            pairs += 1;
        }
        out.write_all(b"E")?;
        out.write_all(&pairs.to_le_bytes())?;
        counts.insert(String::from_utf8_lossy(&name).into_owned(), pairs);
    }
    out.write_all(b"Z")?;
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    Ok(counts)
}

/// Read `path` into `db` (meant to be empty); the pairs per tree, by name.
pub fn import(path: &Path, db: &sled::Db, files: &Files) -> Result<BTreeMap<String, u64>, String> {
    let file = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut input = BufReader::new(file);
    let bad = |what: &str| format!("{} is not a whole tree file: {what}", path.display());
    let mut magic = [0u8; MAGIC.len()];
    input
        .read_exact(&mut magic)
        .map_err(|_| bad("it is too short"))?;
    if magic != MAGIC {
        return Err(bad("it does not start as one"));
    }
    let mut counts = BTreeMap::new();
    let store = |e: sled::Error| format!("cannot write the new database: {e}");
    loop {
        match byte(&mut input).map_err(|_| bad("it ends before its last tree"))? {
            b'Z' => return Ok(counts),
            b'T' => {}
            other => return Err(bad(&format!("unexpected byte {other:#04x}"))),
        }
        let name = read_bytes(&mut input).map_err(|_| bad("a tree's name is cut short"))?;
        let label = String::from_utf8_lossy(&name).into_owned();
        let tree = db.open_tree(&name).map_err(store)?;
        let is_events = name == EVENTS_TREE.as_bytes();
        let blocks = |e: io::Error| format!("cannot write the event block files: {e}");
        // Blocks go to the block files; each batch's are synced before its pointers.
        let apply = |batch: sled::Batch| -> Result<(), String> {
            if is_events {
                files.sync().map_err(blocks)?;
            }
            tree.apply_batch(batch).map_err(store)
        };
        let (mut batch, mut in_batch, mut pairs) = (sled::Batch::default(), 0usize, 0u64);
        let cut = |_| bad(&format!("tree {label} is cut short"));
        loop {
            match byte(&mut input).map_err(cut)? {
                b'P' => {
                    let klen = u32_le(&mut input).map_err(cut)? as usize;
                    let vlen = u32_le(&mut input).map_err(cut)? as usize;
                    let mut key = vec![0u8; klen];
                    input.read_exact(&mut key).map_err(cut)?;
                    let mut value = vec![0u8; vlen];
                    input.read_exact(&mut value).map_err(cut)?;
                    // A value that is no block (damaged before the backup) stays as it was.
                    match is_events && crate::store::block::count(&value).is_some() {
                        true => batch.insert(key, &files.append(&value).map_err(blocks)?[..]),
                        false => batch.insert(key, value),
                    }
                    (in_batch, pairs) = (in_batch + 1, pairs + 1);
                    if in_batch == BATCH {
                        apply(std::mem::take(&mut batch))?;
                        in_batch = 0;
                    }
                }
                b'E' => {
                    let mut n = [0u8; 8];
                    input.read_exact(&mut n).map_err(cut)?;
                    if u64::from_le_bytes(n) != pairs {
                        return Err(bad(&format!(
                            "tree {label} does not hold the pairs it says"
                        )));
                    }
                    break;
                }
                other => {
                    return Err(bad(&format!(
                        "unexpected byte {other:#04x} in tree {label}"
                    )))
                }
            }
        }
        apply(batch)?;
        counts.insert(label, pairs);
    }
}

fn is_layered(name: &[u8]) -> bool {
    LAYERED_TABLES.iter().any(|t| t.as_bytes() == name)
}

fn len32(bytes: &[u8]) -> io::Result<u32> {
    u32::try_from(bytes.len()).map_err(io::Error::other)
}

fn write_bytes(out: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    out.write_all(&len32(bytes)?.to_le_bytes())?;
    out.write_all(bytes)
}

fn byte(input: &mut impl Read) -> io::Result<u8> {
    let mut b = [0u8; 1];
    input.read_exact(&mut b)?;
    Ok(b[0])
}

fn u32_le(input: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    input.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_bytes(input: &mut impl Read) -> io::Result<Vec<u8>> {
    let len = u32_le(input)? as usize;
    let mut bytes = vec![0u8; len];
    input.read_exact(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::PERSONS_TREE;

    /// A block of two events, different for each `i`.
    fn one_block(i: u32) -> Vec<u8> {
        crate::store::block::tests::value(u128::from(i) * 2, 2)
    }

    #[test]
    fn every_tree_goes_out_and_back_and_a_cut_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path().join("a")).unwrap();
        let files = Files::open(&dir.path().join("a")).unwrap();
        db.insert(b"default-key", &b"d"[..]).unwrap();
        let events = db.open_tree("event_blocks").unwrap();
        // Blocks of the earlier layout in the tree, and blocks in the files.
        let mut blocks = Vec::new();
        for i in 0..3_000u32 {
            let value = one_block(i);
            match i % 2 {
                0 => events.insert(i.to_be_bytes(), value.clone()).unwrap(),
                _ => events
                    .insert(i.to_be_bytes(), &files.append(&value).unwrap()[..])
                    .unwrap(),
            };
            blocks.push(value);
        }
        files.sync().unwrap();
        db.open_tree("empty").unwrap();
        // Persons in a run and in its delta: they go out merged, a removal left out.
        let tables = layered::open_all(&db, &dir.path().join("a"), &LAYERED_TABLES, true);
        let persons = tables.unwrap().remove(0);
        assert_eq!(persons.name(), PERSONS_TREE);
        for i in 0..100u32 {
            persons.insert(i.to_be_bytes(), &b"old"[..]).unwrap();
        }
        persons.fold().unwrap();
        persons.insert(5u32.to_be_bytes(), &b"new"[..]).unwrap();
        persons
            .insert(7u32.to_be_bytes(), crate::store::layered::TOMBSTONE)
            .unwrap();
        persons.insert(500u32.to_be_bytes(), &b"added"[..]).unwrap();
        let file = dir.path().join("trees.bin");
        let counts = export(&db, &dir.path().join("a"), &files, &file).unwrap();
        assert_eq!(counts["persons"], 100);
        assert_eq!(counts["event_blocks"], 3_000);
        assert_eq!(counts["empty"], 0);
        assert_eq!(counts["__sled__default"], 1);

        let copy = sled::open(dir.path().join("b")).unwrap();
        let copy_files = Files::open(&dir.path().join("b")).unwrap();
        assert_eq!(import(&file, &copy, &copy_files).unwrap(), counts);
        let events = copy.open_tree("event_blocks").unwrap();
        assert_eq!(events.len(), 3_000);
        // Every block comes back into the new database's files.
        for (i, want) in blocks.iter().enumerate() {
            let value = events.get((i as u32).to_be_bytes()).unwrap().unwrap();
            assert_eq!(value[0], crate::store::block::files::TAG);
            assert_eq!(copy_files.resolve(&value).unwrap().as_ref(), &want[..]);
        }
        assert_eq!(
            copy.get(b"default-key").unwrap().as_deref(),
            Some(&b"d"[..])
        );
        let persons = copy.open_tree(PERSONS_TREE).unwrap();
        assert_eq!(persons.len(), 100);
        let value = |i: u32| persons.get(i.to_be_bytes()).unwrap();
        assert_eq!(value(4).as_deref(), Some(&b"old"[..]));
        assert_eq!(value(5).as_deref(), Some(&b"new"[..]));
        assert_eq!(value(7), None);
        assert_eq!(value(500).as_deref(), Some(&b"added"[..]));

        // Cut in the middle of the events: refused, naming the tree.
        let bytes = std::fs::read(&file).unwrap();
        let cut = dir.path().join("cut.bin");
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        let fresh = sled::open(dir.path().join("c")).unwrap();
        let fresh_files = Files::open(&dir.path().join("c")).unwrap();
        let err = import(&cut, &fresh, &fresh_files).unwrap_err();
        assert!(err.ends_with("tree event_blocks is cut short"), "{err}");
    }
}
