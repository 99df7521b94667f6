use super::*;

fn trees() -> (tempfile::TempDir, Trees) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let trees = Trees::open_current(&db, dir.path(), true).unwrap();
    (dir, trees)
}

/// Store a person with `properties` under `distinct_id`, as the compactor would.
fn store(trees: &Trees, project: u64, distinct_id: &str, id: Uuid, properties: Value) {
    let person = crate::persons::Person {
        id,
        created_at: 0,
        properties: properties.as_object().unwrap().clone(),
        distinct_ids: vec![distinct_id.to_owned()],
        is_identified: false,
        first_distinct_id: distinct_id.to_owned(),
    };
    trees
        .persons
        .insert(
            super::super::keys::with_uuid(project, id),
            serde_json::to_vec(&person).unwrap(),
        )
        .unwrap();
    trees
        .distinct_ids
        .insert(
            super::super::keys::with_str(project, distinct_id),
            &id.as_bytes()[..],
        )
        .unwrap();
}

fn plan(cache: &PersonCache, trees: &Trees, distinct_id: &str) -> Option<Value> {
    cache
        .person(trees, 1, distinct_id)
        .unwrap()
        .map(|p| p.properties["plan"].clone())
}

#[test]
fn a_person_is_read_once_and_served_from_memory_until_forgotten() {
    let (_dir, trees) = trees();
    let cache = PersonCache::new(DEFAULT_BYTES);
    let id = Uuid::from_u128(7);
    assert_eq!(plan(&cache, &trees, "d"), None);
    // "No person" is cached too, until the compactor links the id.
    store(&trees, 1, "d", id, serde_json::json!({"plan": "free"}));
    assert_eq!(plan(&cache, &trees, "d"), None);
    cache.forget(&Changes {
        linked: vec![(1, "d".into())],
        ..Changes::default()
    });
    assert_eq!(plan(&cache, &trees, "d"), Some("free".into()));
    assert_eq!(cache.len(), (1, 1));
    // A change the compactor has not reported yet is not seen ...
    store(&trees, 1, "d", id, serde_json::json!({"plan": "pro"}));
    assert_eq!(plan(&cache, &trees, "d"), Some("free".into()));
    // ... and is, once it forgets the person.
    cache.forget(&Changes {
        persons: vec![(1, id)],
        ..Changes::default()
    });
    assert_eq!(plan(&cache, &trees, "d"), Some("pro".into()));
    // Projects are apart.
    assert_eq!(plan_in(&cache, &trees, 2, "d"), None);
}

fn plan_in(cache: &PersonCache, trees: &Trees, project: u64, d: &str) -> Option<Value> {
    cache
        .person(trees, project, d)
        .unwrap()
        .map(|p| p.properties["plan"].clone())
}

/// Store group type `kind` at `index` and, with `properties`, the group `key`.
fn store_group(trees: &Trees, kind: &str, index: u8, key: &str, properties: Option<Value>) {
    use super::super::keys;
    trees
        .group_types
        .insert(keys::group_type_by_name(1, kind), &[index][..])
        .unwrap();
    if let Some(properties) = properties {
        let group = crate::store::Group {
            group_type_index: index,
            group_key: key.to_owned(),
            properties: properties.as_object().unwrap().clone(),
            created_at: 0,
        };
        trees
            .groups
            .insert(
                keys::group(1, index, key),
                serde_json::to_vec(&group).unwrap(),
            )
            .unwrap();
    }
}

fn tier(cache: &PersonCache, trees: &Trees, kind: &str, key: &str) -> Option<Value> {
    cache
        .group(trees, 1, kind, key)
        .unwrap()
        .map(|p| p.get("tier").cloned().unwrap_or(Value::Null))
}

#[test]
fn a_group_and_its_type_are_read_once_and_served_from_memory_until_forgotten() {
    let (_dir, trees) = trees();
    let cache = PersonCache::new(DEFAULT_BYTES);
    // An unknown type is cached as unknown until the compactor names it.
    assert_eq!(tier(&cache, &trees, "org", "o1"), None);
    store_group(
        &trees,
        "org",
        2,
        "o1",
        Some(serde_json::json!({"tier": "gold"})),
    );
    assert_eq!(tier(&cache, &trees, "org", "o1"), None);
    cache.forget(&Changes {
        group_types: vec![(1, "org".into())],
        ..Changes::default()
    });
    assert_eq!(tier(&cache, &trees, "org", "o1"), Some("gold".into()));
    // A known type, an unknown group: cached as unknown until written.
    assert_eq!(tier(&cache, &trees, "org", "o2"), None);
    store_group(
        &trees,
        "org",
        2,
        "o2",
        Some(serde_json::json!({"tier": "free"})),
    );
    assert_eq!(tier(&cache, &trees, "org", "o2"), None);
    // A change the compactor has not reported is not seen; once it forgets, it is.
    store_group(
        &trees,
        "org",
        2,
        "o1",
        Some(serde_json::json!({"tier": "platinum"})),
    );
    assert_eq!(tier(&cache, &trees, "org", "o1"), Some("gold".into()));
    cache.forget(&Changes {
        groups: vec![(1, 2, "o1".into()), (1, 2, "o2".into())],
        ..Changes::default()
    });
    assert_eq!(tier(&cache, &trees, "org", "o1"), Some("platinum".into()));
    assert_eq!(tier(&cache, &trees, "org", "o2"), Some("free".into()));
    // Another type of the same key, and another project, are apart.
    assert_eq!(tier(&cache, &trees, "company", "o1"), None);
    assert_eq!(cache.group(&trees, 2, "org", "o1").unwrap(), None);
}

#[test]
fn a_fill_read_before_a_commit_is_dropped_after_its_forget() {
    let cache = PersonCache::new(DEFAULT_BYTES);
    let key = (1u64, "d".to_string());
    // A lookup notes the epoch and reads sled; the compactor then commits and forgets
    // before the lookup fills: the stale value must not be cached.
    let epoch = cache.epoch.load(Ordering::Acquire);
    cache.forget(&Changes {
        linked: vec![key.clone()],
        ..Changes::default()
    });
    cache
        .ids
        .fill(key.clone(), None, 10, || cache.unchanged_since(epoch));
    assert_eq!(cache.ids.get(&key), None, "stale fill dropped");
    // Without a commit in between, the fill is kept.
    let epoch = cache.epoch.load(Ordering::Acquire);
    cache
        .ids
        .fill(key.clone(), None, 10, || cache.unchanged_since(epoch));
    assert_eq!(cache.ids.get(&key), Some(None));
}

#[test]
fn the_maps_stay_within_their_budget() {
    let map: Sharded<u64, u64> = Sharded::new(SHARDS * 1000);
    for i in 0..10_000u64 {
        map.fill(i, i, 100, || true);
    }
    // Ten entries of 100 bytes fit in each shard's 1000.
    assert!(map.len() <= SHARDS * 10, "{}", map.len());
    assert!(map.len() >= SHARDS * 5, "{}", map.len());
    for shard in &map.shards {
        let shard = lock(shard);
        assert!(shard.bytes <= 1000);
        assert_eq!(shard.bytes, shard.map.len() * 100);
    }
    // An entry bigger than a shard is not cached at all.
    map.fill(u64::MAX, 0, 5000, || true);
    assert_eq!(map.get(&u64::MAX), None);
}
