//! Lingering close: the socket wrapper that makes a refusal reach the client.
//!
//! When a handler answers before reading the request body (413 decided from
//! Content-Length, 503 while the disk is full), hyper writes the answer and closes the
//! connection. If unread request bytes still sit in the kernel's receive buffer at
//! `close()`, Linux sends a RST instead of a FIN, and a client still sending its body
//! meets "connection reset" instead of the answer it was sent. So closing here first
//! sends FIN (the answer is complete), then reads and drops whatever the client still
//! sends, bounded in bytes and time, and only then lets the socket close.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;

/// At most this much of a refused body is read and dropped after the answer: above
/// the default 20 MiB body limit, so a client that sends a body just over the limit
/// without waiting for `100 Continue` still reads its 413.
pub const LINGER_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// A client still sending after this long is cut off: a closing connection holds a
/// connection slot, so it must not be held open by a slow sender.
pub const LINGER_TIME: Duration = Duration::from_secs(2);
/// Read size while draining; on the stack of the poll.
const DRAIN_CHUNK: usize = 16 * 1024;

/// A TCP stream whose shutdown lingers (see the module docs).
pub struct Lingering {
    stream: TcpStream,
    state: State,
}

enum State {
    Open,
    Draining {
        deadline: Pin<Box<Sleep>>,
        left: u64,
    },
    Closed,
}

impl Lingering {
    pub fn new(stream: TcpStream) -> Lingering {
        Lingering {
            stream,
            state: State::Open,
        }
    }
}

impl AsyncRead for Lingering {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Lingering {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            match &mut this.state {
                State::Open => {
                    // FIN after everything written: the answer is complete on the wire.
                    // A peer already gone has nothing left to drain.
                    if ready!(Pin::new(&mut this.stream).poll_shutdown(cx)).is_err() {
                        this.state = State::Closed;
                        continue;
                    }
                    this.state = State::Draining {
                        deadline: Box::pin(tokio::time::sleep(LINGER_TIME)),
                        left: LINGER_MAX_BYTES,
                    };
                }
                State::Draining { deadline, left } => {
                    if deadline.as_mut().poll(cx).is_ready() {
                        this.state = State::Closed;
                        continue;
                    }
                    let mut chunk = [0u8; DRAIN_CHUNK];
                    let mut buf = ReadBuf::new(&mut chunk);
                    match ready!(Pin::new(&mut this.stream).poll_read(cx, &mut buf)) {
                        Ok(()) if !buf.filled().is_empty() => {
                            let n = buf.filled().len() as u64;
                            match left.checked_sub(n) {
                                Some(rest) if rest > 0 => *left = rest,
                                _ => this.state = State::Closed,
                            }
                        }
                        // End of stream, or an error: nothing more will come.
                        _ => this.state = State::Closed,
                    }
                }
                State::Closed => return Poll::Ready(Ok(())),
            }
        }
    }
}
