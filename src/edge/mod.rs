//! Edge mode (`serve --upstream URL`, off by default): this server stands in front of
//! an upstream PostHog (PostHog Cloud, a self-hosted PostHog, or another flagpost).
//! Each project in `projects.json` is then the edge of the upstream project whose
//! token is its `api_key`, so clients keep the key they already have. The contract is
//! the "Edge mode" section of the design; the facts behind it (PostHog's endpoints,
//! its answers, how it deduplicates) are in the edge research notes.
//!
//! ```text
//! clients ──> capture (uuid, timestamp, $ip fixed) ──> log ──> compactor ──> outbox ──> forwarder ──POST /batch/──> upstream
//! SDKs    <── /decide, /flags, definitions feeds <── synced rules <── sync loop ──GET /flags/definitions──┘
//!                  └── what the edge cannot decide ──POST /flags (one call, flag_keys)──> upstream
//! ```
//!
//! [`settings`] reads the command line's values, [`client`] speaks HTTP/1.1 (plain or
//! TLS) to upstream with a small pool of kept-alive connections, [`answer`] says what
//! each upstream answer to a delivery means and how long to back off, [`backlog`]
//! bounds what capture accepts while upstream is behind, and [`stats`] holds the
//! `flagpost_upstream_*` metrics every part updates. [`recordings`] spools `/s/` and
//! forwards it, [`cache`] keeps upstream's remote config, surveys and early access,
//! both writing through [`durable`].

pub mod answer;
pub mod backlog;
pub mod cache;
pub mod client;
pub mod durable;
pub mod fallback;
pub mod forward;
pub mod merge;
pub mod recordings;
pub mod settings;
pub mod stats;
pub mod sync;

pub use answer::{Backoff, Outcome};
pub use backlog::Backlog;
pub use client::{Answer, Client, Error};
pub use stats::Stats;
