//! The one error type of the flags module. A flag file is written by people, so an error
//! must point at the exact place to fix: the file, the flag (or cohort) and the field path,
//! e.g. `flag "beta": filters.groups[1].properties[0].operator: unknown operator "foo"`.
//! The same type carries compile-time warnings (a missing or cyclic dependency), which
//! disable one flag instead of rejecting the file.

use std::fmt;
use std::path::{Path, PathBuf};

use super::vocabulary;

/// What went wrong, independent of where.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The file could not be listed or read.
    Io(String),
    /// A file in the flags directory whose name is not `<project id>.json`.
    FileName,
    /// The bytes are not JSON.
    Json(String),
    /// A required field is absent or null.
    Missing,
    /// A field has the wrong JSON type.
    WrongType { expected: &'static str },
    /// A field has the right type but an unusable value.
    InvalidValue(String),
    /// An operator no flag may use (see `vocabulary::OPERATORS`).
    UnknownOperator(String),
    /// A filter type neither PostHog nor flagpost knows.
    UnknownFilterType(String),
    /// A filter type PostHog's flags service reads but flagpost does not evaluate: it
    /// switches the one flag off (a file from PostHog's feed may hold it).
    UnsupportedFilterType(String),
    /// A field neither flagpost nor PostHog knows (reported by `check` only: serving
    /// ignores it), with the known field it most likely misspells.
    UnknownField { suggestion: Option<String> },
    /// Two live flags share a key.
    DuplicateKey(String),
    /// Warning: a `flag_evaluates_to` filter names no live flag.
    MissingDependency(String),
    /// Warning: a dependency exists but is itself broken.
    BrokenDependency(String),
    /// Warning: the flag is part of, or depends on, a dependency cycle.
    DependencyCycle,
    /// Warning: a cohort filter names a cohort that is absent, cyclic or broken.
    MissingCohort(i64),
    /// Warning: a cohort filter names a cohort using a filter PostHog's flags service does
    /// not evaluate; the text says which field.
    UnsupportedCohort(i64, String),
}

/// What the error is about: the whole file, one flag, or one cohort.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Subject {
    File,
    Flag(String),
    Cohort(String),
}

/// A compile error (the file is rejected) or warning (one flag is disabled).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileError {
    file: Option<PathBuf>,
    subject: Subject,
    field: String,
    kind: ErrorKind,
}

impl CompileError {
    pub(super) fn new(field: String, kind: ErrorKind) -> Self {
        CompileError {
            file: None,
            subject: Subject::File,
            field,
            kind,
        }
    }

    pub(super) fn in_file(path: &Path, kind: ErrorKind) -> Self {
        CompileError::new(String::new(), kind).with_file(path)
    }

    pub(super) fn in_flag(mut self, key: &str) -> Self {
        self.subject = Subject::Flag(key.to_owned());
        self
    }

    pub(super) fn in_cohort(mut self, id: &str) -> Self {
        self.subject = Subject::Cohort(id.to_owned());
        self
    }

    pub fn with_file(mut self, path: &Path) -> Self {
        self.file = Some(path.to_owned());
        self
    }

    /// An operator or filter type that cannot be evaluated. In a cohort (PostHog's
    /// cohorts use operators and types flags do not) it disables the cohort; in a flag's
    /// own conditions only [`ErrorKind::UnsupportedFilterType`] disables the flag, and the
    /// rest are mistakes that refuse the file (see [`CompileError::is_unknown_name`]).
    pub fn is_unsupported(&self) -> bool {
        self.is_unknown_name() || matches!(self.kind, ErrorKind::UnsupportedFilterType(_))
    }

