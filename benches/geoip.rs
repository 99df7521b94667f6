//! GeoIP (`geoip::Database`) on MaxMind's City test database in `data/`: `lookup`
//! (event enrichment, every event from a public address pays it) for an IPv4 hit, an
//! IPv6 hit, an address the database does not know and a private one (skipped before
//! the database), and `decide_properties` (once per `/decide` request) for a hit.

#[path = "common/mod.rs"]
mod common;

use std::net::IpAddr;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use flagpost::geoip::Database;

/// Addresses and how many `$geoip_*` properties the test database gives each.
const LOOKUPS: &[(&str, &str, usize)] = &[
    ("ipv4 hit", "81.2.69.160", 10),
    ("ipv6 hit", "2001:218::", 7),
    ("miss", "1.1.1.1", 0),
    ("private", "192.168.1.20", 0),
];

fn open() -> Database {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/GeoIP2-City-Test.mmdb");
    Database::open(&path).expect("the test GeoIP database opens")
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an address")
}

fn geoip(c: &mut Criterion) {
    let db = open();
    for &(name, addr, properties) in LOOKUPS {
        assert_eq!(db.lookup(ip(addr)).len(), properties, "{name}");
    }
    let mut group = c.benchmark_group("geoip/lookup");
    for &(name, addr, _) in LOOKUPS {
        let addr = ip(addr);
        group.bench_with_input(BenchmarkId::from_parameter(name), &addr, |b, &addr| {
            b.iter(|| db.lookup(addr))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("geoip/decide_properties");
    let addr = ip(LOOKUPS[0].1);
    assert_eq!(db.decide_properties(addr).len(), 6);
    group.bench_function("ipv4 hit", |b| b.iter(|| db.decide_properties(addr)));
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = geoip
}
criterion_main!(benches);
