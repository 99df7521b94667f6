//! The fold thread and the deltas' memory budget: which table it chooses, a fold it
//! starts though no table is due by its share, and the compactor waiting past twice it.

use super::*;
use crate::compactor::fold::{budgeted, Budgeted};
use crate::store::layered::delta::Memory;

#[test]
fn past_the_budget_the_largest_active_map_is_chosen_and_past_twice_it_the_compactor_waits() {
    let m = |active, frozen| Memory { active, frozen };
    let none = Budgeted {
        largest: None,
        past_bound: false,
    };
    assert_eq!(budgeted(&[m(30, 0), m(20, 0)], 50), none, "within it");
    assert_eq!(budgeted(&[m(1 << 40, 0)], 0), none, "no budget");
    // The frozen map counts against the budget, but only an active map can be folded.
    let past = budgeted(&[m(10, 40), m(20, 0), m(5, 0)], 50);
    assert_eq!(
        past,
        Budgeted {
            largest: Some(1),
            past_bound: false
        }
    );
    let bound = budgeted(&[m(10, 60), m(45, 0)], 50);
    assert_eq!(
        bound,
        Budgeted {
            largest: Some(1),
            past_bound: true
        }
    );
    assert_eq!(budgeted(&[m(0, 80), m(0, 0)], 50).largest, None);
}

/// The deltas' budget in these tests: about a hundred of [`write`]'s entries.
const BUDGET: u64 = 100 * 1024;

/// A settled compactor whose deltas' budget is [`BUDGET`]: the tables' models, the
/// fold thread's state, the tables.
fn with_budget() -> (Fixture, Vec<Model>, Probe, [Layered; 4]) {
    let (f, models) = settled_with(Compaction {
        delta_budget_bytes: BUDGET,
        ..Compaction::default()
    });
    let probe = f.compactor.folds.probe();
    let tables = f.trees.tables().map(Layered::clone);
    (f, models, probe, tables)
}

fn memory(tables: &[&Layered]) -> u64 {
    tables.iter().map(|t| t.delta_memory().total()).sum()
}

#[test]
fn the_deltas_past_their_budget_fold_the_largest_though_no_table_is_due() {
    let (mut f, mut models, probe, tables) = with_budget();
    let (y, z) = (&tables[1], &tables[2]);
    let watch = watch(&tables.each_ref(), None);
    write(z, &mut models[2], 0, 40, 1);
    f.compactor.fold_tables(Moment::Busy);
    assert!(memory(&[y, z]) <= BUDGET);
    assert!(!probe.running() && watch.tables().is_empty(), "within it");
    write(y, &mut models[1], 0, 60, 1);
    assert!(memory(&[y, z]) > BUDGET && memory(&[y, z]) <= 2 * BUDGET);
    assert!(z.delta_memory().active < y.delta_memory().active);
    assert!(
        !y.should_fold() && !z.should_fold(),
        "neither due by its share"
    );
    f.compactor.fold_tables(Moment::Busy);
    assert!(probe.ended_within(PATIENCE));
    assert_eq!(watch.tables(), [y.name()]);
    assert_eq!((y.pending(), y.delta_memory().total()), (0, 0));
    assert!(z.pending() > 0);
    assert_eq!(probe.waits(), 0);
    reads(&f.trees, &models, "after the fold");
    reads(&reopened(&f), &models, "reopened");
}

#[test]
fn the_deltas_past_twice_their_budget_make_the_compactor_wait_for_the_fold() {
    let (mut f, mut models, probe, tables) = with_budget();
    let (y, z) = (&tables[1], &tables[2]);
    let watch = watch(&tables.each_ref(), Some((y, First::Hold)));
    write(y, &mut models[1], 0, 100, 1);
    assert!(memory(&[y]) > BUDGET && !y.should_fold());
    f.compactor.fold_tables(Moment::Busy);
    watch.entered();
    // While it is held, its frozen map still counting: another table past the bound
    // with the frozen map, though not due by its share nor past it.
    write(z, &mut models[2], 0, 120, 1);
    assert!(y.delta_memory().frozen > 0 && memory(&[y, z]) > 2 * BUDGET);
    assert!(!z.should_fold() && !z.outran());
    let why = "the deltas were past twice their budget";
    waits_for_the_fold(&mut f.compactor, &probe, &watch, why);
    // Then the largest active map is folded.
    assert!(probe.ended_within(PATIENCE));
    assert_eq!(watch.tables(), [y.name(), z.name()]);
    assert_eq!(memory(&[y, z]), 0);
    reads(&f.trees, &models, "after the folds");
    reads(&reopened(&f), &models, "reopened");
}
