//! One address cannot hold every connection: the per-address cap, what `/metrics`
//! says of it, and the trusted proxies it does not hold.

use std::net::TcpStream;

use super::{connect_from, get_as, metric};
use crate::util::*;

#[test]
fn idle_connections_from_one_address_leave_room_for_others() {
    // The attack: as many idle connections as the server takes, from one place.
    // Loopback is not a trusted proxy here, so the test's addresses are held to the cap.
    let server =
        Server::start_with(&["--max-connections", "100", "--trusted-proxies", "192.0.2.1"]);
    let idle: Vec<TcpStream> = (0..100)
        .map(|_| connect_from("127.0.0.1", server.addr))
        .collect();
    // Without a setting, one address gets 64, however large --max-connections is.
    let refused = wait_for("the connections past the cap to be refused", || {
        let n = metric(
            &server,
            "127.0.0.2",
            "flagpost_connections_refused_per_address_total",
        )?;
        (n >= 36.0).then_some(n)
    });
    assert_eq!(refused, 36.0);
    // Another client is served while the 64 idle ones stay open.
    let r = get_as("127.0.0.3", server.addr, "/_liveness", "localhost", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(
        metric(&server, "127.0.0.2", "flagpost_max_connections_per_address"),
        Some(64.0)
    );
    assert_eq!(
        metric(&server, "127.0.0.2", "flagpost_max_connections"),
        Some(100.0)
    );
    let open = metric(&server, "127.0.0.2", "flagpost_connections_open").unwrap();
    assert!((65.0..=66.0).contains(&open), "{open}");
    assert_eq!(
        metric(&server, "127.0.0.2", "flagpost_connections_refused_total"),
        Some(0.0),
        "the total was never reached"
    );
    drop(idle);
    // Closed connections give their places back.
    wait_for("the idle connections' places to come back", || {
        let open = metric(&server, "127.0.0.2", "flagpost_connections_open")?;
        (open <= 1.0).then_some(())
    });
    assert_eq!(
        get_as("127.0.0.1", server.addr, "/_liveness", "localhost", &[]).status,
        200
    );
}

#[test]
fn the_cap_per_address_is_a_setting() {
    let server = Server::start_with(&[
        "--max-connections-per-address",
        "3",
        "--trusted-proxies",
        "192.0.2.1",
    ]);
    let _held: Vec<TcpStream> = (0..3)
        .map(|_| connect_from("127.0.0.4", server.addr))
        .collect();
    let mut fourth = connect_from("127.0.0.4", server.addr);
    // Closed at accept, before a byte of a request is read.
    assert!(read_response(&mut fourth).is_none());
    assert_eq!(
        metric(&server, "127.0.0.5", "flagpost_max_connections_per_address"),
        Some(3.0)
    );
    assert_eq!(
        metric(
            &server,
            "127.0.0.5",
            "flagpost_connections_refused_per_address_total"
        ),
        Some(1.0)
    );
}

#[test]
fn a_trusted_proxy_is_not_held_to_the_cap() {
    // nginx carries every client's connections: capping it would let one client spend
    // everyone's share. Only the untrusted address is held to 2.
    let server = Server::start_with(&[
        "--max-connections-per-address",
        "2",
        "--trusted-proxies",
        "127.0.0.6",
    ]);
    let _proxy: Vec<TcpStream> = (0..5)
        .map(|_| connect_from("127.0.0.6", server.addr))
        .collect();
    let _held: Vec<TcpStream> = (0..2)
        .map(|_| connect_from("127.0.0.7", server.addr))
        .collect();
    let mut third = connect_from("127.0.0.7", server.addr);
    assert!(read_response(&mut third).is_none());
    // The proxy's sixth connection is still served, with five idle ones open.
    let r = get_as("127.0.0.6", server.addr, "/_liveness", "localhost", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(
        metric(
            &server,
            "127.0.0.8",
            "flagpost_connections_refused_per_address_total"
        ),
        Some(1.0)
    );
}
