//! The fold thread's rarer paths: a table that outruns the fold under way, the
//! deltas past their memory budget, a backup
//! holding or waiting for the compactor's gate, a fold that panics, a thread that is
//! gone, a stop during a fold. Each ends with the tables reading what was written,
//! before and after a start.

use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Mutex};

use sled::IVec;

use super::folds::events;
use super::*;
use crate::compactor::fold::hooks::Probe;
use crate::compactor::fold::Moment;
use crate::store::layered::Layered;
use crate::support::sync::Gate;

/// How long a test waits for what it waits for before it fails.
const PATIENCE: Duration = Duration::from_secs(20);

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// Keys `from..from + count` of about a KiB each written to `table` at `version`, in
/// `model` too; at a version past the first, every seventh is removed instead.
fn write(table: &Layered, model: &mut Model, from: u32, count: u32, version: u32) {
    let mut entries = Vec::new();
    for i in from..from + count {
        let key = format!("fold-thread-{i:06}").into_bytes();
        let value = match version > 1 && i % 7 == 0 {
            true => Vec::new(),
            false => format!("{i}@{version}:{}", "v".repeat(1000)).into_bytes(),
        };
        match value.is_empty() {
            true => model.remove(&key),
            false => model.insert(key.clone(), value.clone()),
        };
        entries.push((IVec::from(key), IVec::from(value)));
    }
    table.write(entries).unwrap();
}

fn contents(table: &Layered) -> Model {
    let entries = table.iter().map(|kv| kv.unwrap());
    entries.map(|(k, v)| (k.to_vec(), v.to_vec())).collect()
}

/// Each of `trees`' tables reads as its model, by iteration and by key.
fn reads(trees: &Trees, models: &[Model], what: &str) {
    for (table, model) in trees.tables().iter().zip(models) {
        assert_eq!(&contents(table), model, "{what}: {}", table.name());
        for (k, v) in model {
            let found = table.get(k).unwrap();
            assert_eq!(found.as_deref(), Some(&v[..]), "{what}: {}", table.name());
        }
    }
}

/// The tables of `f` as a start finds them.
fn reopened(f: &Fixture) -> Trees {
    Trees::open(&f.db, f._dir.path()).unwrap()
}

/// A compactor on a fresh database with no table's changes pending (a fresh database
/// records in `persons_by_property` that its counts are kept: folded here), and each
/// table's contents as its model.
fn settled() -> (Fixture, Vec<Model>) {
    settled_with(Compaction::default())
}

fn settled_with(settings: Compaction) -> (Fixture, Vec<Model>) {
    let f = fixture(settings);
    for table in f.trees.tables() {
        table.fold().unwrap();
        assert_eq!(table.pending(), 0, "{}", table.name());
    }
    let models = f.trees.tables().into_iter().map(contents).collect();
    (f, models)
}

/// What the first fold of the watched table does at its hook.
#[derive(Clone, Copy, PartialEq)]
enum First {
    /// Wait there until [`Watch::release`].
    Hold,
    Panic,
}

/// A fold as it reached its hook: the table's name, the thread's.
type Seen = (String, Option<String>);

/// The folds of some tables, as they reach the hook after the freeze.
struct Watch {
    seen: Arc<Mutex<Vec<Seen>>>,
    entered: mpsc::Receiver<()>,
    release: mpsc::Sender<()>,
}

fn watch(tables: &[&Layered], first: Option<(&Layered, First)>) -> Watch {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (entered_tx, entered) = mpsc::channel();
    let (release, released) = mpsc::channel();
    let released = Arc::new(Mutex::new(released));
    for table in tables {
        let (seen, entered_tx, released) = (seen.clone(), entered_tx.clone(), released.clone());
        let then = first.filter(|(t, _)| t.name() == table.name()).map(|f| f.1);
        let armed = AtomicBool::new(true);
        table.set_during_fold(Some(Box::new(move |t: &Layered| {
            let thread = std::thread::current().name().map(str::to_owned);
            seen.lock().unwrap().push((t.name().to_owned(), thread));
            if then.is_none() || !armed.swap(false, Ordering::SeqCst) {
                return;
            }
            let _ = entered_tx.send(());
            match then {
                Some(First::Panic) => panic!("a fold that panics"),
                _ => {
                    let _ = released.lock().unwrap().recv_timeout(PATIENCE);
                }
            }
        })));
    }
    Watch {
        seen,
        entered,
        release,
    }
}

