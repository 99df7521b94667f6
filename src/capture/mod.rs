//! The event model of ingestion: what a capture payload may look like, which project it
//! belongs to, which events are kept, and how each kept event is normalised into a
//! write-ahead log [`Record`](crate::log::Record).
//!
//! Everything here is pure: the HTTP layer decodes the body, calls [`parse`], resolves
//! the key with [`Payload::key`], then [`normalise_event`]s each event.

#[cfg(test)]
mod equivalence_tests;
mod ids;
pub mod json;
mod normalise;
mod parse;
pub(crate) mod tape;
pub mod timestamp;
pub mod v1;
mod write;

pub use normalise::{
    clean_distinct_id, encode_event, normalise, normalise_event, Context, DropReason, Encoded,
    Outcome, MAX_DISTINCT_ID_CHARS,
};
pub use parse::{parse, Event, Payload};

/// Why a capture request is refused. Each maps to one status and body in `http`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// No project key anywhere in the request.
    MissingKey,
    /// A key of the wrong shape (a personal key, too long, not ASCII) or not a project's.
    InvalidKey,
    /// Events of one request carry different keys.
    MixedKeys,
    /// A batch with no events.
    EmptyBatch,
    /// Not JSON, or nested deeper than we parse.
    InvalidJson(String),
    /// JSON of the wrong shape: `field` should have been `expected`.
    WrongType {
        field: &'static str,
        expected: &'static str,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::MissingKey => f.write_str(
                "API key is missing: send api_key or token in the request or in each event",
            ),
            Error::InvalidKey => f.write_str("API key is not valid for ingestion"),
            Error::MixedKeys => f.write_str("events in one request carry different API keys"),
            Error::EmptyBatch => f.write_str("the request contains no events"),
            Error::InvalidJson(why) => write!(f, "invalid JSON payload: {why}"),
            Error::WrongType { field, expected } => write!(f, "{field} must be {expected}"),
        }
    }
}

impl std::error::Error for Error {}
