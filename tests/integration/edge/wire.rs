//! The edge tests' fakes read what the edge sends them the same way: one plain
//! HTTP/1.1 request at a time off a kept-alive connection (request line, headers, a
//! `content-length` body; the edge's client never chunks a request). A fake that must
//! notice it was closed reads with short timeouts and hands in its flag; the wait
//! goes on through those timeouts until a whole request is in.

use std::io::{BufRead, BufReader, ErrorKind, Read};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};

/// One request as it arrived.
pub struct Request {
    pub path: String,
    /// Names as sent (compare them ignoring case).
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// The next request off the connection; `None` at its end, on an error, on a request
/// that is not HTTP, or once `closed` is set.
pub fn read_request(reader: &mut BufReader<TcpStream>, closed: &AtomicBool) -> Option<Request> {
    let mut lines = Vec::new();
    loop {
        let line = read_line(reader, closed)?;
        // Blank lines before a request line are skipped, as HTTP/1.1 allows.
        match (line.is_empty(), lines.is_empty()) {
            (true, true) => continue,
            (true, false) => break,
            (false, _) => lines.push(line),
        }
    }
    let path = lines[0].split_whitespace().nth(1)?.to_owned();
    let mut headers = Vec::new();
    for line in &lines[1..] {
        let (k, v) = line.split_once(':')?;
        headers.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    let length = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let body = read_body(reader, length, closed)?;
    Some(Request {
        path,
        headers,
        body,
    })
}

/// One line without its line ending; `None` at the connection's end.
fn read_line(reader: &mut BufReader<TcpStream>, closed: &AtomicBool) -> Option<String> {
    let mut line = String::new();
    loop {
        if closed.load(Ordering::SeqCst) {
            return None;
        }
        match reader.read_line(&mut line) {
            Ok(0) => return None,
            Ok(_) if line.ends_with('\n') => return Some(line.trim_end().to_owned()),
            Ok(_) => {}
            Err(e) if waiting(&e) => {}
            Err(_) => return None,
        }
    }
}

fn read_body(
    reader: &mut BufReader<TcpStream>,
    length: usize,
    closed: &AtomicBool,
) -> Option<Vec<u8>> {
    let mut body = vec![0; length];
    let mut got = 0;
    while got < length {
        if closed.load(Ordering::SeqCst) {
            return None;
        }
        match reader.read(&mut body[got..]) {
            Ok(0) => return None,
            Ok(n) => got += n,
            Err(e) if waiting(&e) => {}
            Err(_) => return None,
        }
    }
    Some(body)
}

/// A read timeout, not a broken connection.
fn waiting(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}
