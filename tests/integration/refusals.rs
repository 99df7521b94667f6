//! Refusals answered before the body is read (503 while the disk is full, 413 for a
//! body over the limit) reach a client that sends its whole body without waiting, as
//! an answer and never as a connection reset.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};

use crate::util::*;

/// Each case is tried this many times: a reset used to show in about one in five.
const RUNS: usize = 40;
/// Under the server's discard cap: read and dropped, the connection kept.
const SMALL_BODY: usize = 1024 * 1024;
/// Over the discard cap: answered at once, then drained by the lingering close.
const LARGE_BODY: usize = 12 * 1024 * 1024;

/// A `/batch/` body of `len` bytes: valid JSON, so only the refusal can fail it.
fn batch_body(len: usize) -> Vec<u8> {
    let head = format!(r#"{{"api_key": "{KEY_ONE}", "batch": [], "pad": ""#);
    let mut body = head.into_bytes();
    body.resize(len - 2, b'x');
    body.extend_from_slice(b"\"}");
    body
}

/// Write the request and all of its body at once, without waiting for anything,
/// then read the answer. `chunked` sends the body without a declared length.
fn send_blind(addr: SocketAddr, body: &[u8], chunked: bool, close: bool) -> (TcpStream, Resp) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    stream.set_write_timeout(Some(WAIT)).unwrap();
    let framing = if chunked {
        "Transfer-Encoding: chunked".to_string()
    } else {
        format!("Content-Length: {}", body.len())
    };
    let connection = if close { "Connection: close\r\n" } else { "" };
    let mut bytes = format!(
        "POST /batch/ HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         {framing}\r\n{connection}\r\n"
    )
    .into_bytes();
    if chunked {
        for piece in body.chunks(64 * 1024) {
            bytes.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
            bytes.extend_from_slice(piece);
            bytes.extend_from_slice(b"\r\n");
        }
        bytes.extend_from_slice(b"0\r\n\r\n");
    } else {
        bytes.extend_from_slice(body);
    }
    // A client's write cut short by a reset is the failure: SDKs give up on the
    // request there and never read the answer, so the whole body must go through.
    let written = stream.write_all(&bytes);
    let resp = read_response(&mut stream);
    assert!(
        written.is_ok() && resp.is_some(),
        "{} bytes sent: write {written:?}, answer {resp:?}",
        bytes.len()
    );
    let resp = resp.unwrap();
    (stream, resp)
}

fn assert_unavailable(resp: &Resp) {
    assert_eq!(resp.status, 503, "{}", resp.text());
    assert_eq!(resp.header("retry-after"), Some("5"));
    assert_eq!(resp.json()["code"], "unavailable");
}

#[test]
fn the_disk_full_503_reaches_clients_that_send_without_waiting() {
    // A reserve no disk has: the space guard refuses every event from the start.
    let server = Server::start_with(&["--min-free-disk-mb", "1000000000"]);
    let small = batch_body(SMALL_BODY);
    let large = batch_body(LARGE_BODY);
    for run in 0..RUNS {
        // Small: drained, answered, and the connection still serves the next request.
        let (mut stream, resp) = send_blind(server.addr, &small, run % 2 == 1, false);
        assert_unavailable(&resp);
        assert_eq!(resp.header("connection"), None, "run {run}");
        write_request(&mut stream, &Req::get("/_liveness"), true);
        let next = read_response(&mut stream).expect("the kept connection answers");
        assert_eq!((next.status, next.text().as_str()), (200, "ok"));

        // Large: answered at once with Connection: close; the rest is drained, not reset.
        let (_, resp) = send_blind(server.addr, &large, run % 2 == 1, false);
        assert_unavailable(&resp);
        assert_eq!(resp.header("connection"), Some("close"), "run {run}");
    }
    let metrics = server.get("/metrics").text();
    let line = format!("route=\"capture\",status=\"503\"}} {}", 2 * RUNS);
    assert!(metrics.contains(&line), "{line} not in\n{metrics}");
}

#[test]
fn the_413_for_an_oversized_batch_reaches_clients_that_send_without_waiting() {
    let server = Server::start_with(&["--max-body-bytes", "1048576"]);
    let over = batch_body(LARGE_BODY);
    for run in 0..RUNS {
        // Declared too large (refused before a byte is read), then undeclared (refused
        // once the limit is passed mid-body).
        for chunked in [false, true] {
            let (_, resp) = send_blind(server.addr, &over, chunked, run % 2 == 0);
            assert_eq!(resp.status, 413, "run {run}, chunked {chunked}");
            assert_eq!(resp.json()["code"], "payload_too_large");
            assert_eq!(resp.header("connection"), Some("close"));
        }
    }
    // Still serving, and a body under the limit is taken.
    let one =
        format!(r#"{{"api_key": "{KEY_ONE}", "batch": [{{"event": "e", "distinct_id": "d"}}]}}"#);
    let ok = send_blind(server.addr, one.as_bytes(), false, true).1;
    assert_eq!((ok.status, ok.text().as_str()), (200, r#"{"status":1}"#));
}
