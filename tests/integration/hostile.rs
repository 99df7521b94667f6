//! Hostile input against the real binary: malformed and mistyped JSON, deep nesting,
//! bad bytes, huge numbers, compression bombs, oversized and slow requests, header
//! abuse, idle connections, keys used where they do not belong, and a regex built to
//! backtrack. Every case is refused with a clear 4xx (JSON whenever the request got as
//! far as flagpost's own code) and the server goes on serving everyone else.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::*;

/// What no error body may mention: panics, source paths, the libraries and versions
/// inside, the test machine's paths, other projects' keys.
const LEAKS: [&str; 15] = [
    "panicked",
    "backtrace",
    "src/",
    ".rs:",
    "sled",
    "hyper",
    "tokio",
    "simd",
    "serde",
    "0.34",
    "0.1.0",
    "/tmp",
    "/root",
    KEY_TWO,
    PERSONAL_TWO,
];

/// Nothing in a response about internals, in the body or in a `Server` header.
fn assert_clean(r: &Resp) {
    let text = r.text().to_lowercase();
    for leak in LEAKS {
        let leak = leak.to_lowercase();
        assert!(!text.contains(&leak), "{leak:?} in an error body: {text}");
    }
    assert_eq!(r.header("server"), None);
}

/// A refusal as clients read it: the status and a JSON `{type, code, detail, attr}`.
fn refused(r: &Resp, status: u16, code: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let body = r.json();
    assert_eq!(body["code"], code, "{body}");
    assert!(
        body["type"].is_string() && body["detail"].is_string(),
        "{body}"
    );
    assert_clean(r);
}

/// A hostile request's answer: refused as [`refused`] says, and then everyone else
/// is still served.
fn hostile(s: &Server, r: Resp, status: u16, code: &str) {
    refused(&r, status, code);
    still_serving(s);
}

