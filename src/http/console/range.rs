//! The range of time a console read covers, from its query: `from`/`to` or `hours`
//! back from now, bounded so a read stays a bounded number of rollup keys.

use super::super::error::ApiError;
use crate::http::params::Params;
use crate::store::rollup::hour_of;

pub const HOUR_MS: i64 = 3_600_000;
pub const DAY_MS: i64 = 24 * HOUR_MS;
/// The longest range: the rollups' reads are one key range per event and hour, so
/// this bounds a request to 2,160 keys per event (plus a day's slack for a local
/// midnight before the 90th day's UTC one).
const MAX_RANGE_MS: i64 = 91 * DAY_MS;
/// `hours` when neither it nor a range is given: a day.
const DEFAULT_HOURS: i64 = 24;

/// A range of time the insights read: `from <= t < to`, unix milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Range {
    pub from: i64,
    pub to: i64,
}

impl Range {
    /// `from`/`to` (ISO 8601 or unix ms; `to` defaults to now) or `hours` back from
    /// `now` (1 to 2,160; 24 when nothing is given).
    pub fn parse(params: &Params, now: i64) -> Result<Range, ApiError> {
        let time = |key: &'static str| -> Result<Option<i64>, ApiError> {
            params
                .get(key)
                .map(|v| {
                    v.parse::<i64>()
                        .ok()
                        .or_else(|| crate::capture::timestamp::parse_ms(v))
                        .ok_or_else(|| {
                            ApiError::BadQuery(format!(
                                "{key} must be an ISO 8601 time or unix milliseconds"
                            ))
                        })
                })
                .transpose()
        };
        let Some(from) = time("from")? else {
            let hours = match params.get("hours") {
                None => DEFAULT_HOURS,
                Some(v) => v
                    .parse::<i64>()
                    .ok()
                    .filter(|h| (1..=90 * 24).contains(h))
                    .ok_or_else(|| ApiError::BadQuery("hours must be 1 to 2160".into()))?,
            };
            return Ok(Range {
                from: now - hours * HOUR_MS,
                to: now,
            });
        };
        let to = time("to")?.unwrap_or(now);
        if to <= from {
            return Err(ApiError::BadQuery("to must be after from".into()));
        }
        if to - from > MAX_RANGE_MS {
            return Err(ApiError::BadQuery("a range is at most 90 days".into()));
        }
        Ok(Range { from, to })
    }

    /// The whole hours covering the range: what the rollups hold.
    pub fn hours(&self) -> (i64, i64) {
        (hour_of(self.from), hour_of(self.to - 1) + HOUR_MS)
    }
}
