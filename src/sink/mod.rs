//! The ClickHouse sink (off by default, on with `--clickhouse-url`): copies what the
//! compactor commits (events, persons, distinct-id links, groups) into ClickHouse in
//! PostHog's table shapes, exactly once after the replacing engines collapse re-sent
//! rows. The compactor does not know it exists: it commits each chunk's changes to the
//! store's outbox ([`crate::store::outbox`]), which the sink reads and acknowledges.
//!
//! ```text
//! compactor chunk txn ──> store::outbox (sled) ──> worker: batch ──> rows (RowBinary) ──> client ──HTTP──> ClickHouse
//!                                                    └── after every table acknowledged: delete entries + checkpoint (one txn)
//! ```
//!
//! [`version`] picks the table [`version::Shape`] the server supports, [`schema`]
//! creates the tables, [`rows`] encodes each table's rows with [`rowbinary`], and
//! [`client`] speaks HTTP to the server; [`destination`] ties them into "a server
//! ready to take batches". [`batch`] turns a run of outbox entries into rows (with
//! [`attached`]: the columns PostHog fills from properties, the elements chain built
//! by [`elements`]), [`backfill`] sends what the store held before the sink was on,
//! and [`worker`] sends batches in order, retrying, with [`stats`] for `/metrics`.

pub mod attached;
pub mod backfill;
pub mod batch;
pub mod client;
pub mod destination;
pub mod elements;
pub mod rowbinary;
pub mod rows;
pub mod schema;
pub mod stats;
pub mod version;
pub mod worker;

pub use client::Client;
pub use destination::Destination;
pub use schema::Table;
pub use stats::Stats;
pub use version::{Shape, Version};
pub use worker::Worker;

use std::path::Path;

use crate::config;

/// The environment variable the password is read from first.
pub const PASSWORD_ENV: &str = "FLAGPOST_CLICKHOUSE_PASSWORD";
/// ClickHouse's HTTP port, when the URL names none.
pub const DEFAULT_PORT: u16 = 8123;

/// What the client and the worker make of the sink's settings: `config` sits below the
/// sink and knows no ClickHouse, so the methods that turn its settings into a
/// connection live here, beside the client that uses them.
impl config::Sink {
    /// `host:port` from the URL; only plain `http://` with no path is accepted.
    pub fn authority(&self) -> Result<String, Error> {
        let bad = |why: &str| Error::Config(format!("--clickhouse-url {:?}: {why}", self.url));
        let uri: hyper::Uri = self.url.parse().map_err(|_| bad("not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad("only http:// is supported"));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(bad("give only the scheme, host and port"));
        }
        let host = uri.host().ok_or_else(|| bad("no host"))?;
        if !valid_identifier(&self.database) {
            return Err(Error::Config(format!(
                "ClickHouse database {:?}: letters, digits and _ only",
                self.database
            )));
        }
        Ok(format!("{host}:{}", uri.port_u16().unwrap_or(DEFAULT_PORT)))
    }

    /// The `Authorization` header's value for HTTP basic authentication.
    pub fn basic_auth(&self) -> String {
        use base64::Engine;
        let pair = format!("{}:{}", self.user, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }
}

/// The password from [`PASSWORD_ENV`] if set, else from `file` (one trailing newline
/// dropped), else empty. Never from the command line, where `ps` shows it.
pub fn read_password(file: Option<&Path>) -> std::io::Result<String> {
    if let Some(p) = std::env::var_os(PASSWORD_ENV) {
        return Ok(p.to_string_lossy().into_owned());
    }
    let Some(file) = file else {
        return Ok(String::new());
    };
    let text = std::fs::read_to_string(file)?;
    let text = text.strip_suffix('\n').unwrap_or(&text);
    Ok(text.strip_suffix('\r').unwrap_or(text).to_string())
}

/// A database name goes into `CREATE DATABASE` unquoted, so it is kept plain.
fn valid_identifier(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Why a request to ClickHouse, or the sink's work around it, failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The settings cannot work; retrying will not help.
    #[error("{0}")]
    Config(String),
    #[error("cannot connect to ClickHouse: {0}")]
    Connect(std::io::Error),
    #[error("ClickHouse connection: {0}")]
    Http(hyper::Error),
    #[error("ClickHouse did not answer in time")]
    Timeout,
    /// The server answered with an error (its text, shortened).
    #[error("ClickHouse answered {status}: {message}")]
    Server { status: u16, message: String },
    /// The server's answer made no sense.
    #[error("unexpected answer from ClickHouse: {0}")]
    Answer(String),
    /// Reading or writing the outbox or the stored data failed.
    #[error("sink storage: {0}")]
    Store(sled::Error),
    /// A storage call on the blocking pool panicked or was cancelled.
    #[error("sink task: {0}")]
    Task(tokio::task::JoinError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_names() {
        let mut s = config::Sink::new("http://ch.local");
        assert_eq!(s.authority().unwrap(), "ch.local:8123");
        s.url = "http://127.0.0.1:9123/".into();
        assert_eq!(s.authority().unwrap(), "127.0.0.1:9123");
        for bad in [
            "https://x:8443",
            "x:8123",
            "http://x/db",
            "http://x/?user=a",
        ] {
            s.url = bad.into();
            assert!(matches!(s.authority(), Err(Error::Config(_))), "{bad}");
        }
        s.url = "http://x".into();
        s.database = "a-b".into();
        assert!(s.authority().is_err());
        s.database = "posthog_1".into();
        assert!(s.authority().is_ok());
        s.password = "pw".into();
        assert!(!format!("{s:?}").contains("pw"));
        assert_eq!(s.basic_auth(), "Basic ZGVmYXVsdDpwdw==");
    }
}
