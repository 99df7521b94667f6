//! The console's persons list: newest first through the persons' first-seen index
//! ([`crate::store::first_seen`]), a page at a time from a cursor (an index key), so a
//! page costs its own persons however many are stored. Searches use what is cheap: an
//! exact distinct id or a distinct id prefix reads the distinct-id table in key order.
//! A property test (of any key but `distinct_id`) first walks the persons newest first,
//! reading each one's bytes for the property alone ([`PersonTest`]), for [`WALK_FIRST`]
//! persons: a value many persons have fills a page there. Past them it answers from the
//! index of persons by property ([`by_property`]): the key's entries read in place from
//! the index's blocks (a block that cannot hold a passing value left unread, known from
//! its bytes or from the note an earlier search made of it: see
//! [`by_property::Sieve`]), each distinct value tested once, and for a test that
//! persons without the key pass (the negative operators, `is_not_set`, as PostHog's
//! persons query passes them: HogQL reads a missing property as NULL and wraps `!=`,
//! `NOT ILIKE` and `NOT match` in `ifNull(..., 1)`) the persons the key's entries do
//! not name (none when the index's counts say every person holds the key; the walk
//! answers when they say an entry is stale); the persons of those checked against their
//! bytes as the walk checks them, newest first: complete in one request however rare
//! the match. Other tests (`distinct_id`, a key too long to be indexed, and any test
//! while that index is still being built for an older database) walk, stopping after
//! [`MAX_PERSONS_EXAMINED`] per request, saying how many were examined and where to go
//! on. While an older database's first-seen index is still being built, the list falls
//! back to a bounded scan of every person.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use hyper::{HeaderMap, Response, StatusCode};
use serde_json::{json, Value};

use super::super::api::{self, person_json, Resource};
use super::super::error::ApiError;
use super::super::params::Params;
use super::super::response::{self, Body};
use super::find::Matcher;
use super::insights::blocking;
use crate::app::App;
use crate::persons::Person;
use crate::store::by_property::{self, Sieve};
use crate::store::layered::successor;
use crate::store::{first_seen, keys, person_bytes, person_probe, Trees};
use crate::support::hex;

/// Persons a property search examines per request at most; the answer then says
/// where to go on. At this bound a request reads about 30 MB of persons at random
/// (`cargo bench --bench console_persons`, BENCHMARKS.md has the figures).
pub const MAX_PERSONS_EXAMINED: usize = 20_000;
/// Persons a search that the index of persons by property can answer walks first: a
/// value one person in 20 has fills a page of 50 within them, in a few milliseconds;
/// a rarer one is read from the index.
pub const WALK_FIRST: usize = 1_000;
/// Persons the scan without the index examines at most (while an older database's
/// index is built); past it the answer says it is incomplete.
pub const MAX_PERSONS_SCANNED: usize = 1_000_000;
/// A page of persons.
const PERSONS_PAGE: usize = 50;
/// Persons a list pages through by `offset` at most; a cursor goes on from anywhere.
const MAX_PERSONS_OFFSET: usize = 10_000;
/// Distinct ids a prefix search reads per request at most (a person may have many).
const MAX_IDS_EXAMINED: usize = 1_000;

/// One page: the persons, how many were examined, whether the end was reached, and
/// the key to go on after (none at the end).
pub struct Page {
    pub persons: Vec<Person>,
    pub examined: usize,
    pub complete: bool,
    pub next: Option<Vec<u8>>,
}

