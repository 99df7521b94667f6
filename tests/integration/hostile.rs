//! Hostile input against the real binary: malformed and mistyped JSON, deep nesting,
//! bad bytes, huge numbers, compression bombs, oversized and slow requests, header
//! abuse, idle connections, keys used where they do not belong, and a regex built to
//! backtrack. Every case is refused with a clear 4xx (JSON whenever the request got as
//! far as flagpost's own code) and the server goes on serving everyone else.
//!
//! This file holds what the cases share; each submodule is one family of cases.

mod access;
mod bombs;
mod connections;
mod payloads;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

pub(super) use crate::util::*;

/// What no error body may mention: panics, source paths, the libraries and versions
/// inside, the test machine's paths, other projects' keys.
pub(super) const LEAKS: [&str; 15] = [
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
pub(super) fn assert_clean(r: &Resp) {
    let text = r.text().to_lowercase();
    for leak in LEAKS {
        let leak = leak.to_lowercase();
        assert!(!text.contains(&leak), "{leak:?} in an error body: {text}");
    }
    assert_eq!(r.header("server"), None);
}

/// A refusal as clients read it: the status and a JSON `{type, code, detail, attr}`.
pub(super) fn refused(r: &Resp, status: u16, code: &str) {
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
pub(super) fn hostile(s: &Server, r: Resp, status: u16, code: &str) {
    refused(&r, status, code);
    still_serving(s);
}

/// Everyone else is still served: an ordinary capture and an ordinary decide.
pub(super) fn still_serving(s: &Server) {
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

pub(super) fn event(extra: Value) -> Value {
    let mut e = json!({"api_key": KEY_ONE, "event": "e", "distinct_id": "d"});
    e.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    e
}

/// A connection with only a head sent, for requests the helpers cannot express.
pub(super) fn open(addr: SocketAddr, head: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    stream
}

/// One request written as raw bytes, and its response.
pub(super) fn raw(addr: SocketAddr, bytes: &[u8]) -> Option<Resp> {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = stream.write_all(bytes);
    read_response(&mut stream)
}

/// Write `bytes` one at a time, `every` apart, from another thread until told to stop
/// or the server hangs up; returns the stop switch.
pub(super) fn trickle(
    stream: &TcpStream,
    bytes: &'static [u8],
    every: Duration,
) -> Arc<AtomicBool> {
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
pub(super) fn memory_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| {
            let v = l.strip_prefix(field)?.strip_prefix(':')?;
            v.trim().strip_suffix(" kB")?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}
