//! Lingering close: the socket wrapper that makes a refusal reach the client.
//!
//! When a handler answers before reading the request body (413 decided from
//! Content-Length, 503 while the disk is full), hyper writes the answer and closes the
//! connection. If unread request bytes still sit in the kernel's receive buffer at
//! `close()`, Linux sends a RST instead of a FIN, and a client still sending its body
//! meets "connection reset" instead of the answer it was sent. So closing here first
//! sends FIN (the answer is complete), then reads and drops whatever the client still
//! sends, bounded in bytes and time, and only then lets the socket close.
//!
//! The same wrapper bounds a write that makes no progress: a client that stops reading
//! (its receive window shut at zero) would otherwise hold its connection's place and
//! the answer's buffers forever. A write the socket has not taken a byte of for the
//! stall limit fails with `TimedOut`, and hyper drops the connection. A slow reader
//! that keeps taking bytes is never cut off, however long the answer takes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// At most this much of a refused body is read and dropped after the answer: above
/// the default 20 MiB body limit, so a client that sends a body just over the limit
/// without waiting for `100 Continue` still reads its 413.
pub const LINGER_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// A client still sending after this long is cut off: a closing connection holds a
/// connection slot, so it must not be held open by a slow sender.
pub const LINGER_TIME: Duration = Duration::from_secs(2);
/// Read size while draining; on the stack of the poll.
const DRAIN_CHUNK: usize = 16 * 1024;

/// A TCP stream whose shutdown lingers and whose writes may stall only so long (see
/// the module docs).
pub struct Lingering {
    stream: TcpStream,
    state: State,
    stall_limit: Duration,
    /// Runs while a write waits for the peer; made once per connection, then reset.
    stall: Option<Pin<Box<Sleep>>>,
    /// Whether `stall` is counting for the write now waiting.
    stalled: bool,
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
    /// `stall_limit`: how long a write may wait without the peer taking a byte.
    pub fn new(stream: TcpStream, stall_limit: Duration) -> Lingering {
        Lingering {
            stream,
            state: State::Open,
            stall_limit,
            stall: None,
            stalled: false,
        }
    }

    /// What a write that `result` answered means, given the stall clock: progress
    /// stops the clock, waiting starts it (or finds it run out).
    fn watch_stall<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if result.is_ready() {
            self.stalled = false;
            return result;
        }
        let deadline = Instant::now() + self.stall_limit;
        let sleep = match &mut self.stall {
            Some(sleep) if self.stalled => sleep,
            Some(sleep) => {
                sleep.as_mut().reset(deadline);
                sleep
            }
            None => self
                .stall
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        self.stalled = true;
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took no bytes of the answer within the write stall limit",
            ))),
            Poll::Pending => Poll::Pending,
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
        let result = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.watch_stall(cx, result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.watch_stall(cx, result)
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpSocket;

    /// The smallest socket buffers Linux allows (it doubles what is asked), so a few
    /// kilobytes unread fill them.
    const SMALL_BUFFER: u32 = 4096;
    /// Far beyond what either test takes, so neither can hang.
    const TEST_BOUND: Duration = Duration::from_secs(60);

    /// A writing side wrapped in `Lingering` with `stall_limit`, and the reading side,
    /// both with small buffers. Which side connected does not matter to the wrapper;
    /// the reader is the accepted one so it takes its buffer size from the listener.
    async fn pair(stall_limit: Duration) -> (Lingering, TcpStream) {
        let listening = TcpSocket::new_v4().unwrap();
        listening.set_recv_buffer_size(SMALL_BUFFER).unwrap();
        listening.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = listening.listen(1).unwrap();
        let writer = TcpSocket::new_v4().unwrap();
        writer.set_send_buffer_size(SMALL_BUFFER).unwrap();
        let (accepted, writer) = tokio::join!(
            listener.accept(),
            writer.connect(listener.local_addr().unwrap())
        );
        (
            Lingering::new(writer.unwrap(), stall_limit),
            accepted.unwrap().0,
        )
    }

    #[tokio::test]
    async fn a_write_the_client_takes_nothing_of_fails_at_the_stall_limit() {
        let (mut server, _client) = pair(Duration::from_millis(300)).await;
        let chunk = vec![7u8; 64 * 1024];
        let mut written = 0usize;
        let writes = async {
            loop {
                match server.write(&chunk).await {
                    Ok(n) => written += n,
                    Err(e) => break e,
                }
                assert!(
                    written < 16 * 1024 * 1024,
                    "{written} bytes taken by a client reading none"
                );
            }
        };
        // Bounds the test, should the write wait for ever.
        let err = tokio::time::timeout(TEST_BOUND, writes)
            .await
            .expect("the stalled write never failed");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(written > 0, "the buffers took the first bytes");
    }

    #[tokio::test]
    async fn a_slow_reader_that_keeps_reading_gets_the_whole_answer() {
        // Reads every 50 ms; the limit is far longer, so only a reader that stops
        // altogether would meet it.
        let (mut server, mut client) = pair(Duration::from_secs(5)).await;
        const TOTAL: usize = 256 * 1024;
        let reader = tokio::spawn(async move {
            let (mut got, mut buf) = (0, vec![0u8; 8192]);
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                match client.read(&mut buf).await.unwrap() {
                    0 => break got,
                    n => got += n,
                }
            }
        });
        let writes = async {
            server.write_all(&vec![1u8; TOTAL]).await.unwrap();
            server.shutdown().await.unwrap();
        };
        tokio::time::timeout(TEST_BOUND, writes)
            .await
            .expect("the answer was written");
        assert_eq!(reader.await.unwrap(), TOTAL);
    }
}
