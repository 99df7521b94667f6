//! flagpost: a single-binary edge server for product analytics that PostHog's client
//! libraries talk to unchanged.
//!
//! How an event and a flag request flow through the modules:
//!
//! ```text
//! client ─HTTP─> http::server (accept, limits) ─> http::router
//!   ├─ intake paths ─> http::capture: http::body (size, deadline, memory budget)
//!   │     ─> http::decode (data=, form, gzip | lz64 | base64) ─> capture::parse (simd-json)
//!   │     ─> key check (projects) ─> capture::normalise ─> log::Wal (group commit into
//!   │        the log's segment files, one fdatasync per group) ─> 200
//!   │                                   │
//!   │        compactor (its own thread): log ─> persons, groups, GeoIP, dedup, lanes
//!   │                                   ─> store (sled: event blocks, persons, groups,
//!   │                                      and the outbox of each chunk's changes)
//!   │                                        ^
//!   │        sink (its own task, with --clickhouse-url): reads the store's outbox
//!   │                                   ─> ClickHouse (PostHog's tables), then acknowledges
//!   ├─ /decide, /flags ─> http::decide ─> flags (snapshot, evaluate) + store::person_cache
//!   ├─ /api/... ─> http::api ─> store::query
//!   ├─ /api/projects/<id>/feature_flags/, cohorts/ ─> http::flags_api ─> manage (the
//!   │     flag file, rewritten atomically, then published by the flag reloader)
//!   ├─ /console/ ─> http::console (page, assets, the session cookie of
//!   │     `manage::session`) ─> the same flags_api, api and decide code as above
//!   ├─ /api/surveys/, /api/early_access_features/ ─> http::surveys ─> projects (surveys,
//!   │     early_access)
//!   ├─ /array/<key>/config(.js), /static/ ─> http::remote_config
//!   │     (projects::client_config), http::assets
//!   └─ /_liveness, /_readiness, /metrics (metrics)
//! ```
//!
//! The tree, one folder or file per stage or concern:
//!
//! ```text
//! http/       server, routing, body decoding, every response; errors -> statuses (error.rs)
//! capture/    the event model: parse, validate, normalise into a log record
//! log/        the write-ahead log: record format, segment files, group-commit writer,
//!             disk-space guard
//! compactor/  log -> events, persons, groups: its thread (worker.rs), one step, apply
//!             and splice, enrichment, lanes, retention
//! store/      the sled trees: key layouts, event blocks, dedup window, queries, the
//!             person cache, migration of older formats, the outbox (what each
//!             compactor chunk changed, committed with it) and its retention hold
//! sink/       the ClickHouse sink: reads the store's outbox and sends PostHog's
//!             tables over HTTP; the compactor does not know it exists
//! pipeline    opens the store, the log and its writer, the compactor and the ClickHouse
//!             sink; stops every one of them and waits for it on close
//! server/     runs the service: startup in order, the error it reports (with advice),
//!             the background loops (reloads, disk space, watchdog) and their stop
//! backup/     `flagpost backup` (taken by the running server through its admin socket,
//!             or from a stopped database) and `flagpost restore`
//! flags/      flag rules: the model, loading, compiling and evaluating (PostHog's)
//! persons/    person rules: identify, `$set`, `$set_once`, aliases, merges
//! geoip/      the GeoIP database and the trusted-proxy rules for the client address
//! projects/   everything configured per project: keys (`projects.json`), what a project
//!             tells posthog-js at start (`client_config`), surveys, early access
//!             features, and the loader those two share (`catalog`); a survey's
//!             targeting flags join its project's flag rules
//! manage/     flags and cohorts changed through PostHog's REST API: the file rewrite,
//!             PostHog's validation, the activity log, the failed-authentication limit,
//!             and the console's signed-in browsers (`session`)
//! admin/      offline commands (`check`, `eval`, `key`)
//! lz64/       LZ-String, as posthog-js compresses
//! support/    small helpers every layer may use: clock, idle, memory (the request
//!             budget), notify (systemd), sync, watch (the reload lock and change
//!             detection of the files the server reloads by itself)
//! app  config  metrics    the state handlers share, settings, Prometheus
//! ```
//!
//! Dependencies run one way, down this list (each module uses only modules below it;
//! none reaches up into `http`, and `config` knows no worker). The pipeline reads
//! log -> compactor -> store <- sink: the compactor and the sink share the store and
//! never name each other. The layers, that rule, and "no two files import each other"
//! are checked by `tests/integration/layers.rs`:
//!
//! ```text
//! server    -> app backup config flags geoip http log metrics pipeline projects sink
//!              store support
//! http      -> app capture compactor config flags geoip log lz64 manage metrics persons
//!              projects store support
//! app       -> compactor config flags geoip log manage metrics pipeline projects store
//!              support
//! pipeline  -> compactor config geoip log projects sink store support
//! admin     -> flags geoip projects store support
//! backup    -> config log store support
//! metrics   -> capture sink support
//! compactor -> config geoip log persons projects store support
//! sink      -> config persons store support
//! store     -> config log persons support
//! persons   -> capture
//! capture   -> log support (and lz64 in its tests)
//! projects  -> flags support
//! manage    -> flags support
//! config    -> geoip
//! log, flags, geoip -> support
//! lz64, support -> nothing of the crate
//! ```
//!
//! The same test keeps every source file to 500 lines or fewer: a longer one is split
//! by concern.
//!
//! `app::App` is the state the handlers share; `config::Config` is everything the
//! binary's flags decide; `support::notify` tells systemd when serving starts, reloads and
//! stops. The binary (`main.rs`) only parses flags and calls [`run`].
//!
//! This file only maps: module declarations and the public API below, no code (the
//! layers test checks that too). Modules the binary, the tests, the benchmarks or the
//! fuzz targets reach into are public; the rest are private to the crate.

pub mod admin;
mod app;
pub mod backup;
pub mod capture;
pub mod compactor;
pub mod config;
pub mod edge;
pub mod flags;
pub mod geoip;
pub mod http;
pub mod log;
pub mod lz64;
pub mod manage;
mod metrics;
pub mod persons;
mod pipeline;
pub mod projects;
mod server;
pub mod sink;
pub mod store;
pub mod support;

pub use config::Config;
pub use server::{run, serve, shutdown_signal, Error};
