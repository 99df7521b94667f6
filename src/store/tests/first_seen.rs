use serde_json::Map;

use super::*;

fn trees() -> (tempfile::TempDir, Trees) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let trees = Trees::open(&db, dir.path()).unwrap();
    (dir, trees)
}

fn person(project: u64, name: &str, created_at: i64) -> Person {
    Person {
        id: crate::persons::id_for(project, name),
        created_at,
        properties: Map::new(),
        distinct_ids: vec![name.to_owned()],
        is_identified: false,
        first_distinct_id: name.to_owned(),
    }
}

/// Store a person without the compactor (so without its index key).
fn store(trees: &Trees, project: u64, p: &Person) {
    let key = keys::with_uuid(project, p.id);
    let value = serde_json::to_vec(p).unwrap();
    trees.persons.insert(key, value).unwrap();
}

fn names(trees: &Trees, project: u64, after: Option<&[u8]>) -> Vec<String> {
    newest(trees, project, after)
        .map(|e| e.unwrap().1.first_distinct_id)
        .collect()
}

fn build(trees: &Trees) -> Vec<Step> {
    let build = Build::new(trees);
    let mut steps = Vec::new();
    loop {
        let step = build.step(trees).unwrap();
        steps.push(step);
        if step == Step::Done {
            return steps;
        }
    }
}

#[test]
fn a_new_database_needs_no_build_and_an_old_one_gets_one() {
    let (_dir, trees) = trees();
    assert!(ready(&trees.meta).unwrap());
    assert!(!building(&trees.meta).unwrap());
    // Persons stored before the index existed: the next open records a build.
    trees.meta.remove(MARKS.version).unwrap();
    store(&trees, 1, &person(1, "old", 5));
    prepare(&trees).unwrap();
    assert!(building(&trees.meta).unwrap());
    assert!(!ready(&trees.meta).unwrap());
    assert_eq!(names(&trees, 1, None), Vec::<String>::new());
    assert_eq!(build(&trees), [Step::Progress(99), Step::Done]);
    assert!(ready(&trees.meta).unwrap());
    assert_eq!(names(&trees, 1, None), ["old"]);
}

#[test]
fn a_build_indexes_every_project_newest_first_and_resumes() {
    let (_dir, trees) = trees();
    for i in 0..10_000i64 {
        let project = 1 + (i % 2) as u64;
        store(
            &trees,
            project,
            &person(project, &format!("u{i}"), i * 7 % 10_000),
        );
    }
    start_build(&trees).unwrap();
    let b = Build::new(&trees);
    assert_eq!(b.step(&trees).unwrap(), Step::Progress(40));
    // A restart builds a new plan; the position is in `meta`.
    let steps = build(&trees);
    assert_eq!(steps, [Step::Progress(81), Step::Progress(99), Step::Done]);
    // Read the same from the table's run.
    trees.first_seen.fold().unwrap();
    assert_eq!(trees.first_seen.run().unwrap().entries(), 10_000);
    let (one, two) = (names(&trees, 1, None), names(&trees, 2, None));
    assert_eq!((one.len(), two.len()), (5_000, 5_000));
    let times = |project| -> Vec<i64> {
        newest(&trees, project, None)
            .map(|e| e.unwrap().1.created_at)
            .collect()
    };
    let t = times(1);
    assert!(t.windows(2).all(|w| w[0] >= w[1]), "newest first");
    assert_eq!((t[0], t[4_999]), (9_998, 0));
    // Paging: from after the 100th key.
    let keys: Vec<IVec> = newest(&trees, 1, None).map(|e| e.unwrap().0).collect();
    assert_eq!(names(&trees, 1, Some(&keys[99]))[..], one[100..]);
    // A key of another project starts at this project's newest.
    assert_eq!(
        names(&trees, 1, Some(&keys::first_seen(2, 0, Uuid::nil()))),
        one
    );
}

#[test]
fn a_stale_key_shows_no_one() {
    let (_dir, trees) = trees();
    let mut p = person(1, "moved", 50);
    store(&trees, 1, &p);
    let gone = person(1, "gone", 60);
    for (t, id) in [(50, p.id), (60, gone.id)] {
        let key = keys::first_seen(1, t, id);
        trees.first_seen.insert(&key[..], PRESENT).unwrap();
    }
    // A merge gave it an older first event; the key of the old one stays behind.
    p.created_at = 10;
    store(&trees, 1, &p);
    let key = keys::first_seen(1, 10, p.id);
    trees.first_seen.insert(&key[..], PRESENT).unwrap();
    assert_eq!(names(&trees, 1, None), ["moved"]);
    assert_eq!(trees.first_seen.iter().count(), 3);
}
