//! The outbox's entries, seqs, versions and gap, written as the compactor writes them.

use super::row_version::tiebreak;
use super::*;

fn committed(at: i64, events: u64) -> Committed {
    Committed {
        at,
        blocks: vec![vec![1, 2, 3]],
        events,
        persons: vec![(1, Uuid::from_u128(5))],
        linked: vec![(1, "d".into())],
        groups: vec![(1, 0, "acme".into())],
    }
}

fn write(outbox: &Outbox, c: &Committed) -> Option<u64> {
    outbox
        .tree()
        .transaction(|tx| Ok::<_, ConflictableTransactionError<()>>(record(tx, c)?))
        .unwrap()
}

#[test]
fn entries_in_order_until_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let outbox = Outbox::open(&db).unwrap();
    assert_eq!(
        write(&outbox, &Committed::default()),
        None,
        "nothing to send"
    );
    for i in 1..=3 {
        assert_eq!(write(&outbox, &committed(i * 10, i as u64)), Some(i as u64));
    }
    let all: Vec<Entry> = outbox.entries(None).unwrap().map(Result::unwrap).collect();
    assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(all[1].committed, committed(20, 2));
    assert_eq!(all[1].committed.rows(), 5);
    assert_eq!(outbox.oldest().unwrap(), Some(10));

    outbox.fix(1, 2).unwrap();
    assert_eq!(outbox.in_flight().unwrap(), Some((1, 2)));
    outbox.acknowledge(1, 2).unwrap();
    assert_eq!(outbox.in_flight().unwrap(), None);
    assert_eq!(outbox.checkpoint().unwrap(), 2);
    let left: Vec<u64> = outbox
        .entries(None)
        .unwrap()
        .map(|e| e.unwrap().seq)
        .collect();
    assert_eq!(left, [3]);
    // Seqs are never reused, even after entries are removed.
    assert_eq!(write(&outbox, &committed(40, 1)), Some(4));
    let node = outbox.node().unwrap();
    assert_eq!(outbox.node().unwrap(), node);
}

#[test]
fn blocks_written_while_off_are_noted_as_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let outbox = Outbox::open(&db).unwrap();
    let blocks = |ids: &[u64]| Committed {
        at: 1,
        blocks: ids
            .iter()
            .map(|id| crate::store::keys::block(1, 0, *id).to_vec())
            .collect(),
        events: 1,
        ..Committed::default()
    };
    write(&outbox, &blocks(&[4, 5]));
    write(&outbox, &blocks(&[6]));
    write(&outbox, &committed(1, 0));
    assert_eq!(outbox.gap().unwrap(), None, "contiguous");
    write(&outbox, &blocks(&[10, 11]));
    assert_eq!(outbox.gap().unwrap(), Some((7, 10)));
    write(&outbox, &blocks(&[15]));
    assert_eq!(outbox.gap().unwrap(), Some((7, 15)), "widened");
    outbox.take_gap(b"progress").unwrap();
    assert_eq!(outbox.gap().unwrap(), None);
    assert_eq!(outbox.backfill().unwrap().unwrap().as_ref(), b"progress");
}

#[test]
fn entries_carry_their_version_and_old_ones_their_seq() {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let outbox = Outbox::open(&db).unwrap();
    // An entry of the first format, written before versions came from the clock.
    let old = committed(5, 1);
    let mut bytes = vec![FORMAT_1];
    bytes.extend(serde_json::to_vec(&old).unwrap());
    outbox.tree().insert(entry_key(1), bytes).unwrap();
    outbox.tree().insert(NEXT, &2u64.to_be_bytes()[..]).unwrap();
    let node = outbox.node().unwrap();
    write(&outbox, &committed(1_000, 1));
    write(&outbox, &committed(1_000, 1));
    let all: Vec<Entry> = outbox.entries(None).unwrap().map(Result::unwrap).collect();
    let first = 1_000 * VERSION_STEP + tiebreak(node);
    assert_eq!(
        all.iter().map(|e| (e.seq, e.version)).collect::<Vec<_>>(),
        [(1, 1), (2, first), (3, first + VERSION_STEP)]
    );
    assert_eq!(all[0].committed, old);
}

