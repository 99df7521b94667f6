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
//!   `props` (where a filter reads), `property`, `date` and `semver`: computes every
//!   flag for one [`Context`] into `outcome`'s [`Outcomes`], the way PostHog's flags
//!   service does (its Rust `feature-flags`; `tests/sdk/differential` checks it against
//!   PostHog's SDKs).
//!   `clock` ([`now`]) is the instant relative dates count back from.
//! - `response` ([`response`], [`Tail`]): the response body for each protocol
//!   version.
//! - `lint` ([`lint`]): what a file is refused for beyond what the compiler reads
//!   (unknown fields, percentages outside 0-100, and filters of inactive flags no flag
//!   may use); serving and `flagpost check` refuse the same files.
//! - `vocabulary`: what a flag may say (PostHog's operators, filter types and fields),
//!   the one list the compiler, `lint`, the management API and the console's form share.

mod clock;
mod cohort;
mod compile;
mod date;
mod definition;
mod dependency_chain;
mod error;
mod evaluate;
pub mod feed;
mod filter;
mod flag;
mod generated;
mod graph;
mod hash;
mod inconclusive;
mod lint;
mod load;
mod outcome;
mod property;
mod props;
mod response;
mod result;
mod semver;
mod synced;
pub mod vocabulary;

#[cfg(test)]
mod tests;

pub use clock::now;
pub use compile::ProjectRules;
pub use error::{CompileError, ErrorKind};
pub use lint::lint;
pub use load::{ReloadReport, Rules, Snapshot};
pub use outcome::Outcomes;
pub use response::{
    quota_limited, quota_limited_tail, response, response_bytes, response_bytes_with,
    response_with, Tail, COMMON_FIELDS,
};
pub use result::{Context, Evaluation, FailureCause, FlagFailure, FlagResult, Reason, ReasonCode};
pub use synced::Generated;
