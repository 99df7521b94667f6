//! The event model of ingestion: what a capture payload may look like, which project it
//! belongs to, which events are kept, and how each kept event is normalised into a
//! write-ahead log [`Record`](crate::log::Record).
//!
//! Everything here is pure: the HTTP layer decodes the body, calls [`parse`], resolves
//! the key with [`Payload::key`], then [`normalise_event`]s each event.

mod data;
#[cfg(test)]
#[path = "tests/equivalence.rs"]
mod equivalence_tests;
mod fixed;
mod ids;
pub mod json;
mod normalise;
mod parse;
pub(crate) mod tape;
pub mod timestamp;
pub mod v1;
mod write;

pub use fixed::{encode_fixed, Fixer, Fixing};
pub use normalise::{
    clean_distinct_id, encode_event, normalise, normalise_event, Context, DropReason, Encoded,
    Outcome, MAX_DISTINCT_ID_CHARS,
};
pub use parse::{parse, Event, Payload};

/// Why a capture request is refused. Each maps to one status and body in `http`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No project key anywhere in the request.
    #[error("API key is missing: send api_key or token in the request or in each event")]
    MissingKey,
    /// A key of the wrong shape (a personal key, too long, not ASCII) or not a project's.
    #[error("API key is not valid for ingestion")]
    InvalidKey,
    /// Events of one request carry different keys.
    #[error("events in one request carry different API keys")]
    MixedKeys,
    /// A batch with no events.
    #[error("the request contains no events")]
    EmptyBatch,
    /// Not JSON, or nested deeper than we parse.
    #[error("invalid JSON payload: {0}")]
    InvalidJson(String),
    /// JSON of the wrong shape: `field` should have been `expected`.
    #[error("{field} must be {expected}")]
    WrongType {
        field: &'static str,
        expected: &'static str,
    },
}