/// The tree as the compactor leaves it, byte for byte: databases written before keep
/// reading the same, whichever module writes it.
#[test]
fn the_stored_bytes_are_the_format() {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let outbox = Outbox::open(&db).unwrap();
    let node = Uuid::from_u128(517);
    outbox.tree().insert(NODE, node.as_bytes()).unwrap();
    let mut c = committed(1_000, 1);
    c.blocks = vec![crate::store::keys::block(1, 5, 9).to_vec()];
    assert_eq!(write(&outbox, &c), Some(1));
    let stored: Vec<(Vec<u8>, Vec<u8>)> = outbox
        .tree()
        .iter()
        .map(|kv| kv.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap())
        .collect();
    let version = 1_000 * 1024 + 517u64;
    let mut entry = vec![2];
    entry.extend(version.to_be_bytes());
    let mut json = br#"{"at":1000,"blocks":[["#.to_vec();
    let block = crate::store::keys::block(1, 5, 9).map(|b| b.to_string());
    json.extend(block.join(",").into_bytes());
    json.extend(
        br#"]],"events":1,"persons":[[1,"00000000-0000-0000-0000-000000000005"]],"linked":[[1,"d"]],"groups":[[1,0,"acme"]]}"#,
    );
    entry.extend(json);
    let mut entry_key = vec![b'e'];
    entry_key.extend(1u64.to_be_bytes());
    assert_eq!(
        stored,
        [
            (entry_key, entry),
            (b"h".to_vec(), 9u64.to_be_bytes().to_vec()),
            (b"i".to_vec(), node.as_bytes().to_vec()),
            (b"n".to_vec(), 2u64.to_be_bytes().to_vec()),
            (b"v".to_vec(), version.to_be_bytes().to_vec()),
        ]
    );
}

fn seqs(reader: &Reader) -> Vec<u64> {
    reader.entries().unwrap().map(|e| e.unwrap().seq).collect()
}

fn kept(outbox: &Outbox) -> Vec<u64> {
    outbox
        .entries(None)
        .unwrap()
        .map(|e| e.unwrap().seq)
        .collect()
}

#[test]
fn entries_go_once_every_active_reader_passed_them() {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let outbox = Outbox::open(&db).unwrap();
    // A database from before named readers: the sink alone, on its old keys.
    assert_eq!(outbox.readers().unwrap(), ["sink"]);
    for i in 1..=4 {
        write(&outbox, &committed(i * 10, 1));
    }
    outbox.acknowledge(1, 1).unwrap();
    assert_eq!(outbox.checkpoint().unwrap(), 1);
    assert_eq!(
        db.open_tree(TREE).unwrap().get(b"c").unwrap().unwrap(),
        &1u64.to_be_bytes()
    );
    assert_eq!(kept(&outbox), [2, 3, 4]);

    outbox.set_readers(&[SINK, FORWARD]).unwrap();
    let (sink, forward) = (outbox.reader(SINK), outbox.reader(FORWARD));
    assert_eq!(seqs(&sink), [2, 3, 4]);
    assert_eq!(
        seqs(&forward),
        [2, 3, 4],
        "a new reader starts at the oldest kept"
    );
    // The sink runs ahead: entries stay for the forwarder.
    outbox.acknowledge(2, 3).unwrap();
    assert_eq!(seqs(&sink), [4]);
    assert_eq!(kept(&outbox), [2, 3, 4]);
    // The forwarder passes 2: only 2 goes; passing 4 frees 3, not 4 (the sink's).
    forward.advance(2, &[], true).unwrap();
    assert_eq!(kept(&outbox), [3, 4]);
    forward.advance(4, &[], true).unwrap();
    assert_eq!(kept(&outbox), [4]);
    assert_eq!(seqs(&forward), Vec::<u64>::new());
    // Checkpoints never move back.
    forward.advance(1, &[], true).unwrap();
    assert_eq!(forward.checkpoint().unwrap(), 4);
    // State of its own, cleared with a move of its checkpoint.
    forward.put(b"p1", b"x").unwrap();
    forward.put(b"p2", b"y").unwrap();
    assert_eq!(forward.scan(b"p").unwrap().len(), 2);
    forward.advance(4, &[b"p1"], true).unwrap();
    assert_eq!(
        forward.scan(b"p").unwrap(),
        [(b"p2".to_vec(), sled::IVec::from(b"y"))]
    );

    // The sink turned off: it no longer holds entries back.
    outbox.set_readers(&[FORWARD]).unwrap();
    assert_eq!(kept(&outbox), Vec::<u64>::new());
    assert!(!outbox.sink_reads().unwrap());
}

