//! The client every edge-mode part uses to reach upstream: HTTP/1.1 on hyper's
//! connection, over TLS (rustls, the system's CA store) for `https://`, with a small
//! pool of kept-alive connections so the sync loop, the flag fallback and the forwarder
//! do not pay a TLS handshake per request. Each request has a deadline covering the
//! connection, the request and the whole answer, and the answer's body is bounded.
//!
//! A request that fails on a pooled connection before any byte of it was written (the
//! upstream closed the idle connection) is sent again on a fresh one; once written,
//! the outcome is unknown and the caller decides (the forwarder resends the same
//! bytes; the flag fallback answers locally).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderMap, HeaderValue, HOST, USER_AGENT};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// A connection attempt longer than this counts as upstream being down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle connections kept per upstream: the sync loop, a few flag fallbacks and the
/// forwarder's one request in flight at a time.
const MAX_IDLE: usize = 8;
/// What upstream is told is calling, as PostHog's SDKs name themselves.
const AGENT: &str = concat!("flagpost-edge/", env!("CARGO_PKG_VERSION"));

/// What upstream answered: any status, its headers and its whole body.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// A header's value as text, if present and visible ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// `Retry-After` in seconds, if upstream sent one as a number of seconds.
    pub fn retry_after(&self) -> Option<Duration> {
        let secs: u64 = self.header("retry-after")?.trim().parse().ok()?;
        Some(Duration::from_secs(secs))
    }
}

/// Why no answer came back.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot connect to upstream {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("TLS with upstream {0}: {1}")]
    Tls(String, std::io::Error),
    #[error("upstream did not answer within {0:?}")]
    Timeout(Duration),
    /// The connection failed mid-exchange (a reset, a closed socket): the request may
    /// or may not have been acted on.
    #[error("upstream connection: {0}")]
    Http(#[from] hyper::Error),
    #[error("upstream's answer is larger than {0} bytes")]
    TooLarge(usize),
    #[error("{0}")]
    Request(String),
}

impl Error {
    /// The `status` label of `flagpost_upstream_requests_total` for an exchange with no
    /// status.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Connect(..) => "refused",
            Error::Timeout(_) => "timeout",
            Error::Http(_) => "reset",
            Error::Tls(..) | Error::TooLarge(_) | Error::Request(_) => "error",
        }
    }

    /// True when the request may have reached upstream: a resend could be a duplicate.
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, Error::Timeout(_) | Error::Http(_))
    }
}

