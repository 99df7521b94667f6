//! The time relative dates (`-7d`) count back from. In production that is the system
//! clock; the differential tests against PostHog's SDKs pin it with `FLAGPOST_TEST_NOW`
//! (RFC 3339, read once at the first request), so both sides resolve `-1m` from the same
//! instant, month ends included. A value that does not parse is ignored with a warning.

use std::sync::OnceLock;

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// The environment variable that pins the flags clock, for tests only.
const TEST_NOW_VAR: &str = "FLAGPOST_TEST_NOW";

/// The instant evaluations treat as now.
pub fn now() -> OffsetDateTime {
    static PINNED: OnceLock<Option<OffsetDateTime>> = OnceLock::new();
    let pinned = PINNED.get_or_init(|| {
        let text = std::env::var(TEST_NOW_VAR).ok()?;
        match OffsetDateTime::parse(&text, &Rfc3339) {
            Ok(at) => {
                tracing::warn!(now = %text, "flag evaluation clock pinned by {TEST_NOW_VAR}");
                Some(at)
            }
            Err(error) => {
                tracing::warn!(%error, value = %text, "{TEST_NOW_VAR} ignored: not RFC 3339");
                None
            }
        }
    });
    pinned.unwrap_or_else(OffsetDateTime::now_utc)
}
