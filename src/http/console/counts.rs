//! Event counts over time for the insights chart and table: per bucket (an hour or a
//! day) each event's total and unique persons, and over the whole range the total and
//! the unique persons of the range itself. The range's unique persons are the union
//! of the buckets' persons (the hours' sketches merged, exact up to 128 persons), never
//! the buckets' counts added: a person seen on three days is one person of the week.
//!
//! A range is `from`/`to` (instants; the page sends the browser's local midnights, so
//! "today" and "yesterday" are the viewer's) or `hours` back from now. Buckets start at
//! the hour `from` falls in and step by the interval, so a day bucket runs from local
//! midnight to local midnight wherever the viewer's offset is whole hours.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::super::error::ApiError;
use super::super::response::{self, Body};
use super::insights::{blocking, describe, scan};
pub use super::range::{Range, DAY_MS, HOUR_MS};
use crate::app::App;
use crate::http::params::Params;
use crate::store::rollup::{self, hour_of, sketch, Sketch, Status};
use crate::store::Trees;

/// Events charted at once at most: a legend past this is unreadable anyway.
const MAX_SERIES: usize = 10;

/// Each event's totals and unique persons per bucket, and over the whole range.
struct Counted {
    total: Vec<u64>,
    unique: Vec<u64>,
    range_unique: u64,
}

/// `?event=a&event=b&interval=hour|day` and a [`Range`]: per bucket, each event's
/// count and its unique persons (an event without a person counts its distinct id),
/// then the range's. Buckets are counted whole, the current one too.
pub async fn counts(
    app: &Arc<App>,
    project: u64,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let params = Params::parse(query);
    let now = crate::support::clock::now_ms();
    let range = Range::parse(&params, now)?;
    let step = match params.get("interval").unwrap_or("day") {
        "hour" => HOUR_MS,
        "day" => DAY_MS,
        _ => return Err(ApiError::BadQuery("interval must be hour or day".into())),
    };
    let mut events = params.all("event");
    events.dedup();
    if events.is_empty() || events.len() > MAX_SERIES {
        return Err(ApiError::BadQuery(format!(
            "name 1 to {MAX_SERIES} events with event="
        )));
    }
    let first = hour_of(range.from);
    let buckets: Vec<i64> = (0..)
        .map(|i| first + i * step)
        .take_while(|t| *t < range.to)
        .collect();
    // Held for the request: a reopen of the database waits for it.
    let open = app.store.get().ok_or(ApiError::Storage)?;
    let n = buckets.len();
    let names = events.clone();
    let (mut counted, status) = blocking(move || {
        let trees = &open.trees;
        let status = rollup::status(&trees.meta)?;
        let counted = match status {
            Status::Ready => {
                let mut out = HashMap::new();
                for name in names {
                    let c = from_rollups(&trees.rollups, project, &name, (first, step, n))?;
                    out.insert(name, c);
                }
                out
            }
            Status::Building(_) => by_scan(trees, project, &names, (first, step, n))?,
        };
        Ok((counted, status))
    })
    .await?;
    let series: Vec<Value> = events
        .iter()
        .map(|e| {
            let c = counted.remove(e).unwrap_or_else(|| Counted {
                total: vec![0; n],
                unique: vec![0; n],
                range_unique: 0,
            });
            json!({"event": e, "range_total": c.total.iter().sum::<u64>(),
                   "range_unique": c.range_unique, "total": c.total, "unique": c.unique})
        })
        .collect();
    let times: Vec<String> = buckets
        .iter()
        .map(|t| crate::support::clock::format_ms(*t))
        .collect();
    let end = first + step * n as i64;
    Ok(response::json(
        StatusCode::OK,
        &json!({"interval_seconds": step / 1000, "buckets": times,
                "from": crate::support::clock::format_ms(first),
                "to": crate::support::clock::format_ms(end),
                "series": series, "rollups": describe(status)}),
    ))
}

