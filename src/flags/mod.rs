//! Feature flags: PostHog-compatible flag definitions, compiled once per project file and
//! evaluated per `/decide` or `/flags` request with results identical to PostHog's.
//!
//! How the parts fit:
//! - `load`: reads `flags/<project id>.json`, publishes a [`Snapshot`] of all projects
//!   atomically ([`Rules`]), and keeps a project's old rules when its file is broken.
//! - `compile` ([`ProjectRules::compile`]), with `definition` (path-aware JSON reading),
//!   `flag`, `filter`, `cohort` and `graph` (dependency order and cycles): turns a file
//!   into an immutable, index-resolved form.
//! - `evaluate` ([`ProjectRules::evaluate`], [`ProjectRules::outcomes`]), with `hash`,
//!   `property`, `date` and `semver`: computes every flag for one [`Context`] into
//!   `outcome`'s [`Outcomes`], the way PostHog's flags service does (its Rust
//!   `feature-flags`; `tests/sdk/differential` checks it against PostHog's SDKs).
//!   `clock` ([`now`]) is the instant relative dates count back from.
//! - `response` ([`response`], [`remote_config`]): the response body for each protocol
//!   version, and the remote config posthog-js reads at start.

mod clock;
mod cohort;
mod compile;
mod date;
mod definition;
mod error;
mod evaluate;
mod filter;
mod flag;
mod graph;
mod hash;
mod load;
mod outcome;
mod property;
mod response;
mod result;
mod semver;

#[cfg(test)]
mod tests;

pub use clock::now;
pub use compile::ProjectRules;
pub use error::{CompileError, ErrorKind};
pub use load::{ReloadReport, Rules, Snapshot};
pub use outcome::Outcomes;
pub use response::{remote_config, response, response_bytes};
pub use result::{Context, Evaluation, FailureCause, FlagFailure, FlagResult, Reason, ReasonCode};
