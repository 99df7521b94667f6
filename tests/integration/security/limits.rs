//! The failed-key limit taken before any key is checked or body read.

use std::io::Write;
use std::net::TcpStream;
use std::time::Instant;

use serde_json::json;

use crate::util::*;

/// Sign-ins (or Bearer requests) sent at once from one address.
const CONCURRENT: usize = 60;
/// The limit's burst and refill, as `flagpost::manage::limit` sets them.
const BURST: usize = 20;
const REFILL_SECS: u64 = 3;

/// Tokens an address may have used by now: the burst and what came back meanwhile.
fn allowed_since(started: Instant) -> usize {
    BURST + (started.elapsed().as_secs() / REFILL_SECS) as usize + 1
}

#[test]
fn concurrent_sign_ins_with_held_back_bodies_cannot_outrun_the_limit() {
    let server = Server::start();
    let body = json!({"key": "phx_guess"}).to_string();
    let started = Instant::now();
    // Every request's headers first, each body held back until all are in.
    let mut streams: Vec<TcpStream> = (0..CONCURRENT)
        .map(|_| {
            let mut s = TcpStream::connect(server.addr).unwrap();
            s.set_read_timeout(Some(WAIT)).unwrap();
            let head = format!(
                "POST /console/api/session HTTP/1.1\r\nHost: localhost\r\nOrigin: http://localhost\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).unwrap();
            s
        })
        .collect();
    // Then every body; an answer sent before the body (429) may have closed the socket.
    for s in &mut streams {
        let _ = s.write_all(body.as_bytes());
    }
    let statuses: Vec<u16> = streams
        .iter_mut()
        .map(|s| read_response(s).expect("every sign-in is answered").status)
        .collect();
    let checked = statuses.iter().filter(|&&s| s == 401).count();
    let refused = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!(checked + refused, CONCURRENT, "{statuses:?}");
    assert!(
        checked <= allowed_since(started),
        "{checked} keys checked of {CONCURRENT} sent at once: {statuses:?}"
    );
    assert!(checked >= BURST, "the burst is honoured: {statuses:?}");
    // A second wave a refill later gets one more try, not another burst.
    std::thread::sleep(std::time::Duration::from_secs(REFILL_SECS));
    let second = Instant::now();
    let handles: Vec<_> = (0..CONCURRENT)
        .map(|_| {
            let addr = server.addr;
            let body = body.clone();
            std::thread::spawn(move || {
                let req = Req::post("/console/api/session", body)
                    .header("Content-Type", "application/json")
                    .header("Origin", "http://localhost");
                send(addr, req).status
            })
        })
        .collect();
    let statuses: Vec<u16> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let checked = statuses.iter().filter(|&&s| s == 401).count();
    let earned = allowed_since(started) - BURST;
    assert!(
        checked <= earned,
        "second wave: {checked} checked, {earned} tokens earned in {:?}: {statuses:?}",
        second.elapsed()
    );
    // The right key waits too: the address is out of tokens, not the key.
    let r = send(
        server.addr,
        Req::post(
            "/console/api/session",
            json!({"key": PERSONAL_ONE}).to_string(),
        )
        .header("Content-Type", "application/json")
        .header("Origin", "http://localhost"),
    );
    assert_eq!(r.status, 429, "{}", r.text());
}

#[test]
fn concurrent_bearer_guesses_cannot_outrun_the_limit() {
    let server = Server::start();
    let started = Instant::now();
    let handles: Vec<_> = (0..CONCURRENT)
        .map(|i| {
            let addr = server.addr;
            std::thread::spawn(move || {
                let req = Req::get("/api/projects/1/feature_flags/")
                    .header("Authorization", &format!("Bearer phx_guess_{i}"));
                send(addr, req).status
            })
        })
        .collect();
    let statuses: Vec<u16> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let checked = statuses.iter().filter(|&&s| s == 401).count();
    let refused = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!(checked + refused, CONCURRENT, "{statuses:?}");
    assert!(checked <= allowed_since(started), "{statuses:?}");
    // Good keys cost nothing, however many are sent at once from a fresh address.
    let fresh = Server::start();
    let handles: Vec<_> = (0..CONCURRENT)
        .map(|_| {
            let addr = fresh.addr;
            std::thread::spawn(move || {
                let req = Req::get("/api/projects/1/feature_flags/")
                    .header("Authorization", &format!("Bearer {PERSONAL_ONE}"));
                send(addr, req).status
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 200);
    }
}
