//! The server's version (`SELECT version()`) and what follows from it: which of the
//! two table shapes the sink creates and writes. Current ClickHouse gets PostHog's own
//! column types; servers older than [`CURRENT`] (Debian's 18.16 among them) get a
//! narrow shape without the types and settings they lack.

/// From here on a server has everything PostHog's schema uses: `DateTime64`
/// (19.19/20.1), `cityHash64` of a UUID, `insert_deduplication_token` and
/// `non_replicated_deduplication_window` (22.2). 22.3 is the first long-term-support
/// release with all of them.
pub const CURRENT: Version = Version {
    major: 22,
    minor: 3,
};

/// A server version's first two numbers, which is all the schema depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
}

impl Version {
    /// Parse what `SELECT version()` answers, like `18.16.1` or `24.8.4.13`.
    pub fn parse(text: &str) -> Option<Version> {
        let mut parts = text.trim().split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some(Version { major, minor })
    }

    pub fn shape(self) -> Shape {
        if self >= CURRENT {
            Shape::Current
        } else {
            Shape::Narrow
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Which table shape a server gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// PostHog's column types: `DateTime64(6, 'UTC')` times, events ordered by
    /// `cityHash64(uuid)`, and a deduplication token on every insert.
    Current,
    /// For servers before [`CURRENT`]: whole-second `DateTime('UTC')` times with the
    /// exact instant beside them in an `Int64` of Unix milliseconds (`timestamp_ms`,
    /// `created_at_ms`), events ordered by the uuid itself, and no insert tokens
    /// (re-sent rows still collapse in the replacing engines).
    Narrow,
}

impl Shape {
    /// Whether inserts carry `insert_deduplication_token`, so a re-sent batch is
    /// dropped whole by the server instead of collapsing later in a merge.
    pub fn dedup_token(self) -> bool {
        self == Shape::Current
    }

    /// The settings an insert of this shape carries beside its statement (URL
    /// parameters over HTTP): on current servers, the batch's deduplication `token`,
    /// and `async_insert = 0`. A server whose defaults or user profile turn
    /// asynchronous inserts on (the 26.9 engine the tests run reports them on) would
    /// queue the insert for batching: the sink's batches are large already, the queue
    /// would only delay the acknowledgement, and a queued insert's deduplication
    /// follows other settings (`async_insert_deduplicate`). A synchronous insert is
    /// dropped by its token (tests/integration/sink/current.rs checks it on 26.9).
    pub fn insert_settings(self, token: &str) -> Vec<(&'static str, &str)> {
        match self {
            Shape::Current => vec![("insert_deduplication_token", token), ("async_insert", "0")],
            Shape::Narrow => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_chooses() {
        let old = Version::parse("18.16.1\n").unwrap();
        assert_eq!(
            old,
            Version {
                major: 18,
                minor: 16
            }
        );
        assert_eq!(old.shape(), Shape::Narrow);
        assert_eq!(Version::parse("22.2.3.5").unwrap().shape(), Shape::Narrow);
        assert_eq!(Version::parse("22.3.1").unwrap().shape(), Shape::Current);
        assert_eq!(Version::parse("24.8.4.13").unwrap().shape(), Shape::Current);
        assert_eq!(Version::parse("x.1"), None);
        assert_eq!(Version::parse("23"), None);
    }

    #[test]
    fn only_current_inserts_carry_settings() {
        assert_eq!(
            Shape::Current.insert_settings("node-1-2-events"),
            [
                ("insert_deduplication_token", "node-1-2-events"),
                ("async_insert", "0")
            ]
        );
        // 18.16 refuses a setting it does not know.
        assert!(Shape::Narrow.insert_settings("node-1-2-events").is_empty());
    }
}
