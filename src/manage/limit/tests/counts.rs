//! The limit's counts, exactly: the burst and refill of one address, tokens given back
//! and held by pending attempts, IPv6 per /128 and per /64, and the table's bound with
//! its overflow bucket under a flood of addresses.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::*;

fn v4(n: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n))
}

fn v6(net: u64, host: u64) -> IpAddr {
    IpAddr::V6(Ipv6Addr::from((u128::from(net) << 64) | u128::from(host)))
}

/// How many failures in a row `ip` is allowed at `now` before its first refusal.
fn failures_allowed(limit: &FailedAuth, ip: IpAddr, now: Instant) -> usize {
    (0..1000)
        .take_while(|_| limit.take_at(ip, now).is_ok())
        .count()
}

#[test]
fn a_burst_of_failures_then_one_try_per_refill() {
    let limit = FailedAuth::default();
    let (ip, other) = (v4(1), v4(2));
    let t0 = Instant::now();
    for _ in 0..20 {
        assert!(limit.take_at(ip, t0).is_ok());
    }
    assert_eq!(limit.take_at(ip, t0), Err(3));
    assert!(
        limit.take_at(other, t0).is_ok(),
        "other addresses are not limited"
    );
    let later = t0 + REFILL_EVERY;
    assert!(limit.take_at(ip, later).is_ok());
    assert_eq!(limit.take_at(ip, later), Err(3));
    assert!(limit.take_at(ip, later + Duration::from_secs(60)).is_ok());
}

#[test]
fn a_good_key_gives_its_token_back() {
    let limit = FailedAuth::default();
    let ip = v4(1);
    for _ in 0..100 {
        limit.take(ip).unwrap().passed();
    }
    for _ in 0..20 {
        drop(limit.take(ip).unwrap());
    }
    assert!(limit.take(ip).is_err(), "twenty failures use the burst up");
}

#[test]
fn tokens_held_by_pending_attempts_are_not_lent_twice() {
    // Twenty attempts in flight at once (their bodies not yet read) hold every
    // token: the twenty-first is refused before it is looked at.
    let limit = FailedAuth::default();
    let ip: IpAddr = "192.0.2.7".parse().unwrap();
    let pending: Vec<_> = (0..20).map(|_| limit.take(ip).unwrap()).collect();
    assert!(limit.take(ip).is_err());
    for a in pending {
        a.passed();
    }
    assert!(limit.take(ip).is_ok());
}

#[test]
fn an_ipv6_address_has_its_own_burst_and_its_64_a_looser_one() {
    let limit = FailedAuth::default();
    let t0 = Instant::now();
    // One address: its own burst of 20.
    assert_eq!(failures_allowed(&limit, v6(1, 1), t0), 20);
    // Its neighbours in the /64 are not locked out by it...
    assert_eq!(failures_allowed(&limit, v6(1, 2), t0), 20);
    assert_eq!(failures_allowed(&limit, v6(1, 3), t0), 20);
    // ...but the /64 as a whole has had its 60: a fourth address gets nothing.
    assert_eq!(failures_allowed(&limit, v6(1, 4), t0), 0);
    assert_eq!(
        limit.take_at(v6(1, 4), t0),
        Err(1),
        "a /64 token every second"
    );
    // Another /64 is someone else.
    assert_eq!(failures_allowed(&limit, v6(2, 1), t0), 20);
    // A second later the /64 has one token, which a fresh address may use.
    let t1 = t0 + REFILL_EVERY_PER_64;
    assert_eq!(failures_allowed(&limit, v6(1, 5), t1), 1);
}