impl Watch {
    /// The tables folded, in order.
    fn tables(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap();
        seen.iter().map(|(t, _)| t.clone()).collect()
    }

    fn threads(&self) -> Vec<Option<String>> {
        let seen = self.seen.lock().unwrap();
        seen.iter().map(|(_, thread)| thread.clone()).collect()
    }

    /// Wait for the watched fold to reach its hook.
    fn entered(&self) {
        let entered = self.entered.recv_timeout(PATIENCE);
        entered.expect("the fold never reached its hook");
    }

    fn release(&self) {
        self.release.send(()).unwrap();
    }
}

/// Wait until `done`, failing after [`PATIENCE`] with `what`.
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A compactor whose first table, written until due, is being folded, the fold held
/// at its hook; the tables' models, the folds seen, the fold thread's state.
struct Held {
    f: Fixture,
    tables: [Layered; 4],
    models: Vec<Model>,
    watch: Watch,
    probe: Probe,
}

fn held_fold() -> Held {
    let (mut f, mut models) = settled();
    let tables = f.trees.tables().map(Layered::clone);
    let x = &tables[0];
    let watch = watch(&tables.each_ref(), Some((x, First::Hold)));
    let probe = f.compactor.folds.probe();
    write(x, &mut models[0], 0, 140, 1);
    assert!(x.should_fold() && !x.outran());
    f.compactor.fold_tables(Moment::Busy);
    watch.entered();
    Held {
        f,
        tables,
        models,
        watch,
        probe,
    }
}

/// The compactor's next pass waits for the fold held at the hook (`why`), which is
/// then released.
fn waits_for_the_fold(compactor: &mut Compactor, probe: &Probe, watch: &Watch, why: &str) {
    std::thread::scope(|s| {
        let waiting = s.spawn(|| compactor.fold_tables(Moment::Busy));
        until("the compactor never waited for the fold", || {
            assert!(!waiting.is_finished(), "the compactor went on though {why}");
            probe.waits() == 1
        });
        assert!(probe.running());
        watch.release();
        waiting.join().unwrap();
    });
}

#[test]
fn a_table_that_outruns_its_fold_makes_the_compactor_wait_then_is_folded_first() {
    let Held {
        mut f,
        tables: [x, y, z, _],
        mut models,
        watch,
        probe,
    } = held_fold();
    // While it is held: more for it, and the next two tables in turn due, the
    // second past twice what makes it due.
    write(&x, &mut models[0], 100, 20, 2);
    write(&y, &mut models[1], 0, 160, 1);
    write(&z, &mut models[2], 0, 300, 1);
    write(&z, &mut models[2], 250, 100, 2);
    assert!(y.should_fold() && !y.outran() && z.outran());
    waits_for_the_fold(
        &mut f.compactor,
        &probe,
        &watch,
        "a table had outrun the fold",
    );
    // The table that outran is folded next, though the one after the held one was
    // due before it in turn; that one after.
    assert!(probe.ended_within(PATIENCE));
    assert_eq!(watch.tables(), [x.name(), z.name()]);
    assert!(!z.should_fold());
    f.compactor.fold_tables(Moment::Busy);
    assert!(probe.ended_within(PATIENCE));
    assert_eq!(watch.tables(), [x.name(), z.name(), y.name()]);
    reads(&f.trees, &models, "after the folds");
    f.compactor.fold_tables(Moment::Stop);
    assert_eq!(x.pending(), 0);
    reads(&f.trees, &models, "after the stop");
    reads(&reopened(&f), &models, "reopened");
}