/// The upstream's address and how to reach it; cheap to clone (shared pool).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    /// `scheme://host[:port]`, no trailing slash.
    base: String,
    /// `host:port` to connect to.
    address: String,
    /// The Host header: the URL's authority as written.
    host: HeaderValue,
    /// `Some` for `https://`: the connector and the name the certificate must carry.
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls::pki_types::ServerName<'static>,
    )>,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.inner.base)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client for `url` (`http[s]://host[:port]`, checked by
    /// [`super::settings::parse_url`]); nothing is connected until the first request.
    pub fn new(url: &str) -> Result<Client, Error> {
        let bad = |why: String| Error::Request(format!("upstream {url:?}: {why}"));
        let uri: hyper::Uri = url.parse().map_err(|_| bad("not a URL".into()))?;
        let https = uri.scheme_str() == Some("https");
        let host = uri.host().ok_or_else(|| bad("no host".into()))?;
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        // An IPv6 literal keeps its brackets in `host()`, as a socket address needs.
        let address = format!("{host}:{port}");
        let authority = uri.authority().map(|a| a.as_str()).unwrap_or(host);
        let host_header = HeaderValue::from_str(authority).map_err(|e| bad(e.to_string()))?;
        let tls = if https {
            let name = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let name = rustls::pki_types::ServerName::try_from(name)
                .map_err(|e| bad(format!("not a server name: {e}")))?;
            Some((tls_connector()?, name))
        } else {
            None
        };
        Ok(Client {
            inner: Arc::new(Inner {
                base: url.trim_end_matches('/').to_string(),
                address,
                host: host_header,
                tls,
                idle: Mutex::new(Vec::new()),
            }),
        })
    }

    /// `scheme://host[:port]`, for messages and the health page.
    pub fn base(&self) -> &str {
        &self.inner.base
    }

    /// Send `request` (its URI a path and query, e.g. `/batch/`) and read the whole
    /// answer, at most `max_answer` bytes of body, all within `deadline`. Host and
    /// User-Agent are filled in unless the request sets them.
    pub async fn send(
        &self,
        mut request: Request<Full<Bytes>>,
        deadline: Duration,
        max_answer: usize,
    ) -> Result<Answer, Error> {
        let headers = request.headers_mut();
        headers
            .entry(HOST)
            .or_insert_with(|| self.inner.host.clone());
        headers
            .entry(USER_AGENT)
            .or_insert_with(|| HeaderValue::from_static(AGENT));
        tokio::time::timeout(deadline, self.exchange(request, max_answer))
            .await
            .unwrap_or(Err(Error::Timeout(deadline)))
    }

    async fn exchange(
        &self,
        request: Request<Full<Bytes>>,
        max_answer: usize,
    ) -> Result<Answer, Error> {
        let mut request = request;
        // One try on a pooled connection; if it was closed before the request went
        // out, the request comes back and goes on a fresh connection.
        let (mut conn, pooled) = match self.take_idle() {
            Some(conn) => (conn, true),
            None => (self.connect().await?, false),
        };
        let response = match conn.try_send_request(request).await {
            Ok(response) => response,
            Err(mut failed) => match failed.take_message() {
                Some(unsent) if pooled => {
                    request = unsent;
                    conn = self.connect().await?;
                    conn.send_request(request).await?
                }
                _ => return Err(Error::Http(failed.into_error())),
            },
        };
        let status = response.status();
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, max_answer)
            .collect()
            .await
            .map_err(|e| match e.downcast::<hyper::Error>() {
                Ok(e) => Error::Http(*e),
                Err(_) => Error::TooLarge(max_answer),
            })?
            .to_bytes();
        self.put_idle(conn);
        Ok(Answer {
            status,
            headers: parts.headers,
            body,
        })
    }

    fn take_idle(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.inner.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(conn) = idle.pop() {
            if !conn.is_closed() && conn.is_ready() {
                return Some(conn);
            }
        }
        None
    }

    fn put_idle(&self, conn: SendRequest<Full<Bytes>>) {
        if conn.is_closed() {
            return;
        }
        let mut idle = self.inner.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, Error> {
        let inner = &self.inner;
        let connect = TcpStream::connect(inner.address.as_str());
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| Error::Timeout(CONNECT_TIMEOUT))?
            .map_err(|e| Error::Connect(inner.base.clone(), e))?;
        // Small requests (a conditional poll) would otherwise wait on Nagle.
        let _ = stream.set_nodelay(true);
        match &inner.tls {
            None => handshake(TokioIo::new(stream)).await,
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), stream)
                    .await
                    .map_err(|e| Error::Tls(inner.base.clone(), e))?;
                handshake(TokioIo::new(tls)).await
            }
        }
    }
}

async fn handshake<T>(io: T) -> Result<SendRequest<Full<Bytes>>, Error>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    // The connection's task ends when the sender is dropped or upstream closes; its
    // error, if any, reaches the next request on it.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// rustls with the system's CA certificates (`SSL_CERT_FILE` and `SSL_CERT_DIR` are
/// honoured, as by OpenSSL), loaded once per process.
fn tls_connector() -> Result<tokio_rustls::TlsConnector, Error> {
    static CONFIG: std::sync::OnceLock<Result<Arc<rustls::ClientConfig>, String>> =
        std::sync::OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        let mut roots = rustls::RootCertStore::empty();
        let (added, _ignored) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            let why = found
                .errors
                .first()
                .map(|e| e.to_string())
                .unwrap_or_else(|| "none found".into());
            return Err(format!(
                "no CA certificates to check upstream's with: {why}"
            ));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Arc::new(config))
    });
    match config {
        Ok(config) => Ok(tokio_rustls::TlsConnector::from(config.clone())),
        Err(why) => Err(Error::Request(why.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_host_headers() {
        let c = Client::new("http://127.0.0.1:8010").unwrap();
        assert_eq!(c.inner.address, "127.0.0.1:8010");
        assert_eq!(c.inner.host, "127.0.0.1:8010");
        assert!(c.inner.tls.is_none());
        let c = Client::new("http://[::1]:9000").unwrap();
        assert_eq!(c.inner.address, "[::1]:9000");
        let c = Client::new("http://upstream.local").unwrap();
        assert_eq!(c.inner.address, "upstream.local:80");
        assert_eq!(c.base(), "http://upstream.local");
    }

    #[test]
    fn error_labels() {
        assert_eq!(Error::Timeout(Duration::from_secs(1)).label(), "timeout");
        assert!(Error::Timeout(Duration::from_secs(1)).outcome_unknown());
        let refused = Error::Connect(
            "x".into(),
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        );
        assert_eq!(refused.label(), "refused");
        assert!(!refused.outcome_unknown());
    }
}
