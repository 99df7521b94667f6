//! The accept loop: HTTP/1.1 with keep-alive, a header deadline, header size and count
//! limits, a bound on open connections and a smaller one per client address (so one
//! address holding idle sockets cannot keep everyone else out; a trusted proxy carries
//! everyone's connections and is not held to it), a lingering close on every connection
//! (so a refusal sent before the body was read is not turned into a reset) that also
//! drops a connection whose client stops reading its answer (`linger`), and
//! graceful shutdown that lets in-flight requests finish.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
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
    let per_address = Arc::new(PerAddress::new(limits.per_address()));
    let m = &app.metrics;
    m.max_connections.set(limits.max_connections as i64);
    m.max_connections_per_address.set(per_address.cap as i64);
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
        // The socket peer, not X-Forwarded-For: the cap is taken before a byte of the
        // request is read. A trusted proxy (nginx) is exempt: its connections are all of
        // its clients', so capping it would hand one attacker everyone's share; nginx's
        // own limit_conn caps each client instead.
        let slot = if app.config.trusted_proxies.contains(peer.ip()) {
            None
        } else {
            let Some(slot) = per_address.admit(peer.ip()) else {
                app.metrics.connections_refused_per_address.inc();
                drop(stream);
                continue;
            };
            Some(slot)
        };
        app.metrics.connections_open.inc();
        let _ = stream.set_nodelay(true);
        let open = app.metrics.connections_open.clone();
        let stall_limit = app.config.limits.write_stall_timeout;
        let app = app.clone();
        let service = service_fn(move |req| {
            let app = app.clone();
            async move { Ok::<_, Infallible>(super::router::route(app, req, peer).await) }
        });
        let stream = super::linger::Lingering::new(stream, stall_limit);
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
            open.dec();
            drop((permit, slot));
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

/// Open connections by client address (an IPv6 client by its /64).
struct PerAddress {
    cap: usize,
    /// Touched once at accept and once at close, never across an await.
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One admitted connection; dropping it gives the address's place back.
struct Slot {
    table: Arc<PerAddress>,
    ip: IpAddr,
}

impl PerAddress {
    fn new(cap: usize) -> Self {
        PerAddress {
            cap,
            open: Mutex::default(),
        }
    }

    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        let ip = crate::geoip::subscriber(ip);
        let mut open = crate::support::sync::lock(&self.open);
        let n = open.entry(ip).or_insert(0);
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(Slot {
            table: self.clone(),
            ip,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = crate::support::sync::lock(&self.table.open);
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                // Only addresses with open connections are kept: the table is as large
                // as the connections are many, never larger.
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_holds_at_most_its_cap_and_gets_places_back() {
        let table = Arc::new(PerAddress::new(2));
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        let first = table.admit(a).unwrap();
        let _second = table.admit(a).unwrap();
        assert!(table.admit(a).is_none(), "a third from the same address");
        assert!(table.admit(b).is_some(), "another address is not kept out");
        drop(first);
        assert!(
            table.admit(a).is_some(),
            "a closed connection frees its place"
        );
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        let other_in_64: IpAddr = "2001:db8::2:3".parse().unwrap();
        let _x = table.admit(v6).unwrap();
        let _y = table.admit(other_in_64).unwrap();
        assert!(table.admit("2001:db8::9".parse().unwrap()).is_none());
    }

    #[test]
    fn the_table_forgets_addresses_without_connections() {
        let table = Arc::new(PerAddress::new(8));
        for i in 0..100u8 {
            drop(table.admit(IpAddr::from([10, 0, 0, i])).unwrap());
        }
        assert!(crate::support::sync::lock(&table.open).is_empty());
    }
}