fn block_entry(id: u64) -> Committed {
    Committed {
        at: 1,
        blocks: vec![crate::store::keys::block(1, 0, id).to_vec()],
        events: 1,
        ..Committed::default()
    }
}

#[test]
fn a_sink_off_while_the_forwarder_reads_gets_what_it_missed_as_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let outbox = Outbox::open(&db).unwrap();
    // A sink that never ran leaves nothing to resume: its first backfill sends all.
    outbox.set_readers(&[FORWARD]).unwrap();
    outbox.set_readers(&[SINK, FORWARD]).unwrap();
    assert_eq!(outbox.gap().unwrap(), None);

    outbox.set_backfill(b"{}").unwrap();
    for id in 1..=3 {
        write(&outbox, &block_entry(id));
    }
    // The sink sent block 1 and is switched off; the forwarder goes on past 3.
    outbox.acknowledge(1, 1).unwrap();
    outbox.set_readers(&[FORWARD]).unwrap();
    let forward = outbox.reader(FORWARD);
    forward.advance(3, &[], true).unwrap();
    write(&outbox, &block_entry(4));
    write(&outbox, &block_entry(5));
    forward.advance(4, &[], true).unwrap();
    assert_eq!(kept(&outbox), [5], "the sink holds nothing back while off");
    // Back: blocks 2 to 4 went while it was off; 5 it reads from the outbox.
    outbox.set_readers(&[SINK, FORWARD]).unwrap();
    assert_eq!(outbox.gap().unwrap(), Some((2, 5)));
    assert_eq!(seqs(&outbox.reader(SINK)), [5]);

    // Off and on again with nothing passed meanwhile: the gap stays as it was.
    outbox.set_readers(&[FORWARD]).unwrap();
    outbox.set_readers(&[SINK, FORWARD]).unwrap();
    assert_eq!(outbox.gap().unwrap(), Some((2, 5)));
    // Off with everything sent, then blocks written and forwarded: all of them.
    outbox.take_gap(b"{}").unwrap();
    outbox.acknowledge(5, 5).unwrap();
    outbox.set_readers(&[FORWARD]).unwrap();
    write(&outbox, &block_entry(6));
    forward.advance(6, &[], true).unwrap();
    outbox.set_readers(&[SINK, FORWARD]).unwrap();
    assert_eq!(outbox.gap().unwrap(), Some((6, 7)));
}

#[test]
fn a_reader_back_after_a_time_off_starts_again_from_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let outbox = Outbox::open(&db).unwrap();
    outbox.set_readers(&[SINK, FORWARD]).unwrap();
    for id in 1..=4 {
        write(&outbox, &block_entry(id));
    }
    let forward = outbox.reader(FORWARD);
    forward.advance(1, &[], true).unwrap();
    // A window over entries 2 to 4, partly sent.
    forward.put(b"p1", b"window 2..=4, part 1").unwrap();
    // A restart with the same readers keeps it.
    outbox.set_readers(&[SINK, FORWARD]).unwrap();
    assert_eq!(forward.scan(b"p").unwrap().len(), 1);
    // Off: the sink alone passes 2 and 3, which go.
    outbox.set_readers(&[SINK]).unwrap();
    outbox.acknowledge(2, 3).unwrap();
    assert_eq!(kept(&outbox), [4]);
    // Back: the window named entries that are gone; it starts over from 1.
    outbox.set_readers(&[SINK, FORWARD]).unwrap();
    assert!(forward.scan(b"p").unwrap().is_empty());
    assert_eq!(forward.checkpoint().unwrap(), 1);
    assert_eq!(seqs(&forward), [4]);
}
