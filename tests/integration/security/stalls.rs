//! A client that stops reading its answer (its receive window shut at zero) does not
//! hold its connection's place for ever: the write that makes no progress for
//! `--write-stall-timeout-ms` fails and the connection is closed.

use std::io::{Read, Write};
use std::net::TcpStream;

use super::metric;
use crate::util::*;

/// The static files' largest (16 MiB): more than loopback's socket buffers hold
/// (4 MiB at most for sending), so the write must wait for the reader.
const BIG: usize = 16 * 1024 * 1024;

/// A connection whose receive buffer is the smallest Linux allows, asking for `path`.
fn ask_without_reading(server: &Server, path: &str) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = rt
        .block_on(socket.connect(server.addr))
        .unwrap()
        .into_std()
        .unwrap();
    stream.set_nonblocking(false).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    stream
}

#[test]
fn a_client_that_stops_reading_is_let_go_at_the_stall_limit() {
    let tmp = data_dir();
    let files = tmp.path().join("static");
    std::fs::create_dir_all(&files).unwrap();
    std::fs::write(files.join("big.js"), vec![b'x'; BIG]).unwrap();
    let mut server = Server::spawn(
        tmp.path(),
        &[
            "--write-stall-timeout-ms",
            "2000",
            "--static-dir",
            files.to_str().unwrap(),
        ],
    );
    server.keep(tmp);
    let mut stalled = ask_without_reading(&server, "/static/big.js");
    // The answer is being written (the connection is open beside the metrics' own)...
    let open = metric(&server, "127.0.0.2", "flagpost_connections_open");
    assert_eq!(open, Some(2.0));
    // ...and then, its client having read nothing, it is closed within the limit.
    wait_for("the stalled connection to be closed", || {
        let open = metric(&server, "127.0.0.2", "flagpost_connections_open")?;
        (open <= 1.0).then_some(())
    });
    // What the client reads now is what the buffers held, then the end: not the
    // whole answer.
    let mut got = Vec::new();
    let _ = stalled.read_to_end(&mut got);
    assert!(got.len() < BIG, "{} bytes", got.len());
    assert!(got.starts_with(b"HTTP/1.1 200"), "the answer had begun");
    // A client that reads gets the whole file.
    let r = server.get("/static/big.js");
    assert_eq!((r.status, r.body.len()), (200, BIG));
}
