//! Abuse of the connection itself: slow heads and bodies, too many or too large
//! headers, thousands of idle connections against the connection limit.

use std::io::Read;
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::*;

#[test]
fn slowloris_on_headers() {
    let s = Server::start_with(&["--header-read-timeout-ms", "500"]);
    let started = Instant::now();
    let mut slow = open(s.addr, "POST /capture/ HTTP/1.1\r\nHost: x\r\n");
    let stop = trickle(&slow, b"X-Slow: a\r\n", Duration::from_millis(50));
    still_serving(&s);
    // Cut off without an answer: hyper closes a connection whose head is late.
    let mut buf = [0u8; 256];
    let n = slow.read(&mut buf).unwrap_or(0);
    stop.store(true, Ordering::Relaxed);
    assert_eq!(n, 0, "{:?}", String::from_utf8_lossy(&buf[..n]));
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(400) && elapsed < Duration::from_secs(3),
        "{elapsed:?}"
    );
    still_serving(&s);
}

#[test]
fn slowloris_on_the_body() {
    let s = Server::start_with(&["--body-read-timeout-ms", "500"]);
    let started = Instant::now();
    let mut slow = open(
        s.addr,
        "POST /capture/ HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n",
    );
    let stop = trickle(&slow, b"[{}, ", Duration::from_millis(50));
    still_serving(&s);
    let r = read_response(&mut slow).expect("a 408 while the body is still trickling");
    stop.store(true, Ordering::Relaxed);
    hostile(&s, r, 408, "request_timeout");
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(400) && elapsed < Duration::from_secs(3),
        "{elapsed:?}"
    );
    still_serving(&s);
}

#[test]
fn too_many_or_too_large_headers() {
    let s = Server::start();
    let many: String = (0..100).map(|i| format!("X-H{i}: v\r\n")).collect();
    let r = raw(
        s.addr,
        format!("GET /_liveness HTTP/1.1\r\nHost: x\r\n{many}\r\n").as_bytes(),
    );
    assert_eq!(r.map(|r| (r.status, r.body)), Some((431, Vec::new())));
    still_serving(&s);
    let large = format!("X-Large: {}\r\n", "a".repeat(20_000));
    let r = raw(
        s.addr,
        format!("GET /_liveness HTTP/1.1\r\nHost: x\r\n{large}\r\n").as_bytes(),
    );
    assert_eq!(r.map(|r| (r.status, r.body)), Some((431, Vec::new())));
    still_serving(&s);
    // A request line past the buffer.
    let r = raw(
        s.addr,
        format!(
            "GET /e/?data={} HTTP/1.1\r\nHost: x\r\n\r\n",
            "a".repeat(20_000)
        )
        .as_bytes(),
    );
    assert!(matches!(r.map(|r| r.status), Some(414 | 431)));
    still_serving(&s);
}

#[test]
fn thousands_of_idle_connections() {
    // The total limit, whoever holds it: one address may take all of it here.
    let s = Server::start_with(&[
        "--max-connections",
        "50",
        "--max-connections-per-address",
        "50",
        "--header-read-timeout-ms",
        "3000",
    ]);
    // In bursts the listen backlog (128) can absorb: a connect whose SYN is dropped
    // from a full accept queue waits a second before it is tried again.
    let idle: Vec<TcpStream> = (0..2000)
        .map(|i| {
            if i % 100 == 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
            TcpStream::connect(s.addr).unwrap()
        })
        .collect();
    let still_open = |streams: &[TcpStream]| {
        streams
            .iter()
            .filter(|c| {
                c.set_nonblocking(true).unwrap();
                let mut c: &TcpStream = c;
                let read = c.read(&mut [0u8; 1]);
                matches!(read, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            })
            .count()
    };
    // Past the limit, connections are closed at once.
    wait_for("connections past the limit to be closed", || {
        (still_open(&idle) <= 50).then_some(())
    });
    assert_eq!(still_open(&idle), 50);
    // While the limit is taken, a newcomer is turned away too...
    let r = raw(s.addr, b"GET /_liveness HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(r.is_none());
    // ...until the idle ones time out, and then everyone is served again.
    wait_for("idle connections to be closed", || {
        (still_open(&idle) == 0).then_some(())
    });
    still_serving(&s);
    let metrics = s.get("/metrics").text();
    let refused_line = metrics
        .lines()
        .find(|l| l.starts_with("flagpost_connections_refused"))
        .unwrap();
    // Most were refused by flagpost itself; the kernel turns some away on its own
    // when the accept queue overflows.
    let count: f64 = refused_line
        .split_whitespace()
        .last()
        .unwrap()
        .parse()
        .unwrap();
    assert!(count >= 1000.0, "{refused_line}");
}