#[test]
fn a_fold_due_while_a_backup_holds_or_waits_for_the_gate_starts_after_it() {
    let (mut f, mut models) = settled();
    let gate = Arc::new(Gate::default());
    f.compactor.folds.set_gate(gate.clone());
    let probe = f.compactor.folds.probe();
    let tables = f.trees.tables().map(Layered::clone);
    let x = tables[0].clone();
    let watch = watch(&tables.each_ref(), Some((&x, First::Hold)));
    write(&x, &mut models[0], 0, 140, 1);
    // A backup holds the gate: the due fold is not started, and the compactor goes on
    // without waiting for the backup.
    let backup = gate.clone().try_write_owned().unwrap();
    let compactor = &mut f.compactor;
    std::thread::scope(|s| {
        let folding = s.spawn(|| compactor.fold_tables(Moment::Busy));
        let deadline = Instant::now() + PATIENCE;
        while !folding.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let returned = folding.is_finished();
        drop(backup);
        assert!(returned, "the compactor waited for the backup");
    });
    assert!(!probe.running());
    assert!(watch.tables().is_empty());
    assert!(x.should_fold());
    // A backup waits for the gate, which a step holds, as the compactor's thread holds
    // it for each pass: the fold is not started either.
    std::thread::scope(|s| {
        let step = gate.try_read().unwrap();
        let backup = s.spawn(|| drop(gate.blocking_write()));
        until("the backup never waited", || gate.try_read().is_err());
        f.compactor.fold_tables(Moment::Busy);
        assert!(!probe.running());
        drop(step);
        backup.join().unwrap();
    });
    assert!(watch.tables().is_empty());
    // With the gate free, the fold starts and holds it: a backup then waits for the
    // fold to end, and finds its runs in place.
    f.compactor.fold_tables(Moment::Busy);
    watch.entered();
    assert!(gate.try_write().is_err());
    std::thread::scope(|s| {
        let backup = s.spawn(|| {
            let _paused = gate.blocking_write();
            x.run().map(|r| r.entries())
        });
        until("the backup never waited", || gate.try_read().is_err());
        watch.release();
        assert_eq!(backup.join().unwrap(), Some(140));
    });
    assert!(probe.ended_within(PATIENCE));
    assert_eq!(watch.tables(), [x.name()]);
    reads(&f.trees, &models, "after the fold");
    reads(&reopened(&f), &models, "reopened");
}

#[test]
fn a_fold_that_panics_is_tried_again_and_loses_nothing() {
    let mut with = fixture(Compaction::default());
    let mut without = fixture(Compaction::default());
    let probe = with.compactor.folds.probe();
    let tables = with.trees.tables().map(Layered::clone);
    let persons = tables[0].clone();
    let watch = watch(&tables.each_ref(), Some((&persons, First::Panic)));
    let both = |with: &mut Fixture, without: &mut Fixture, chunk: &[Record]| {
        for f in [with, without] {
            f.push(chunk);
            f.drain();
        }
    };
    let mut round = 0;
    while !persons.should_fold() {
        assert!(round < 50, "the persons' table never came due");
        both(&mut with, &mut without, &events(round * 500, 500, 4_000));
        round += 1;
    }
    // The first table due in turn is the persons': its fold panics.
    with.compactor.fold_tables(Moment::Busy);
    watch.entered();
    assert!(probe.ended_within(PATIENCE));
    assert_eq!(watch.tables(), [persons.name()]);
    let retry = probe.retry_at().expect("no retry after the panic");
    assert!(retry > Instant::now());
    // Not before the retry is due, though the table is.
    assert!(persons.should_fold());
    with.compactor.fold_tables(Moment::Busy);
    assert!(!probe.running());
    assert_eq!(watch.tables().len(), 1);
    // The compactor goes on; reads and a start find everything.
    both(&mut with, &mut without, &events(100_000, 30, 4_000));
    let all = |trees: &Trees| trees.tables().map(contents);
    assert_eq!(all(&with.trees), all(&without.trees));
    assert_eq!(with.state(1), without.state(1));
    assert_eq!(all(&reopened(&with)), all(&without.trees));
    // The retry folds what the panicked fold left (the tables due are folded in
    // turn, the persons' last).
    probe.retry_now();
    for _ in &tables {
        with.compactor.fold_tables(Moment::Busy);
        assert!(probe.ended_within(PATIENCE));
    }
    let folded = watch.tables();
    assert_eq!(folded.iter().filter(|t| *t == persons.name()).count(), 2);
    assert!(persons.run().is_some_and(|r| r.entries() > 0));
    assert_eq!(probe.retry_at(), None);
    assert_eq!(all(&with.trees), all(&without.trees));
    assert_eq!(with.state(1), without.state(1));
    assert_eq!(all(&reopened(&with)), all(&without.trees));
}

