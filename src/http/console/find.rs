//! Finding things in the console: persons ([`super::persons`]) and events searched
//! with a property test ([`super::super::matching`], PostHog's, shared with the read
//! API's `properties`), and the property names and values the forms offer.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use hyper::{HeaderMap, Response, StatusCode};
use serde_json::{json, Map, Value};

use super::super::api::{self, Resource};
use super::super::error::ApiError;
use super::super::params::Params;
use super::super::properties::Filters;
use super::super::response::{self, Body};
use super::insights::blocking;
use crate::app::App;
use crate::persons::Person;
use crate::store::query;

pub use super::super::matching::{ColumnTest, EventsPage, Matcher, MAX_BLOCKS_EXAMINED};

/// What the property suggestions sample: the newest events and the first persons in
/// id order (hash order for most ids, so close to a random sample).
const SAMPLE: usize = 2_000;
/// Values a suggestion list offers at most, the most frequent first.
const SUGGESTED_VALUES: usize = 50;

/// The project's stored persons in id order; one that cannot be decoded is None.
pub fn persons_of(
    trees: &crate::store::Trees,
    project: u64,
) -> impl Iterator<Item = Result<Option<Person>, sled::Error>> {
    trees
        .persons
        .scan_prefix(crate::store::keys::project(project))
        .map(|entry| entry.map(|(_, bytes)| serde_json::from_slice::<Person>(&bytes).ok()))
}

/// `events?...` as the read API answers it (`properties` too), plus
/// `property`/`operator`/`value`: the page holds the matches in the next
/// [`MAX_BLOCKS_EXAMINED`] blocks read, and `next` goes on below the last event
/// examined.
pub async fn events(
    app: &Arc<App>,
    project: u64,
    headers: &HeaderMap,
    path: &str,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let params = Params::parse(query);
    let Some(matcher) = Matcher::from_params(&params)? else {
        return api::serve(app, project, Resource::Events, headers, path, query).await;
    };
    let filters = Filters::from_params(&params)?.unwrap_or_default();
    let filter = params.filter()?;
    let limit = params.limit()?;
    let cursor = params.cursor()?;
    let open = app.store.get().ok_or(ApiError::Storage)?;
    let test = filters.and(matcher).test(open.clone(), project);
    let page = api::tested_page(open, project, filter, cursor, limit, test).await?;
    let next =
        (page.next).map(|key| api::next_url(app, headers, path, query, &crate::support::hex(&key)));
    Ok(response::json(
        StatusCode::OK,
        &json!({"results": page.events, "next": next, "examined": page.examined}),
    ))
}

/// `properties?of=events|persons[&key=K]`: the property names seen in a sample of
/// the newest events (or of the persons), most common first; with `key`, that
/// property's most common values there. `$`-names are PostHog's own and listed too.
pub async fn properties(
    app: &Arc<App>,
    project: u64,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let params = Params::parse(query);
    let of_persons = match params.get("of").unwrap_or("events") {
        "events" => false,
        "persons" => true,
        _ => return Err(ApiError::BadQuery("of must be events or persons".into())),
    };
    let key = params.get("key").map(str::to_owned);
    let open = app.store.get().ok_or(ApiError::Storage)?;
    let (names, values) = blocking(move || {
        let mut names: HashMap<String, u64> = HashMap::new();
        let mut values: HashMap<String, u64> = HashMap::new();
        let mut tally = |props: &Map<String, Value>| {
            for (k, v) in props {
                *names.entry(k.clone()).or_default() += 1;
                if key.as_deref() == Some(k.as_str()) {
                    let text = match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    *values.entry(text).or_default() += 1;
                }
            }
        };
        if of_persons {
            for person in persons_of(&open.trees, project).take(SAMPLE) {
                if let Some(p) = person? {
                    tally(&p.properties);
                }
            }
        } else {
            let all = query::EventFilter {
                after: None,
                before: None,
                event: None,
                distinct_id: None,
                person_id: None,
            };
            for entry in query::events(&open.trees, project, all, None).take(SAMPLE) {
                tally(&entry?.1.properties);
            }
        }
        Ok((
            most_first(names, usize::MAX),
            most_first(values, SUGGESTED_VALUES),
        ))
    })
    .await?;
    Ok(response::json(
        StatusCode::OK,
        &json!({"names": names, "values": values, "sampled": SAMPLE}),
    ))
}

/// The keys, most counted first (ties by name), at most `n`.
fn most_first(counts: HashMap<String, u64>, n: usize) -> Vec<String> {
    let mut by: BTreeMap<(Reverse<u64>, String), ()> = BTreeMap::new();
    for (k, c) in counts {
        by.insert((Reverse(c), k), ());
    }
    by.into_keys().take(n).map(|(_, k)| k).collect()
}

#[cfg(test)]
#[path = "tests/find.rs"]
mod tests;
