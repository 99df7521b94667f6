//! The persons' index by property as the compactor keeps it
//! (`compactor::by_property_writes`, issue 38): the writes for one changed person of 5,
//! 20 and 40 properties (`common::person_properties`, posthog-js's), new (an entry
//! each) and changed by an event's `$set` (its page: two of them), and then the bytes
//! at rest: `PROPERTY_BENCH_PERSONS` (20,000 unless given) persons written as the
//! compactor writes them and folded into the runs, the index's run beside the persons'
//! own, at 5, 20 and 40 properties (none with `PROPERTY_BENCH_PERSONS=0`).

#[path = "common/mod.rs"]
mod common;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use flagpost::compactor::by_property_writes;
use flagpost::persons::{self, Person};
use flagpost::store::{keys, Trees};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PROJECT: u64 = 1;
const SIZES: [usize; 3] = [5, 20, 40];

/// The `n`th person with `count` properties, on its `page`th page.
fn person(n: usize, page: usize, count: usize) -> Person {
    let distinct_id = common::distinct_id(n);
    Person {
        id: persons::id_for(PROJECT, &distinct_id),
        created_at: common::NOW_MS + n as i64,
        properties: common::person_properties(n, page, count),
        distinct_ids: vec![distinct_id.clone()],
        is_identified: true,
        first_distinct_id: distinct_id,
    }
}

/// The bytes of the writes, so nothing is optimised away.
fn writes(born: Option<&[u8]>, now: &Person) -> usize {
    let mut bytes = 0;
    by_property_writes(PROJECT, now.id, born, Some(now), |k, v| {
        bytes += k.len() + v.len()
    });
    bytes
}

fn write_by_property(c: &mut Criterion) {
    let mut group = c.benchmark_group("by_property/person");
    group.throughput(Throughput::Elements(1));
    for count in SIZES {
        let was = person(7, 0, count);
        let born = serde_json::to_vec(&was).expect("serialises");
        let now = person(7, 1, count);
        group.bench_function(format!("{count} properties, new"), |b| {
            b.iter(|| writes(None, black_box(&was)))
        });
        group.bench_function(format!("{count} properties, changed"), |b| {
            b.iter(|| writes(Some(black_box(&born)), black_box(&now)))
        });
    }
    group.finish();
    at_rest();
}

/// Persons of each size written as the compactor writes them (the person, and the
/// index's entries of a new one), folded, and the runs' bytes a person printed.
fn at_rest() {
    let n: usize = std::env::var("PROPERTY_BENCH_PERSONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    for count in SIZES.into_iter().filter(|_| n > 0) {
        let (dir, db) = common::open_db("flagpost-bench-by-property-");
        let trees = Trees::open(&db, dir.path()).expect("the trees open");
        let (mut people, mut entries) = (Vec::new(), Vec::new());
        for i in 0..n {
            let p = person(i, 0, count);
            by_property_writes(PROJECT, p.id, None, Some(&p), |k, v| {
                entries.push((k.into(), v.into()))
            });
            let value = serde_json::to_vec(&p).expect("serialises");
            people.push((keys::with_uuid(PROJECT, p.id)[..].into(), value.into()));
        }
        let entries_written = entries.len();
        trees.persons.write(people).expect("written");
        trees.by_property.write(entries).expect("written");
        for table in [&trees.persons, &trees.by_property] {
            while table.delta_len() > 0 {
                table.fold().expect("folded");
            }
        }
        let a_person = |t: &flagpost::store::layered::Layered| {
            t.run().map_or(0, |r| r.file_bytes()) as f64 / n as f64
        };
        println!(
            "by_property/at rest/{count} properties: {n} persons, {entries_written} entries; \
             index run {:.1} bytes a person, persons' run {:.1}",
            a_person(&trees.by_property),
            a_person(&trees.persons),
        );
    }
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = write_by_property
}
criterion_main!(benches);