#[test]
fn a_fold_whose_thread_is_gone_runs_on_the_compactors() {
    let (mut f, mut models) = settled();
    let probe = f.compactor.folds.probe();
    let tables = f.trees.tables().map(Layered::clone);
    let (x, y) = (tables[0].clone(), tables[1].clone());
    let watch = watch(&tables.each_ref(), None);
    write(&x, &mut models[0], 0, 140, 1);
    f.compactor.folds.lose_thread();
    f.compactor.fold_tables(Moment::Busy);
    // Folded here, before it returned.
    let here = std::thread::current().name().map(str::to_owned);
    assert_eq!(watch.tables(), [x.name()]);
    assert_eq!(watch.threads(), [here]);
    assert!(!probe.running());
    assert_eq!(x.pending(), 0);
    assert_eq!(x.run().map(|r| r.entries()), Some(140));
    // The next fold has a thread again.
    write(&y, &mut models[1], 0, 140, 1);
    f.compactor.fold_tables(Moment::Busy);
    assert!(probe.ended_within(PATIENCE));
    assert_eq!(watch.tables(), [x.name(), y.name()]);
    let thread = watch.threads().pop().flatten();
    assert_eq!(thread.as_deref(), Some(crate::compactor::fold::THREAD));
    reads(&f.trees, &models, "after the folds");
    reads(&reopened(&f), &models, "reopened");
}

#[test]
fn a_fold_the_thread_never_runs_is_not_waited_for() {
    let (mut f, mut models) = settled();
    let probe = f.compactor.folds.probe();
    let tables = f.trees.tables().map(Layered::clone);
    let x = tables[0].clone();
    let watch = watch(&tables.each_ref(), None);
    write(&x, &mut models[0], 0, 140, 1);
    f.compactor.folds.lose_next_request();
    f.compactor.fold_tables(Moment::Busy);
    // The request is gone with the thread: no fold is under way ...
    assert!(
        probe.ended_within(PATIENCE),
        "a fold that never ran is under way"
    );
    assert!(watch.tables().is_empty());
    // ... and the stop (on a thread of its own, so a stop that waits for ever fails
    // the test) folds the table.
    let (done, stopped) = mpsc::channel();
    std::thread::spawn(move || {
        f.compactor.fold_tables(Moment::Stop);
        let _ = done.send(f);
    });
    let f = stopped
        .recv_timeout(PATIENCE)
        .expect("the stop waits for a fold that never ran");
    assert_eq!(watch.tables(), [x.name()]);
    assert_eq!(x.pending(), 0);
    reads(&f.trees, &models, "after the stop");
    reads(&reopened(&f), &models, "reopened");
}

#[test]
fn a_stop_during_a_fold_waits_for_it_then_folds_what_is_left() {
    let Held {
        mut f,
        tables,
        mut models,
        watch,
        probe,
    } = held_fold();
    let (x, y) = (&tables[0], &tables[1]);
    // Written during the fold: to the table folded, and a little to another.
    write(x, &mut models[0], 130, 30, 2);
    write(y, &mut models[1], 0, 10, 1);
    let compactor = &mut f.compactor;
    std::thread::scope(|s| {
        let stopping = std::thread::Builder::new()
            .name("stopping".into())
            .spawn_scoped(s, || compactor.fold_tables(Moment::Stop))
            .unwrap();
        until("the stop never waited for the fold", || {
            assert!(!stopping.is_finished(), "the stop went on during a fold");
            probe.waits() == 1
        });
        watch.release();
        stopping.join().unwrap();
    });
    // Then what was left, on the stopping thread.
    assert_eq!(watch.tables(), [x.name(), x.name(), y.name()]);
    let threads = watch.threads();
    let threads: Vec<_> = threads.iter().map(Option::as_deref).collect();
    let fold_thread = Some(crate::compactor::fold::THREAD);
    assert_eq!(threads, [fold_thread, Some("stopping"), Some("stopping")]);
    for t in &tables {
        assert_eq!(t.pending(), 0, "{}", t.name());
    }
    reads(&f.trees, &models, "after the stop");
    reads(&reopened(&f), &models, "reopened");
}

#[path = "fold_budget.rs"]
mod budget;