/// `persons?distinct_id=` as the read API answers it; `?distinct_id_prefix=` the
/// persons with a distinct id starting so, in distinct id order; otherwise a page of
/// persons, newest first, only those passing the property test if one is given:
/// `{"results", "next_cursor", "next_offset", "scanned", "complete", "indexed"}`.
pub async fn persons(
    app: &Arc<App>,
    project: u64,
    headers: &HeaderMap,
    path: &str,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let params = Params::parse(query);
    if params.get("distinct_id").is_some() {
        return api::serve(app, project, Resource::Persons, headers, path, query).await;
    }
    let prefix = params.get("distinct_id_prefix").map(str::to_owned);
    let matcher = Matcher::from_params(&params)?;
    let offset = params.number("offset", 0)?;
    let limit = params.number("limit", PERSONS_PAGE)?.clamp(1, 200);
    let cursor = params.cursor()?;
    if offset + limit > MAX_PERSONS_OFFSET {
        return Err(ApiError::BadQuery(format!(
            "a list goes {MAX_PERSONS_OFFSET} persons deep by offset at most; page on with the cursor"
        )));
    }
    // Held for the request: a reopen of the database waits for it.
    let open = app.store.get().ok_or(ApiError::Storage)?;
    let (page, indexed) = blocking(move || {
        let trees = &open.trees;
        if let Some(prefix) = prefix {
            return Ok((by_prefix(trees, project, &prefix, cursor, limit)?, true));
        }
        if !first_seen::ready(&trees.meta)? {
            let (mut persons, examined, complete) =
                newest_persons(trees, project, matcher.as_ref(), offset + limit)?;
            let more = persons.len() == offset + limit;
            persons.drain(..offset.min(persons.len()));
            let page = Page {
                persons,
                examined,
                complete: complete && !more,
                next: None,
            };
            return Ok((page, false));
        }
        let span = Span {
            cursor,
            offset,
            limit,
            examine: MAX_PERSONS_EXAMINED,
        };
        if let Some(m) = matcher.as_ref().filter(|m| indexed(trees, project, m)) {
            let walk = Span {
                examine: WALK_FIRST,
                ..span.clone()
            };
            let first = newest(trees, project, Some(m), walk)?;
            if first.complete || first.persons.len() >= limit {
                return Ok((first, true));
            }
            return Ok((by_index(trees, project, m, span)?, true));
        }
        let page = newest(trees, project, matcher.as_ref(), span)?;
        Ok((page, true))
    })
    .await?;
    let results: Vec<Value> = page.persons.iter().map(person_json).collect();
    // A request that paged by offset is answered with the next offset too.
    let by_offset = params.get("cursor").is_none() && params.get("distinct_id_prefix").is_none();
    let next_offset = (by_offset && !page.complete).then_some(offset + limit);
    Ok(response::json(
        StatusCode::OK,
        &json!({"results": results, "next_cursor": page.next.as_deref().map(hex),
                "next_offset": next_offset, "scanned": page.examined,
                "complete": page.complete, "indexed": indexed}),
    ))
}

/// Where a page starts and how much it holds and may examine.
#[derive(Debug, Clone)]
pub struct Span {
    /// The index key to go on after.
    pub cursor: Option<Vec<u8>>,
    /// Persons passing the test to skip first.
    pub offset: usize,
    pub limit: usize,
    /// Persons a test examines at most ([`MAX_PERSONS_EXAMINED`]).
    pub examine: usize,
}

/// A page of the project's persons newest first, only those passing `matcher`; a
/// test stops after `span.examine` persons.
pub fn newest(
    trees: &Trees,
    project: u64,
    matcher: Option<&Matcher>,
    span: Span,
) -> Result<Page, sled::Error> {
    let Span {
        cursor,
        offset,
        limit,
        examine,
    } = span;
    let mut page = Page {
        persons: Vec::with_capacity(limit),
        examined: 0,
        complete: true,
        next: None,
    };
    let mut skipped = 0;
    let mut last = None;
    let test = PersonTest::new(matcher);
    for entry in first_seen::newest_stored(trees, project, cursor.as_deref()) {
        let (key, created_at, bytes) = entry?;
        let Some((born, passes)) = test.test(&bytes) else {
            continue;
        };
        // A stale index key (see `first_seen`) names another person.
        if born != created_at {
            continue;
        }
        page.examined += 1;
        last = Some(key);
        if passes {
            if skipped < offset {
                skipped += 1;
            } else if let Ok(person) = serde_json::from_slice::<Person>(&bytes) {
                page.persons.push(person);
            }
        }
        let searched_enough = matcher.is_some() && page.examined >= examine;
        if page.persons.len() >= limit || searched_enough {
            page.complete = false;
            break;
        }
    }
    if !page.complete {
        page.next = last.map(|k| k.to_vec());
        // A full page at the very end: one more key says whether anything follows.
        if let Some(after) = &page.next {
            if first_seen::newest(trees, project, Some(after))
                .next()
                .is_none()
            {
                page.complete = true;
                page.next = None;
            }
        }
    }
    Ok(page)
}