/// Everyone else is still served: an ordinary capture and an ordinary decide.
fn still_serving(s: &Server) {
    let event = json!({"api_key": KEY_ONE, "event": "ordinary", "distinct_id": "someone-else"});
    let r = s.post("/capture/", event.to_string());
    assert_eq!((r.status, r.text()), (200, r#"{"status":1}"#.to_owned()));
    let r = s.post(
        "/decide/?v=3",
        json!({"token": KEY_ONE, "distinct_id": "someone-else"}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["errorsWhileComputingFlags"], false);
}

fn event(extra: Value) -> Value {
    let mut e = json!({"api_key": KEY_ONE, "event": "e", "distinct_id": "d"});
    e.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    e
}

/// A connection with only a head sent, for requests the helpers cannot express.
fn open(addr: SocketAddr, head: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    stream
}

/// One request written as raw bytes, and its response.
fn raw(addr: SocketAddr, bytes: &[u8]) -> Option<Resp> {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = stream.write_all(bytes);
    read_response(&mut stream)
}

/// Write `bytes` one at a time, `every` apart, from another thread until told to stop
/// or the server hangs up; returns the stop switch.
fn trickle(stream: &TcpStream, bytes: &'static [u8], every: Duration) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let (mut out, done) = (stream.try_clone().unwrap(), stop.clone());
    std::thread::spawn(move || {
        for b in bytes.iter().cycle() {
            if done.load(Ordering::Relaxed) || out.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(every);
        }
    });
    stop
}

/// A field of `/proc/<pid>/status`, in kB.
fn memory_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| {
            let v = l.strip_prefix(field)?.strip_prefix(':')?;
            v.trim().strip_suffix(" kB")?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// How much more memory the server may take for one bomb than it had before.
const BOMB_MEMORY_BOUND_KB: u64 = 200 * 1024;

#[test]
fn malformed_json() {
    let s = Server::start();
    for body in [
        r#"{"event": "#,
        r#"{"event":"e","distinct_id":"d",}"#,
        r#"{"event":"e" "distinct_id":"d"}"#,
        "[{]",
        "nope",
        "{'event': 'e'}",
    ] {
        for path in [
            "/capture/",
            "/batch/",
            "/e/?ver=1",
            "/decide/?v=3",
            "/flags/?v=2",
        ] {
            hostile(&s, s.post(path, body), 400, "invalid_payload");
        }
    }
    still_serving(&s);
}

#[test]
fn wrong_types_everywhere() {
    let s = Server::start();
    let capture = [
        event(json!({"event": 42})),
        event(json!({"event": ["e"]})),
        event(json!({"properties": [1, 2]})),
        event(json!({"properties": "p"})),
        event(json!({"distinct_id": {"id": 1}})),
        event(json!({"distinct_id": [1]})),
        event(json!({"distinct_id": true})),
        event(json!({"api_key": 5})),
        json!({"api_key": KEY_ONE, "batch": {"event": "e"}}),
        json!({"api_key": KEY_ONE, "batch": ["e"]}),
        json!({"api_key": ["k"], "batch": [{"event": "e", "distinct_id": "d"}]}),
        json!([1, 2]),
        json!("event"),
        json!(42),
    ];
    for body in capture {
        hostile(
            &s,
            s.post("/capture/", body.to_string()),
            400,
            "invalid_payload",
        );
    }
    let decide = [
        json!({"token": KEY_ONE, "distinct_id": {"id": 1}}),
        json!({"token": KEY_ONE, "distinct_id": "d", "person_properties": [1]}),
        json!({"token": KEY_ONE, "distinct_id": "d", "groups": "org"}),
        json!({"token": KEY_ONE, "distinct_id": "d", "group_properties": 5}),
        json!({"token": 5, "distinct_id": "d"}),
        json!([{"token": KEY_ONE, "distinct_id": "d"}]),
    ];
    for body in decide {
        hostile(
            &s,
            s.post("/decide/?v=3", body.to_string()),
            400,
            "invalid_payload",
        );
    }
    still_serving(&s);
}

#[test]
fn nesting_100000_deep() {
    let s = Server::start();
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    hostile(
        &s,
        s.post("/capture/", deep.clone()),
        400,
        "invalid_payload",
    );
    hostile(&s, s.post("/decide/?v=3", deep), 400, "invalid_payload");
    let inside = format!(
        r#"{{"api_key":"{KEY_ONE}","event":"e","distinct_id":"d","properties":{{"a":{}1{}}}}}"#,
        "{\"a\":".repeat(100_000),
        "}".repeat(100_000)
    );
    hostile(&s, s.post("/capture/", inside), 400, "invalid_payload");
    // Deep and gzipped: the limit holds after decompression too.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    hostile(
        &s,
        s.post("/batch/", gzip(deep.as_bytes())),
        400,
        "invalid_payload",
    );
    still_serving(&s);
}

#[test]
fn invalid_utf8() {
    let s = Server::start();
    let mut in_string = br#"{"api_key":"phc_test_one","event":"e"#.to_vec();
    in_string.extend_from_slice(b"\xff\xfe\xc3\x28");
    in_string.extend_from_slice(br#"","distinct_id":"d"}"#);
    hostile(
        &s,
        s.post("/capture/", in_string.clone()),
        400,
        "invalid_payload",
    );
    hostile(
        &s,
        s.post("/decide/?v=3", in_string),
        400,
        "invalid_payload",
    );
    hostile(
        &s,
        s.post("/capture/", b"\xff\xfe\xfd\xfc".to_vec()),
        400,
        "invalid_payload",
    );
    // Percent-encoded in data= of a GET.
    hostile(&s, s.get("/e/?data=%FF%FE%FD%FC"), 400, "invalid_payload");
    // In a header value: not text, so ignored; the request itself is fine.
    let body = event(json!({})).to_string();
    let mut bytes =
        b"POST /capture/ HTTP/1.1\r\nHost: x\r\nContent-Type: text/\xffplain\r\n".to_vec();
    bytes.extend_from_slice(
        format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    let r = raw(s.addr, &bytes).expect("a response");
    assert_eq!(r.status, 200, "{}", r.text());
    still_serving(&s);
}

#[test]
fn nul_bytes() {
    let s = Server::start();
    // Raw NUL: not JSON.
    let mut body = br#"{"api_key":"phc_test_one","event":"a"#.to_vec();
    body.extend_from_slice(b"\0");
    body.extend_from_slice(br#"b","distinct_id":"d"}"#);
    hostile(&s, s.post("/capture/", body), 400, "invalid_payload");
    hostile(
        &s,
        s.post("/capture/", vec![0u8; 64]),
        400,
        "invalid_payload",
    );
    // Escaped NUL is valid JSON: accepted, and never stored in a distinct id.
    let r = s.post(
        "/capture/",
        event(json!({"distinct_id": "nul\u{0}id", "event": "nul\u{0}event"})).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s.post(
        "/decide/?v=3",
        json!({"token": KEY_ONE, "distinct_id": "nul\u{0}id"}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let stored = s.settle(1);
    let nul = stored
        .iter()
        .find(|e| e["event"] == "nul\u{0}event")
        .unwrap();
    assert_eq!(nul["distinct_id"], "nul\u{FFFD}id");
    // NUL in a header value or the request line: refused by the HTTP parser.
    let r = raw(
        s.addr,
        b"GET /_liveness HTTP/1.1\r\nHost: x\r\nX-A: a\0b\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.map(|r| r.status), Some(400));
    still_serving(&s);
    let r = raw(s.addr, b"GET /_live\0ness HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.map(|r| r.status), Some(400));
    still_serving(&s);
    still_serving(&s);
}

#[test]
fn huge_numbers() {
    let s = Server::start();
    let bodies = [
        r#"{"api_key":"phc_test_one","event":"big-id","distinct_id":123456789012345678901234567890}"#,
        r#"{"api_key":"phc_test_one","event":"neg-id","distinct_id":-1e308}"#,
        r#"{"api_key":"phc_test_one","event":"offset-far-back","distinct_id":"d","offset":1e300}"#,
        r#"{"api_key":"phc_test_one","event":"offset-far-ahead","distinct_id":"d","offset":-1e300}"#,
        r#"{"api_key":"phc_test_one","event":"props","distinct_id":"d","properties":{"n":1e308,"m":-1e308,"i":18446744073709551616,"z":-0}}"#,
        r#"{"api_key":"phc_test_one","event":"number-timestamp","distinct_id":"d","timestamp":1e300}"#,
    ];
    for body in bodies {
        let r = s.post("/capture/?_=1e300", body);
        assert_eq!(r.status, 200, "{body}: {}", r.text());
    }
    // Past f64: not a number JSON parsing can represent, refused as such.
    for body in [
        r#"{"api_key":"phc_test_one","event":"inf","distinct_id":1e400}"#,
        r#"{"api_key":"phc_test_one","event":"inf","distinct_id":"d","properties":{"n":-1e999}}"#,
    ] {
        hostile(&s, s.post("/capture/", body), 400, "invalid_payload");
    }
    hostile(
        &s,
        s.post(
            "/decide/?v=3",
            r#"{"token":"phc_test_one","distinct_id":"d","person_properties":{"n":1e999}}"#,
        ),
        400,
        "invalid_payload",
    );
    let r = s.post(
        "/decide/?v=99999999999999999999",
        r#"{"token":"phc_test_one","distinct_id":1e300,"person_properties":{"n":1e308}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // The compactor got through all of them, and the read API shows them.
    let stored = s.settle(1);
    let names: Vec<&str> = stored.iter().filter_map(|e| e["event"].as_str()).collect();
    for name in [
        "big-id",
        "neg-id",
        "offset-far-ahead",
        "props",
        "number-timestamp",
    ] {
        assert!(names.contains(&name), "{name} not in {names:?}");
    }
    still_serving(&s);
}

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
    let small = flagpost::http::lz64::decompress_from_base64(lz64_bomb(3).as_bytes(), 100);
    assert_eq!(small.unwrap(), "a".repeat(10));

    // The decoder holds UTF-16 while it works: up to twice the cap. A 16 MiB cap keeps
    // the debug build's decoding quick; the bound below scales with it.
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
    let bound = (2 * cap / 1024 + 32 * 1024).min(BOMB_MEMORY_BOUND_KB);
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
#[test]
fn small_bombs_are_decoded_off_the_reactor() {
    let s = Server::start_with(&["--max-decompressed-bytes", &(8 << 20).to_string()]);
    let bomb = lz64_bomb(14_500);
    let form = format!("data={}&compression=lz64", urlencode(&bomb));
    assert!(form.len() < 64 * 1024, "{}", form.len());
    let bombs: Vec<_> = (0..6)
        .map(|_| {
            let (addr, form) = (s.addr, form.clone());
            std::thread::spawn(move || {
                let r = send(
                    addr,
                    Req::post("/e/", form)
                        .header("Content-Type", "application/x-www-form-urlencoded"),
                );
                (r, Instant::now())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let r = s.get("/_liveness");
    let live_at = Instant::now();
    assert_eq!(r.status, 200);
    for bomb in bombs {
        let (r, done_at) = bomb.join().unwrap();
        hostile(&s, r, 413, "payload_too_large");
        assert!(live_at < done_at, "liveness waited for a bomb to finish");
    }
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
    let s = Server::start_with(&[
        "--max-connections",
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

#[test]
fn keys_used_where_they_do_not_belong() {
    let s = Server::start();
    // A personal key never ingests, nor evaluates flags.
    hostile(
        &s,
        s.post(
            "/capture/",
            event(json!({"api_key": PERSONAL_ONE})).to_string(),
        ),
        401,
        "invalid_api_key",
    );
    let batch = json!({"api_key": PERSONAL_ONE, "batch": [{"event": "e", "distinct_id": "d"}]});
    hostile(
        &s,
        s.post("/batch/", batch.to_string()),
        401,
        "invalid_api_key",
    );
    hostile(
        &s,
        s.post(
            "/decide/?v=3",
            json!({"token": PERSONAL_ONE, "distinct_id": "d"}).to_string(),
        ),
        401,
        "invalid_api_key",
    );
    // A project key never reads.
    for path in [
        "/api/projects/1/events/",
        "/api/projects/1/persons/?distinct_id=d",
        "/api/projects/1/groups/?group_type_index=0&group_key=g",
        "/api/feature_flag/local_evaluation/?token=phc_test_one",
    ] {
        hostile(&s, s.api(path, KEY_ONE), 401, "not_authenticated");
        hostile(&s, s.get(path), 401, "not_authenticated");
        // Another project's personal key reads nothing of this one.
        hostile(&s, s.api(path, PERSONAL_TWO), 403, "permission_denied");
    }
    // Whether the project exists or not.
    hostile(
        &s,
        s.api("/api/projects/999/events/", PERSONAL_ONE),
        403,
        "permission_denied",
    );
    still_serving(&s);
}

#[test]
fn catastrophic_regex_is_answered_fast() {
    let tmp = data_dir();
    let flag = |id: u32, key: &str, pattern: &str| {
        json!({"id": id, "key": key, "active": true, "filters": {"groups": [{
            "properties": [{"key": "email", "type": "person", "value": pattern, "operator": "regex"}],
            "rollout_percentage": 100}]}})
    };
    let flags = json!({"flags": [
        flag(1, "backtrack", "(a+)+$"),
        flag(2, "nested", "^(a|aa)+$"),
        flag(3, "huge", "(a{1000}){1000}"),
    ], "group_type_mapping": {}, "cohorts": {}});
    std::fs::write(tmp.path().join("data/flags/1.json"), flags.to_string()).unwrap();
    let s = Server::spawn(tmp.path(), &[]);
    let decide = |email: &str| {
        let body =
            json!({"token": KEY_ONE, "distinct_id": "d", "person_properties": {"email": email}});
        let started = Instant::now();
        let r = s.post("/decide/?v=3", body.to_string());
        assert_eq!(r.status, 200, "{}", r.text());
        (r.json()["featureFlags"].clone(), started.elapsed())
    };
    let hostile = format!("{}!", "a".repeat(100_000));
    let (flags, elapsed) = decide(&hostile);
    assert_eq!(
        flags,
        json!({"backtrack": false, "nested": false, "huge": false})
    );
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    // The flags are live, not just broken: a matching value turns them on.
    let (flags, _) = decide("aaaa");
    assert_eq!(
        flags,
        json!({"backtrack": true, "nested": true, "huge": false})
    );
    still_serving(&s);
}

/// One of every error the server can give, scanned for anything about internals.
#[test]
fn error_bodies_leak_nothing() {
    let s = Server::start_with(&["--max-body-bytes", "1000"]);
    let answers = [
        s.post("/capture/", "{\"event\": \u{1F4A5}"),
        s.post("/capture/", vec![0xffu8; 8]),
        s.post(
            "/capture/",
            r#"{"api_key":"phc_test_one","event":5,"distinct_id":"d"}"#,
        ),
        s.post("/capture/", r#"{"event":"e","distinct_id":"d"}"#),
        s.post(
            "/capture/",
            r#"{"api_key":"phc_unknown","event":"e","distinct_id":"d"}"#,
        ),
        s.post(
            "/capture/",
            r#"[{"api_key":"phc_test_one","event":"e"},{"api_key":"phc_test_two","event":"e"}]"#,
        ),
        s.post("/capture/", r#"{"api_key":"phc_test_one","batch":[]}"#),
        s.post("/capture/", "a".repeat(2000)),
        s.request(Req::post("/capture/?compression=gzip", "not gzip")),
        s.request(Req::post("/capture/?compression=lz64", "@@@@")),
        s.request(Req::post("/capture/?compression=base64", "!!!!")),
        s.post("/capture/", ""),
        s.request(Req::get("/capture/").method("DELETE")),
        s.post("/decide/", r#"{"distinct_id":"d"}"#),
        s.post("/decide/", r#"{"token":"phc_test_one"}"#),
        s.post("/decide/", r#"{"token":"phc_nobody","distinct_id":"d"}"#),
        s.get("/nowhere"),
        s.get("/api/projects/1/events/"),
        s.api("/api/projects/1/events/", PERSONAL_TWO),
        s.api("/api/projects/1/events/?limit=lots", PERSONAL_ONE),
        s.api("/api/projects/1/events/?after=yesterday", PERSONAL_ONE),
        s.api(
            "/api/projects/1/groups/?group_type_index=0&group_key=none",
            PERSONAL_ONE,
        ),
        s.api("/flags/definitions?token=phc_test_two", PERSONAL_ONE),
    ];
    for r in &answers {
        assert!((400..500).contains(&r.status), "{} {}", r.status, r.text());
        assert_clean(r);
        let body = r.json();
        assert!(body["detail"].is_string(), "{body}");
    }
    still_serving(&s);
}
