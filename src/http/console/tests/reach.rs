use serde_json::json;

use super::*;

/// A slot of its own per test: the kept answers are the process's.
fn slot(name: &str) -> Slot {
    Slot {
        dir: PathBuf::from(format!("/nonexistent/reach-test/{name}")),
        project: 1,
        key: "f".into(),
    }
}

fn basis(rules: u64, applied: &[u8]) -> Basis {
    Basis {
        rules,
        applied: Some(applied.to_vec()),
    }
}

fn kept_answer(look: Look) -> (Value, i64, bool, bool) {
    match look {
        Look::Kept {
            answer,
            counted_ms,
            recounting,
            start,
        } => (answer, counted_ms, recounting, start),
        Look::Count => panic!("expected a kept answer"),
    }
}

#[test]
fn a_flag_never_counted_is_counted_and_then_served_while_nothing_moved() {
    let s = slot("fresh");
    assert_eq!(look(&s, &basis(3, b"a"), 1_000), Look::Count);
    keep(s.clone(), basis(3, b"a"), json!({"reached": 7}), 1_000);
    let (answer, counted, recounting, start) = kept_answer(look(&s, &basis(3, b"a"), 500_000));
    assert_eq!(answer, json!({"reached": 7}));
    assert_eq!((counted, recounting, start), (1_000, false, false));
}

#[test]
fn rules_published_since_or_an_old_answer_are_counted_before_answering() {
    let s = slot("rules");
    keep(s.clone(), basis(3, b"a"), json!({"reached": 7}), 1_000);
    assert_eq!(look(&s, &basis(4, b"a"), 2_000), Look::Count);
    assert_eq!(look(&s, &basis(3, b"a"), 1_000 + MAX_AGE_MS), Look::Count);
    // A clock that went back is no reason to trust the answer either.
    assert_eq!(look(&s, &basis(3, b"a"), 999), Look::Count);
}

#[test]
fn changed_persons_are_recounted_once_in_the_background_after_a_while() {
    let s = slot("moved");
    keep(s.clone(), basis(3, b"a"), json!({"reached": 7}), 1_000);
    let young = kept_answer(look(&s, &basis(3, b"b"), 1_000 + RECOUNT_AFTER_MS - 1));
    assert_eq!((young.2, young.3), (false, false));
    let at = 1_000 + RECOUNT_AFTER_MS;
    let first = kept_answer(look(&s, &basis(3, b"b"), at));
    assert_eq!(
        (first.2, first.3),
        (true, true),
        "the first opening starts it"
    );
    let second = kept_answer(look(&s, &basis(3, b"c"), at + 1));
    assert_eq!((second.2, second.3), (true, false), "one count at a time");
    keep(s.clone(), basis(3, b"b"), json!({"reached": 8}), at);
    let (answer, counted, recounting, start) = kept_answer(look(&s, &basis(3, b"b"), at + 5));
    assert_eq!(answer, json!({"reached": 8}));
    assert_eq!((counted, recounting, start), (at, false, false));
}

#[test]
fn a_failed_recount_lets_the_next_opening_start_another() {
    let s = slot("failed");
    keep(s.clone(), basis(3, b"a"), json!({}), 1_000);
    let at = 1_000 + RECOUNT_AFTER_MS;
    assert!(kept_answer(look(&s, &basis(3, b"b"), at)).3);
    abandon(&s);
    assert!(kept_answer(look(&s, &basis(3, b"b"), at + 1)).3);
}

#[test]
fn an_older_count_finishing_late_does_not_replace_a_newer_one() {
    let s = slot("late");
    keep(s.clone(), basis(3, b"b"), json!({"reached": 8}), 5_000);
    keep(s.clone(), basis(3, b"a"), json!({"reached": 7}), 4_000);
    let (answer, counted, ..) = kept_answer(look(&s, &basis(3, b"b"), 6_000));
    assert_eq!((answer, counted), (json!({"reached": 8}), 5_000));
}
