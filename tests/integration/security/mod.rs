//! The guards of issue 37, attacked from outside over loopback: the failed-key limit
//! under concurrency (held-back bodies), the client's address behind a real nginx with a
//! spoofed `X-Forwarded-For`, the per-address connection cap, `next`/`previous` links
//! that a `Host` header cannot point elsewhere, keys with only the rights they need
//! (project secret keys, scoped personal keys with the scope PostHog names for each
//! endpoint, posthog-node and posthog-python evaluating locally with a `phs_` key),
//! the console's health page kept to the key's project, and a client that stops
//! reading its answer.

mod connections;
mod health;
mod keys;
mod limits;
mod links;
mod proxy;
mod scopes;
mod stalls;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};

use crate::util::*;

/// A connection to `to` from the loopback address `source` (127.0.0.2, ...), so one test
/// can be several clients.
fn connect_from(source: &str, to: SocketAddr) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let stream = rt.block_on(socket.connect(to)).unwrap().into_std().unwrap();
    stream.set_nonblocking(false).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    stream
}

/// A GET with the `Host` given (the util client always says localhost) and more
/// headers, from `source`.
fn get_as(source: &str, to: SocketAddr, path: &str, host: &str, extra: &[(&str, &str)]) -> Resp {
    let mut s = connect_from(source, to);
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    read_response(&mut s).expect("a response")
}

/// One sample of `/metrics`, asked from `source`.
fn metric(server: &Server, source: &str, name: &str) -> Option<f64> {
    let text = get_as(source, server.addr, "/metrics", "localhost", &[]).text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}