    /// An operator or filter type that no flag may use.
    pub fn is_unknown_name(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::UnknownOperator(_) | ErrorKind::UnknownFilterType(_)
        )
    }

    /// A problem serving lets through with one flag off that is nonetheless a mistake no
    /// PostHog-written file holds (PostHog's API refuses both), so a file with it is
    /// refused and its previous rules kept, as `flagpost check` refuses it.
    pub fn is_mistake(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::MissingDependency(_) | ErrorKind::DependencyCycle
        )
    }

    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// The flag key the error is about, if it is about one flag.
    pub fn flag(&self) -> Option<&str> {
        match &self.subject {
            Subject::Flag(key) => Some(key),
            _ => None,
        }
    }

    /// The dotted path of the field at fault, relative to the flag or cohort.
    pub fn field(&self) -> &str {
        &self.field
    }

    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Io(msg) => write!(f, "cannot read: {msg}"),
            ErrorKind::FileName => f.write_str("file name is not <project id>.json"),
            ErrorKind::Json(msg) => write!(f, "invalid JSON: {msg}"),
            ErrorKind::Missing => f.write_str("missing"),
            ErrorKind::WrongType { expected } => write!(f, "expected {expected}"),
            ErrorKind::InvalidValue(msg) => f.write_str(msg),
            ErrorKind::UnknownOperator(op) => match vocabulary::hint(op) {
                Some(hint) => write!(f, "unknown operator {op:?} ({hint})"),
                None => write!(f, "unknown operator {op:?}"),
            },
            ErrorKind::UnknownFilterType(t) => {
                let known = [vocabulary::PROPERTY_TYPES, vocabulary::UNEVALUATED_TYPES].concat();
                match vocabulary::closest(t, &known) {
                    Some(k) => write!(f, "unknown filter type {t:?} (did you mean {k:?}?)"),
                    None => write!(f, "unknown filter type {t:?}"),
                }
            }
            ErrorKind::UnsupportedFilterType(t) => {
                write!(
                    f,
                    "filter type {t:?} is PostHog's, but flagpost does not evaluate it"
                )
            }
            ErrorKind::UnknownField { suggestion: None } => f.write_str("unknown field"),
            ErrorKind::UnknownField {
                suggestion: Some(known),
            } => write!(f, "unknown field (did you mean {known:?}?)"),
            ErrorKind::DuplicateKey(key) => write!(f, "duplicate flag key {key:?}"),
            ErrorKind::MissingDependency(key) => {
                write!(f, "depends on flag {key:?}, which does not exist")
            }
            ErrorKind::BrokenDependency(key) => {
                write!(f, "depends on flag {key:?}, which cannot be evaluated")
            }
            ErrorKind::DependencyCycle => f.write_str("part of or depends on a dependency cycle"),
            ErrorKind::UnsupportedCohort(id, why) => {
                write!(f, "cohort {id} cannot be evaluated: {why}")
            }
            ErrorKind::MissingCohort(id) => {
                write!(
                    f,
                    "cohort {id} is missing, cyclic or refers to a missing cohort"
                )
            }
        }
    }
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}: ", file.display())?;
        }
        match &self.subject {
            Subject::File => {}
            Subject::Flag(key) => write!(f, "flag {key:?}: ")?,
            Subject::Cohort(id) => write!(f, "cohort {id}: ")?,
        }
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        write!(f, "{}", self.kind)
    }
}

impl std::error::Error for CompileError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_file_flag_and_field() {
        let err = CompileError::new(
            "filters.groups[1].properties[0].operator".into(),
            ErrorKind::UnknownOperator("foo".into()),
        )
        .in_flag("beta");
        assert_eq!(
            err.to_string(),
            r#"flag "beta": filters.groups[1].properties[0].operator: unknown operator "foo""#
        );
        let err = err.with_file(Path::new("data/flags/3.json"));
        assert_eq!(
            err.to_string(),
            r#"data/flags/3.json: flag "beta": filters.groups[1].properties[0].operator: unknown operator "foo""#
        );
        assert_eq!(err.flag(), Some("beta"));
    }

    #[test]
    fn display_of_file_level_and_cohort_errors() {
        let err = CompileError::in_file(Path::new("flags/x.json"), ErrorKind::FileName);
        assert_eq!(
            err.to_string(),
            "flags/x.json: file name is not <project id>.json"
        );
        let err = CompileError::new("values[0].type".into(), ErrorKind::Missing).in_cohort("42");
        assert_eq!(err.to_string(), "cohort 42: values[0].type: missing");
    }
}
