//! Compression bombs and oversized bodies: refused with 413, early, and with the
//! server's memory (read from /proc) bounded.

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::*;

/// How much more memory the server may take for one bomb than it had before.
const BOMB_MEMORY_BOUND_KB: u64 = 200 * 1024;

/// An lz64 stream of `codes` codes, each the KwKwK case, decoding to "a", "aa", "aaa"...:
/// about codes²/2 bytes from about 2·codes bytes.
fn lz64_bomb(codes: u64) -> String {
    const DIGITS: &[u8; 65] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=";
    let mut bits = Vec::new();
    let mut put = |value: u64, width: u32| bits.extend((0..width).map(|i| (value >> i) & 1));
    put(0, 2);
    put(u64::from(b'a'), 8);
    let (mut width, mut enlarge_in, mut next) = (3, 4u64, 4u64);
    for _ in 0..codes {
        put(next, width);
        next += 1;
        enlarge_in -= 1;
        if enlarge_in == 0 {
            enlarge_in = 1 << width;
            width += 1;
        }
    }
    put(2, width);
    let mut text: String = bits
        .chunks(6)
        .map(|c| {
            let v = (0..6).fold(0, |acc, i| acc << 1 | c.get(i).copied().unwrap_or(0));
            char::from(DIGITS[v as usize])
        })
        .collect();
    while !text.len().is_multiple_of(4) {
        text.push('=');
    }
    text
}

/// POST `mib` MiB of zeros as that many gzip members of 1 MiB each (gzip allows
/// concatenation), written member by member so the test never holds more than one.
fn gzip_bomb(addr: SocketAddr, path: &str, mib: usize) -> Resp {
    let member = gzip(&vec![0u8; 1 << 20]);
    let mut stream = open(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            member.len() * mib
        ),
    );
    stream.set_read_timeout(Some(WAIT)).unwrap();
    for _ in 0..mib {
        if stream.write_all(&member).is_err() {
            break;
        }
    }
    read_response(&mut stream).expect("a response")
}

#[test]
fn gzip_bomb_is_refused_with_bounded_memory() {
    let s = Server::start();
    still_serving(&s);
    let before = memory_kb(s.pid(), "VmRSS");
    let r = gzip_bomb(s.addr, "/batch/", 1024);
    hostile(&s, r, 413, "payload_too_large");
    let (peak, after) = (memory_kb(s.pid(), "VmHWM"), memory_kb(s.pid(), "VmRSS"));
    assert!(
        peak < before + BOMB_MEMORY_BOUND_KB,
        "peak {peak} kB from {before} kB"
    );
    assert!(
        after < before + BOMB_MEMORY_BOUND_KB,
        "{after} kB from {before} kB"
    );
    still_serving(&s);
}

#[test]
fn lz64_bomb_is_refused_with_bounded_memory() {
    // The generator itself: 3 codes after the first literal are "aa", "aaa", "aaaa".
    let small = flagpost::lz64::decompress_from_base64(lz64_bomb(3).as_bytes(), 100);
    assert_eq!(small.unwrap(), "a".repeat(10));

    // The decoder holds its output as UTF-16 while it works (up to twice the cap for
    // ASCII), in one buffer, since dictionary entries are ranges of it; growing that
    // buffer copies it, briefly holding both: about four times the cap at the peak. A
    // 16 MiB cap keeps the debug build's decoding quick; the bound scales with it.
    let cap: u64 = 16 << 20;
    let s = Server::start_with(&["--max-decompressed-bytes", &cap.to_string()]);
    still_serving(&s);
    let before = memory_kb(s.pid(), "VmRSS");
    // About 1 GB once decompressed.
    let bomb = lz64_bomb(45_000);
    assert!(bomb.len() < 128 * 1024, "{}", bomb.len());
    let form = format!("data={}&compression=lz64", urlencode(&bomb));
    let r = s.request(
        Req::post("/e/?ver=1.0", form).header("Content-Type", "application/x-www-form-urlencoded"),
    );
    hostile(&s, r, 413, "payload_too_large");
    let (peak, after) = (memory_kb(s.pid(), "VmHWM"), memory_kb(s.pid(), "VmRSS"));
    let bound = (4 * cap / 1024 + 32 * 1024).min(BOMB_MEMORY_BOUND_KB);
    assert!(peak < before + bound, "peak {peak} kB from {before} kB");
    assert!(after < before + bound, "{after} kB from {before} kB");
    still_serving(&s);
}