/// One event's buckets from its hours' rollups: counts add, sketches merge, and every
/// hour's sketch also merges into the range's.
fn from_rollups(
    tree: &rollup::Rollups,
    project: u64,
    name: &str,
    (first, step, n): (i64, i64, usize),
) -> Result<Counted, sled::Error> {
    let mut total = vec![0u64; n];
    let mut sketches = vec![Sketch::default(); n];
    let mut whole = Sketch::default();
    let end = first.saturating_add(step.saturating_mul(n as i64));
    for (hour, count, sketch) in rollup::events(tree, project, name, first, end)? {
        let Some(i) = usize::try_from((hour - first) / step)
            .ok()
            .filter(|i| *i < n)
        else {
            continue;
        };
        total[i] += count;
        sketches[i].merge(&sketch);
        whole.merge(&sketch);
    }
    Ok(Counted {
        total,
        unique: sketches.iter().map(Sketch::estimate).collect(),
        range_unique: whole.estimate(),
    })
}

/// [`counts`] from the stored events themselves, while the rollups are being built:
/// exact, persons told apart as the rollups tell them ([`sketch::who`]).
fn by_scan(
    trees: &Trees,
    project: u64,
    names: &[String],
    (first, step, n): (i64, i64, usize),
) -> Result<HashMap<String, Counted>, sled::Error> {
    let wanted: HashSet<&String> = names.iter().collect();
    let mut totals: HashMap<String, Vec<u64>> = HashMap::new();
    let mut seen: HashMap<String, (Vec<HashSet<u64>>, HashSet<u64>)> = HashMap::new();
    let end = first.saturating_add(step.saturating_mul(n as i64));
    scan(trees, project, first, end, |e| {
        if !wanted.contains(&e.event) {
            return;
        }
        let Some(i) = usize::try_from((e.timestamp - first) / step)
            .ok()
            .filter(|i| *i < n)
        else {
            return;
        };
        totals.entry(e.event.clone()).or_insert_with(|| vec![0; n])[i] += 1;
        let who = sketch::who(e.person_id, &e.distinct_id);
        let (buckets, whole) = seen
            .entry(e.event.clone())
            .or_insert_with(|| (vec![HashSet::new(); n], HashSet::new()));
        buckets[i].insert(who);
        whole.insert(who);
    })?;
    Ok(totals
        .into_iter()
        .map(|(k, total)| {
            let (buckets, whole) = seen.remove(&k).unwrap_or_default();
            let unique = buckets.iter().map(|s| s.len() as u64).collect();
            let range_unique = whole.len() as u64;
            (
                k,
                Counted {
                    total,
                    unique,
                    range_unique,
                },
            )
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_from_to_or_hours_back() {
        let now = 10 * DAY_MS + 5 * HOUR_MS + 123;
        let p = Params::parse(Some("hours=3"));
        assert_eq!(
            Range::parse(&p, now).unwrap(),
            Range {
                from: now - 3 * HOUR_MS,
                to: now
            }
        );
        let p = Params::parse(Some("from=1970-01-02T00:00:00Z&to=1970-01-03T00:00:00Z"));
        let r = Range::parse(&p, now).unwrap();
        assert_eq!((r.from, r.to), (DAY_MS, 2 * DAY_MS));
        assert_eq!(r.hours(), (DAY_MS, 2 * DAY_MS));
        let p = Params::parse(Some(&format!("from={}", DAY_MS + 90)));
        let r = Range::parse(&p, now).unwrap();
        assert_eq!(r.hours(), (DAY_MS, hour_of(now) + HOUR_MS));
        for bad in [
            "from=2&to=1",
            "from=x",
            "hours=0",
            "hours=2161",
            "from=0&to=8553600000",
        ] {
            assert!(
                matches!(
                    Range::parse(&Params::parse(Some(bad)), now),
                    Err(ApiError::BadQuery(_))
                ),
                "{bad}"
            );
        }
    }
}
