//! A small ClickHouse HTTP client on hyper's HTTP/1 connection: one kept-alive
//! connection (the sink sends one batch at a time, so a pool would only add
//! machinery), HTTP basic authentication, statements in the body and inserts as
//! `INSERT ... FORMAT RowBinary` in the query string with the rows as the body. The
//! connection is dropped after any error and made again on the next request.
//!
//! The official `clickhouse` crate was not used: its default format is unknown to the
//! 18.16 server the tests run, it only works there with validation switched off, and it
//! adds some 45 crates for what is a few hundred lines here.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use std::time::Duration;
use tokio::net::TcpStream;

use super::version::Version;
use super::Error;
use crate::config;

/// A connection attempt longer than this counts as the server being down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A statement or a batch of 50k rows takes under a second here; this much
/// allows for a busy server merging parts, and bounds a hung one.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// Answers the sink reads are a version string or a few rows; more is refused
/// rather than buffered.
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;
/// An error answer is kept to this many bytes in logs and errors.
const MAX_ERROR_CHARS: usize = 500;

pub struct Client {
    settings: config::Sink,
    /// `host:port` to connect to, also sent as `Host`.
    authority: String,
    /// The `Authorization` header's value.
    auth: String,
    /// The kept-alive connection, if one is open.
    conn: Option<SendRequest<Full<Bytes>>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("authority", &self.authority)
            .field("database", &self.settings.database)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Check the settings; nothing is connected until the first request.
    pub fn new(settings: config::Sink) -> Result<Client, Error> {
        let authority = settings.authority()?;
        let auth = settings.basic_auth();
        Ok(Client {
            settings,
            authority,
            auth,
            conn: None,
        })
    }

    pub fn settings(&self) -> &config::Sink {
        &self.settings
    }

    /// The server's version (`SELECT version()`), asked outside any database: the configured one may not
    /// exist yet (the sink creates it next).
    pub async fn version(&mut self) -> Result<Version, Error> {
        let text = self.query_server("SELECT version()").await?;
        let text = String::from_utf8_lossy(&text);
        Version::parse(&text).ok_or_else(|| Error::Answer(format!("version {text:?}")))
    }

    /// Run a statement in the configured database and return the answer's body.
    pub async fn query(&mut self, sql: &str) -> Result<Bytes, Error> {
        let path = self.path(&[("database", &self.settings.database)]);
        self.post(path, Bytes::from(sql.to_string())).await
    }

    /// Run a statement outside any database (to create the configured one).
    pub async fn query_server(&mut self, sql: &str) -> Result<Bytes, Error> {
        self.post("/".to_string(), Bytes::from(sql.to_string()))
            .await
    }

    /// Insert `rows`, encoded as `insert` (an `INSERT ... FORMAT ...` statement)
    /// expects, with `settings` for this insert only ([`super::Shape::insert_settings`]:
    /// with a deduplication token, a server drops a repeat of this insert whole).
    pub async fn insert(
        &mut self,
        insert: &str,
        rows: Vec<u8>,
        settings: &[(&str, &str)],
    ) -> Result<(), Error> {
        let path = self.insert_path(insert, settings);
        self.post(path, Bytes::from(rows)).await.map(drop)
    }

    /// The request path of an insert: the database, the statement, then the settings,
    /// which the server reads from any other URL parameter.
    fn insert_path(&self, insert: &str, settings: &[(&str, &str)]) -> String {
        let mut params = vec![
            ("database", self.settings.database.as_str()),
            ("query", insert),
        ];
        params.extend_from_slice(settings);
        self.path(&params)
    }

    fn path(&self, params: &[(&str, &str)]) -> String {
        // The pairs follow the `?`: a serializer started at 0 would put a `&` first,
        // which the server takes for a setting with an empty name.
        let mut query = form_urlencoded::Serializer::for_suffix(String::from("/?"), 2);
        for (k, v) in params {
            query.append_pair(k, v);
        }
        query.finish()
    }

    /// POST `body` to `path`; on any failure the connection is dropped.
    async fn post(&mut self, path: String, body: Bytes) -> Result<Bytes, Error> {
        let result = tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(path, body)).await;
        let result = result.unwrap_or(Err(Error::Timeout));
        if result.is_err() {
            self.conn = None;
        }
        result
    }

    async fn exchange(&mut self, path: String, body: Bytes) -> Result<Bytes, Error> {
        let request = Request::post(path)
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::AUTHORIZATION, &self.auth)
            .body(Full::new(body))
            .map_err(|e| Error::Answer(format!("request: {e}")))?;
        let conn = self.connection().await?;
        conn.ready().await.map_err(Error::Http)?;
        let response = conn.send_request(request).await.map_err(Error::Http)?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| Error::Answer(format!("reading the answer: {e}")))?
            .to_bytes();
        if status != StatusCode::OK {
            let text = String::from_utf8_lossy(&body);
            let message: String = text.trim().chars().take(MAX_ERROR_CHARS).collect();
            return Err(Error::Server {
                status: status.as_u16(),
                message,
            });
        }
        Ok(body)
    }

    /// The open connection, or a new one.
    async fn connection(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, Error> {
        if self.conn.as_ref().is_some_and(|c| c.is_closed()) {
            self.conn = None;
        }
        if self.conn.is_none() {
            let connect = TcpStream::connect(self.authority.as_str());
            let stream = tokio::time::timeout(CONNECT_TIMEOUT, connect)
                .await
                .map_err(|_| Error::Timeout)?
                .map_err(Error::Connect)?;
            // Small statements would otherwise wait on Nagle's algorithm.
            stream.set_nodelay(true).map_err(Error::Connect)?;
            let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(Error::Http)?;
            // The connection's own task ends when the sender is dropped or the
            // server closes; its error, if any, reaches the next request.
            tokio::spawn(async move {
                let _ = connection.await;
            });
            self.conn = Some(sender);
        }
        self.conn
            .as_mut()
            .ok_or_else(|| Error::Answer("no connection".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_settings_follow_the_statement_in_the_url() {
        let settings = config::Sink {
            url: "http://127.0.0.1:8123".into(),
            database: "posthog".into(),
            user: "default".into(),
            password: String::new(),
        };
        let client = Client::new(settings).expect("valid settings");
        let sql = "INSERT INTO events (uuid) FORMAT RowBinary";
        assert_eq!(
            client.insert_path(
                sql,
                &super::super::Shape::Current.insert_settings("n-1-2-events")
            ),
            "/?database=posthog&query=INSERT+INTO+events+%28uuid%29+FORMAT+RowBinary\
             &insert_deduplication_token=n-1-2-events&async_insert=0"
        );
        assert_eq!(
            client.insert_path(sql, &[]),
            "/?database=posthog&query=INSERT+INTO+events+%28uuid%29+FORMAT+RowBinary"
        );
    }
}