/// Whether the index of persons by property answers `matcher` in `project`: it is
/// built, and the test reads the property alone (not `distinct_id`, which reads the
/// person's first distinct id when the property is absent).
fn indexed(trees: &Trees, project: u64, matcher: &Matcher) -> bool {
    matcher.key() != "distinct_id"
        && by_property::key_prefix(project, matcher.key()).is_some()
        && by_property::ready(&trees.meta).unwrap_or(false)
}

/// A page of the persons passing `matcher` (one [`indexed`] answers) newest first,
/// from the index of persons by property: the candidates are checked against the
/// persons' bytes as the walk checks them, so the page is the walk's, complete. Where
/// the index cannot answer (a test persons without the key pass, and a stale entry of
/// the key that could hide one of them), the page is the walk's.
pub fn by_index(
    trees: &Trees,
    project: u64,
    matcher: &Matcher,
    span: Span,
) -> Result<Page, sled::Error> {
    let after = span.cursor.as_deref();
    let absent_passes = !matcher.needs_key();
    let sieve = (matcher.needle().map(Sieve::Holds)).or(matcher.excluded().map(Sieve::Lacks));
    let may_pass = |text: &[u8], cut: bool| value_may_pass(matcher, text, cut);
    let key = matcher.key();
    let places =
        by_property::candidates(trees, project, key, after, absent_passes, sieve, may_pass)?;
    let Some(places) = places else {
        return newest(trees, project, Some(matcher), span);
    };
    let test = PersonTest::new(Some(matcher));
    let mut page = Page {
        persons: Vec::with_capacity(span.limit),
        examined: 0,
        complete: true,
        next: None,
    };
    let mut skipped = 0;
    let mut last = None;
    for place in places {
        let Some((created_at, id)) = keys::split_first_seen(&place) else {
            continue;
        };
        let key = keys::with_uuid(project, id);
        let Some(bytes) = person_bytes::global().get(&trees.persons, &key) else {
            continue;
        };
        page.examined += 1;
        // A stale entry (see `by_property`) names a value or a first event the person
        // no longer has.
        if test.test(&bytes) != Some((created_at, true)) {
            continue;
        }
        if page.persons.len() >= span.limit {
            page.complete = false;
            page.next = last;
            break;
        }
        last = Some(place.to_vec());
        if skipped < span.offset {
            skipped += 1;
        } else if let Ok(person) = serde_json::from_slice::<Person>(&bytes) {
            page.persons.push(person);
        }
    }
    Ok(page)
}

/// The test of the values in the index: whether persons whose value of the tested key
/// has the JSON text `text` (its start, if `cut`) may pass. A cut value may, as may one
/// that does not parse; they are checked against the person. (What the text's bytes
/// tell of an `icontains` or `not_icontains` test is told before: [`Sieve`].)
fn value_may_pass(matcher: &Matcher, text: &[u8], cut: bool) -> bool {
    if cut {
        return true;
    }
    match serde_json::from_slice::<Value>(text) {
        Ok(value) => matcher.matches_value("", Some(value)),
        Err(_) => true,
    }
}

/// A property test of stored persons read from their bytes: only the tested property
/// is decoded ([`person_probe`]), and a person without the key that the test needs
/// is not decoded past its first event's time.
struct PersonTest<'m> {
    matcher: Option<&'m Matcher>,
    /// The key's text, when persons without it cannot pass.
    needle: Option<person_probe::Needle>,
}