#[test]
fn rotating_through_a_64_buys_three_addresses_worth() {
    let limit = FailedAuth::default();
    let t0 = Instant::now();
    // A new address for every guess: the /64's burst is all it gets.
    let allowed = (0..1000u64)
        .take_while(|&host| limit.take_at(v6(7, host), t0).is_ok())
        .count();
    assert_eq!(allowed, 60);
    // And a minute on, the /64 has earned 60 more, not 60 per address.
    let t1 = t0 + Duration::from_secs(60);
    let allowed = (1000..2000u64)
        .take_while(|&host| limit.take_at(v6(7, host), t1).is_ok())
        .count();
    assert_eq!(allowed, 60);
}

#[test]
fn a_good_ipv6_key_gives_back_both_tokens() {
    let limit = FailedAuth::default();
    for host in 0..200 {
        limit.take(v6(3, host)).unwrap().passed();
    }
    assert_eq!(failures_allowed(&limit, v6(3, 999), Instant::now()), 20);
}

#[test]
fn the_table_never_holds_more_than_its_cap() {
    let limit = FailedAuth::with_capacity(100);
    let t0 = Instant::now();
    // A flood of new addresses, each failing once.
    for n in 0..10_000 {
        let _ = limit.take_at(v4(n), t0);
    }
    assert_eq!(limit.buckets(), 100);
    // IPv6 too: /128s and /64s share the bound.
    for n in 0..10_000 {
        let _ = limit.take_at(v6(n, 1), t0);
    }
    assert_eq!(limit.buckets(), 100);
}

#[test]
fn addresses_that_do_not_fit_share_one_address_worth() {
    let limit = FailedAuth::with_capacity(100);
    let t0 = Instant::now();
    for n in 0..100 {
        assert!(limit.take_at(v4(n), t0).is_ok());
    }
    // The table is full of addresses with a failure each: the next ones share the
    // overflow bucket, 20 failures among all of them.
    let allowed = (100..10_000)
        .take_while(|&n| limit.take_at(v4(n), t0).is_ok())
        .count();
    assert_eq!(allowed, 20);
    assert_eq!(limit.take_at(v4(5000), t0), Err(3));
    // Addresses with a place of their own are not held back by the overflow.
    assert_eq!(failures_allowed(&limit, v4(7), t0), 19);
}

#[test]
fn a_flood_cannot_wash_away_a_victims_count() {
    let limit = FailedAuth::with_capacity(100);
    let t0 = Instant::now();
    let victim = v4(1_000_000);
    assert_eq!(failures_allowed(&limit, victim, t0), 20);
    // Ten times the table's size of new addresses, over the next 30 seconds.
    for n in 0..1000 {
        let at = t0 + Duration::from_millis(30 * u64::from(n));
        let _ = limit.take_at(v4(n), at);
    }
    assert_eq!(limit.buckets(), 100);
    // The victim's bucket was never forgotten: after 30 s it has earned 10 tokens,
    // not a fresh 20.
    let t1 = t0 + Duration::from_secs(30);
    assert_eq!(failures_allowed(&limit, victim, t1), 10);
}

#[test]
fn full_buckets_make_room_earliest_full_first() {
    let limit = FailedAuth::with_capacity(3);
    let t0 = Instant::now();
    // One failure each, a second apart: each is full again 3 s after its failure.
    for n in 0..3 {
        let _ = limit.take_at(v4(n), t0 + Duration::from_secs(u64::from(n)));
    }
    // At t0 + 3.5 s only the first is full again, so only it may go.
    let t = t0 + Duration::from_millis(3500);
    assert!(limit.take_at(v4(10), t).is_ok());
    assert_eq!(limit.buckets(), 3);
    // The second and third still hold their failure; the next newcomer overflows, and
    // the overflow's 20 tokens less this one remain.
    assert!(limit.take_at(v4(11), t).is_ok());
    let shared = (12..100)
        .take_while(|&n| limit.take_at(v4(n), t).is_ok())
        .count();
    assert_eq!(shared, 19);
    // The second address, still remembered, has 19 tokens plus what 2.5 s earned.
    assert_eq!(failures_allowed(&limit, v4(1), t), 19);
}
