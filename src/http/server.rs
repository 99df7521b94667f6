//! The accept loop: HTTP/1.1 with keep-alive, a header deadline, header size and count
//! limits, a bound on open connections, a lingering close on every connection (so a
//! refusal sent before the body was read is not turned into a reset), and graceful
//! shutdown that lets in-flight requests finish.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::app::App;

/// Requests with more headers than this get 431; real clients send a dozen.
const MAX_HEADERS: usize = 64;
/// Request line plus headers; larger gets 431.
const MAX_HEADER_BYTES: usize = 16 * 1024;
/// At shutdown, in-flight requests get this long to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);
/// After a failed accept (say, out of file descriptors), pause instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serve until `shutdown` resolves, then stop accepting and wait for in-flight
/// requests (bounded by a grace period).
pub async fn run(listener: TcpListener, app: Arc<App>, shutdown: impl Future<Output = ()>) {
    let limits = &app.config.limits;
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true)
        .max_headers(MAX_HEADERS)
        .max_buf_size(MAX_HEADER_BYTES.max(8192));
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            app.metrics.connections_refused.inc();
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let service = service_fn(move |req| {
            let app = app.clone();
            async move { Ok::<_, Infallible>(super::router::route(app, req, peer).await) }
        });
        let conn = graceful.watch(
            builder.serve_connection(TokioIo::new(super::linger::Lingering::new(stream)), service),
        );
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
            drop(permit);
        });
    }
    app.start_draining();
    drop(listener);
    tracing::info!(
        connections = graceful.count(),
        "shutting down: finishing in-flight requests"
    );
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(SHUTDOWN_GRACE) => {
            tracing::warn!("in-flight requests did not finish within the grace period");
        }
    }
}