impl<'m> PersonTest<'m> {
    fn new(matcher: Option<&'m Matcher>) -> PersonTest<'m> {
        let needle = matcher
            .filter(|m| m.needs_key())
            .map(|m| person_probe::Needle::new(m.key()));
        PersonTest { matcher, needle }
    }

    /// The person's first event and whether it passes (every person does without a
    /// test); None if the bytes are not a person's.
    fn test(&self, bytes: &[u8]) -> Option<(i64, bool)> {
        let Some(m) = self.matcher else {
            return Some((born(bytes)?, true));
        };
        // `distinct_id` reads the person's first distinct id when the key is absent.
        if m.key() == "distinct_id" {
            let person = serde_json::from_slice::<Person>(bytes).ok()?;
            let id = person.distinct_ids.first().map_or("", String::as_str);
            return Some((person.created_at, m.matches(id, &person.properties)));
        }
        if self.needle.as_ref().is_some_and(|n| !n.may_be_in(bytes)) {
            return Some((born(bytes)?, false));
        }
        let mut probe = person_probe::probe(bytes, &[m.key()])?;
        let value = probe.properties.remove(m.key());
        Some((probe.created_at, m.matches_value("", value)))
    }
}

/// A stored person's first event, read where serde_json puts it, else by a probe;
/// None if the bytes are not a person's.
fn born(bytes: &[u8]) -> Option<i64> {
    match person_probe::glance(bytes) {
        Some(glance) => Some(glance.created_at),
        None => Some(person_probe::probe(bytes, &[])?.created_at),
    }
}

/// The persons having a distinct id that starts with `prefix`, in distinct id order,
/// from after the distinct-id key `cursor`; each person once a page.
pub fn by_prefix(
    trees: &Trees,
    project: u64,
    prefix: &str,
    cursor: Option<Vec<u8>>,
    limit: usize,
) -> Result<Page, sled::Error> {
    let start = keys::with_str(project, prefix);
    let from = match cursor {
        Some(c) if c.starts_with(&start) => std::ops::Bound::Excluded(c),
        _ => std::ops::Bound::Included(start.clone()),
    };
    let to = match successor(&start) {
        Some(end) => std::ops::Bound::Excluded(end),
        None => std::ops::Bound::Unbounded,
    };
    let mut page = Page {
        persons: Vec::new(),
        examined: 0,
        complete: true,
        next: None,
    };
    for entry in trees.distinct_ids.range((from, to)) {
        let (key, value) = entry?;
        page.examined += 1;
        let person = match uuid::Uuid::from_slice(&value) {
            Ok(id) => trees.persons.get(keys::with_uuid(project, id))?,
            Err(_) => None,
        };
        if let Some(p) = person.and_then(|b| serde_json::from_slice::<Person>(&b).ok()) {
            if !page.persons.iter().any(|q| q.id == p.id) {
                page.persons.push(p);
            }
        }
        if page.persons.len() >= limit || page.examined >= MAX_IDS_EXAMINED {
            page.complete = false;
            page.next = Some(key.to_vec());
            break;
        }
    }
    Ok(page)
}

/// A stored person's first event, read without building the rest of it: a list
/// without a test needs nothing else until it knows which persons it keeps.
#[derive(serde::Deserialize)]
struct Born {
    created_at: i64,
}

/// Without the index: the `keep` newest persons passing the test, newest first, by a
/// scan of every person; how many were examined and whether that was all of them.
pub fn newest_persons(
    trees: &Trees,
    project: u64,
    matcher: Option<&Matcher>,
    keep: usize,
) -> Result<(Vec<Person>, usize, bool), sled::Error> {
    // A min-heap of the newest so far, by first event then key: the oldest of them
    // is the one to drop.
    let mut heap: BinaryHeap<Reverse<(i64, sled::IVec)>> = BinaryHeap::new();
    let mut scanned = 0;
    let mut complete = true;
    let test = PersonTest::new(matcher);
    for entry in trees.persons.scan_prefix(keys::project(project)) {
        if scanned >= MAX_PERSONS_SCANNED {
            complete = false;
            break;
        }
        scanned += 1;
        let (key, bytes) = entry?;
        let created_at = match matcher {
            None => match serde_json::from_slice::<Born>(&bytes) {
                Ok(born) => born.created_at,
                Err(_) => continue,
            },
            Some(_) => match test.test(&bytes) {
                Some((created_at, true)) => created_at,
                _ => continue,
            },
        };
        let place = (created_at, key);
        if heap.len() < keep {
            heap.push(Reverse(place));
        } else if heap.peek().is_some_and(|Reverse(oldest)| place > *oldest) {
            heap.pop();
            heap.push(Reverse(place));
        }
    }
    let mut order: Vec<(i64, sled::IVec)> = heap.into_iter().map(|r| r.0).collect();
    order.sort_by(|a, b| b.cmp(a));
    let mut newest = Vec::with_capacity(order.len());
    for (_, key) in order {
        if let Some(bytes) = trees.persons.get(&key)? {
            if let Ok(person) = serde_json::from_slice::<Person>(&bytes) {
                newest.push(person);
            }
        }
    }
    Ok((newest, scanned, complete))
}

#[cfg(test)]
#[path = "tests/persons.rs"]
mod tests;