/// Found by hand: /decide read at most 1 MiB of body but decompressed it up to the
/// capture limit (100 MiB by default), on the reactor thread.
#[test]
fn decide_bomb_is_cut_at_the_decide_limit() {
    let s = Server::start();
    still_serving(&s);
    let before = memory_kb(s.pid(), "VmRSS");
    let started = Instant::now();
    hostile(
        &s,
        gzip_bomb(s.addr, "/decide/?v=3", 200),
        413,
        "payload_too_large",
    );
    // About 100 MB of lz64, in a 30 kB form.
    let bomb = lz64_bomb(14_500);
    let form = format!("data={}&compression=lz64", urlencode(&bomb));
    let r = s.request(
        Req::post("/decide/?v=3", form).header("Content-Type", "application/x-www-form-urlencoded"),
    );
    hostile(&s, r, 413, "payload_too_large");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let peak = memory_kb(s.pid(), "VmHWM");
    assert!(peak < before + 32 * 1024, "peak {peak} kB from {before} kB");
    still_serving(&s);
}

/// Found by hand: a capture body small enough to be decoded inline was decoded on the
/// reactor even when lz64 expanded it to the decompressed cap, stalling every
/// connection served by that worker thread.
///
/// Six connections send such bombs back to back while liveness probes are timed: a
/// probe must not wait for a decode. How long a decode takes depends on the build and
/// the machine, so the probes are compared with the bombs of the same run: decoded on
/// the reactor, a probe waits about a decode or more; off it, a small fraction.
#[test]
fn small_bombs_are_decoded_off_the_reactor() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    const PROBES: usize = 9;
    let s = Server::start_with(&["--max-decompressed-bytes", &(8 << 20).to_string()]);
    let bomb = lz64_bomb(14_500);
    let form = format!("data={}&compression=lz64", urlencode(&bomb));
    assert!(form.len() < 64 * 1024, "{}", form.len());
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let bombers: Vec<_> = (0..6)
        .map(|_| {
            let (addr, form) = (s.addr, form.clone());
            let (stop, answered) = (stop.clone(), answered.clone());
            std::thread::spawn(move || {
                let mut answers = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let sent = Instant::now();
                    let r = send(
                        addr,
                        Req::post("/e/", form.clone())
                            .header("Content-Type", "application/x-www-form-urlencoded"),
                    );
                    answers.push((r, sent.elapsed()));
                    answered.fetch_add(1, Ordering::SeqCst);
                }
                answers
            })
        })
        .collect();
    // Six bombs answered: the server is busy with the ones sent after them.
    let deadline = Instant::now() + WAIT;
    while answered.load(Ordering::SeqCst) < 6 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut probes: Vec<Duration> = (0..PROBES)
        .map(|_| {
            let sent = Instant::now();
            let r = s.get("/_liveness");
            assert_eq!(r.status, 200);
            sent.elapsed()
        })
        .collect();
    stop.store(true, Ordering::SeqCst);
    let mut bombs = Vec::new();
    for bomber in bombers {
        for (r, took) in bomber.join().unwrap() {
            hostile(&s, r, 413, "payload_too_large");
            bombs.push(took);
        }
    }
    assert!(bombs.len() >= 12, "{} bombs answered", bombs.len());
    probes.sort();
    bombs.sort();
    let (probe, bomb) = (probes[PROBES / 2], bombs[bombs.len() / 2]);
    assert!(
        probe * 5 < bomb,
        "the median liveness probe took {probe:?}, the median bomb {bomb:?}"
    );
    still_serving(&s);
}

#[test]
fn body_of_25_mb_is_refused_before_it_is_sent() {
    let s = Server::start();
    let mut stream = open(
        s.addr,
        "POST /batch/ HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 26214400\r\n\r\n",
    );
    stream.write_all(&[b'['; 1024]).unwrap();
    // Nothing more is sent: the answer must come anyway.
    let started = Instant::now();
    let r = read_response(&mut stream).expect("413 before the rest of the body");
    hostile(&s, r, 413, "payload_too_large");
    assert!(started.elapsed() < Duration::from_secs(2));
    still_serving(&s);
}
