use super::*;

#[test]
fn most_common_first_then_by_name() {
    let counts = HashMap::from([("b".into(), 2), ("a".into(), 2), ("c".into(), 5)]);
    assert_eq!(most_first(counts, 2), ["c", "a"]);
}
