//! Why a change to a project's flags or cohorts was refused, in the terms PostHog's API
//! answers with; `http::error` turns each into its status and body.

use std::fmt;

#[derive(Debug)]
pub enum Error {
    /// The change breaks a rule of PostHog's serializer: 400 `validation_error`.
    Invalid {
        code: &'static str,
        detail: String,
        /// The field at fault (`key`, `filters`, ...), or none for the whole body.
        attr: Option<&'static str>,
    },
    /// A stale `version`, or a hand edit of the file this server has not shown: 409.
    Conflict(String),
    /// No flag or cohort by that id in the project (deleted ones included for flags'
    /// writes, as PostHog keeps them reachable by id until re-created).
    NotFound,
    /// The project already has [`super::MAX_FLAGS_PER_PROJECT`] live flags.
    TooMany(usize),
    /// The file could not be read, parsed or written; nothing was changed.
    Io(String),
}

impl Error {
    pub(super) fn invalid(code: &'static str, detail: impl Into<String>) -> Error {
        Error::Invalid {
            code,
            detail: detail.into(),
            attr: None,
        }
    }

    /// The same error about `attr`, unless it already names a field.
    pub(super) fn at(self, field: &'static str) -> Error {
        match self {
            Error::Invalid { code, detail, attr } => Error::Invalid {
                code,
                detail,
                attr: attr.or(Some(field)),
            },
            other => other,
        }
    }
}

/// A rule of `filters`, with DRF's default code for a plain `ValidationError`.
pub(super) fn filters(detail: impl Into<String>) -> Error {
    Error::invalid("invalid_input", detail).at("filters")
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Invalid { detail, attr, .. } => match attr {
                Some(a) => write!(f, "{a}: {detail}"),
                None => f.write_str(detail),
            },
            Error::Conflict(d) => f.write_str(d),
            Error::NotFound => f.write_str("not found"),
            Error::TooMany(n) => write!(f, "more than {n} flags"),
            Error::Io(e) => write!(f, "flags file: {e}"),
        }
    }
}

impl std::error::Error for Error {}
