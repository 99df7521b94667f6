//! The failed-key limit (`manage::FailedAuth`), which every request carrying a personal
//! or secret key passes before its key is looked at: a known address whose key is good
//! (a token taken and given back), and a flood of new addresses, each failing once,
//! against a table already holding 60,000 addresses part-way through their burst (more
//! than the table keeps, so every new one must find a place or be turned away).

#[path = "common/mod.rs"]
mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use criterion::{criterion_group, criterion_main, Criterion};
use flagpost::manage::FailedAuth;

/// More addresses than the table keeps, so the flood meets a full table.
const HELD: u32 = 60_000;

fn v4(n: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n))
}

fn failed_auth(c: &mut Criterion) {
    let mut group = c.benchmark_group("failed_auth");
    let limit = FailedAuth::default();
    let known = v4(1);
    group.bench_function("good key, known address", |b| {
        b.iter(|| {
            limit
                .take(known)
                .expect("a good key never runs out")
                .passed()
        })
    });
    let v6: IpAddr = "2001:db8::1".parse().expect("an address");
    group.bench_function("good key, ipv6 address", |b| {
        b.iter(|| limit.take(v6).expect("a good key never runs out").passed())
    });

    let limit = FailedAuth::default();
    for n in 0..HELD {
        drop(limit.take(v4(n)));
    }
    let mut next = HELD;
    group.bench_function("failure, new address, full table", |b| {
        b.iter(|| {
            next += 1;
            drop(limit.take(v4(next)))
        })
    });
    let mut next = 0u64;
    group.bench_function("failure, new ipv6 /64, full table", |b| {
        b.iter(|| {
            next += 1;
            let ip = Ipv6Addr::from((u128::from(next) << 64) | 1);
            drop(limit.take(IpAddr::V6(ip)))
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = failed_auth
}
criterion_main!(benches);
