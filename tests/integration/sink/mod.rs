//! The ClickHouse sink against a real `clickhouse-server` (Debian's 18.16 in CI),
//! started per test by [`server`]: tables created for the server's version, rows
//! encoded in RowBinary read back exactly, re-sent batches collapsing, and the client
//! living through a server restart. That server takes the narrow shape; [`current`]
//! checks the current shape's tables, rows, tokens and queries against ClickHouse 26.9
//! embedded, without HTTP.

mod collapse;
mod current;
mod end_to_end;
mod merges;
mod missing;
mod nodes;
mod outage;
mod queries;
mod refused;
mod server;
mod tables;
mod worker;

use flagpost::config;
use flagpost::sink::Destination;

pub use server::ClickHouse;

/// The sink's settings for a test's server and database.
pub fn settings(ch: &ClickHouse) -> config::Sink {
    config::Sink {
        url: ch.url(),
        database: ch.database.clone(),
        user: server::USER.to_string(),
        password: server::PASSWORD.to_string(),
    }
}

/// Run `f` on a fresh single-threaded runtime, as the sink's tests are plain tests.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// The sink's view of the test's server, tables created.
pub fn destination(ch: &ClickHouse) -> Destination {
    block_on(Destination::open(settings(ch))).expect("destination opens")
}
