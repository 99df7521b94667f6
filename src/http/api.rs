//! The read API: events (filters, paging, NDJSON export), persons and groups of a
//! project, for holders of that project's personal API key.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use hyper::header::ACCEPT;
use hyper::{HeaderMap, Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::matching;
use super::params::Params;
use super::properties::Filters;
use super::response::{self, Body, Channel};
use crate::app::App;
use crate::capture::timestamp;
use crate::persons::Person;
use crate::store::query::{self, BlockTest, EventFilter};
use crate::store::Group;
use crate::support::hex;

/// Events per page unless `limit` says otherwise, and the most it may say.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;
/// NDJSON export: bytes per chunk and chunks buffered ahead of a slow reader.
const EXPORT_CHUNK_BYTES: usize = 64 * 1024;
const EXPORT_CHUNKS_AHEAD: usize = 4;

/// A read API path: the project and the collection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Events,
    Persons,
    Groups,
}

impl Resource {
    /// The scope a personal key needs to read it, as PostHog names them: events are
    /// read through its query API.
    pub fn scope(self) -> &'static str {
        match self {
            Resource::Events => "query:read",
            Resource::Persons => "person:read",
            Resource::Groups => "group:read",
        }
    }
}

/// `/api/projects/{id}/{events|persons|groups}/`, trailing slash optional.
pub fn parse_path(path: &str) -> Option<(u64, Resource)> {
    let rest = path.strip_prefix("/api/projects/")?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (id, what) = rest.split_once('/')?;
    let resource = match what {
        "events" => Resource::Events,
        "persons" => Resource::Persons,
        "groups" => Resource::Groups,
        _ => return None,
    };
    Some((id.parse().ok()?, resource))
}

pub async fn handle(
    app: &Arc<App>,
    project: u64,
    resource: Resource,
    headers: &HeaderMap,
    uri: &hyper::Uri,
    peer: SocketAddr,
) -> Result<Response<Body>, ApiError> {
    let (_, caller) = super::personal::authorize(app, headers, peer, project)?;
    super::personal::require(&caller, resource.scope())?;
    serve(app, project, resource, headers, uri.path(), uri.query()).await
}

/// A read of `project` by a caller already allowed to read it (a personal key checked
/// by [`super::personal::authorize`], or a console session); `path` is what `next`
/// links point at.
pub async fn serve(
    app: &Arc<App>,
    project: u64,
    resource: Resource,
    headers: &HeaderMap,
    path: &str,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let params = Params::parse(query);
    // Held for the request (or the export's stream): a reopen of the database waits
    // for it.
    let trees = app.store.get().ok_or(ApiError::Storage)?;
    match resource {
        Resource::Events => {
            let filter = params.filter()?;
            let test = Filters::from_params(&params)?.map(|f| f.test(trees.clone(), project));
            let wants_ndjson = headers
                .get(ACCEPT)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.contains("application/x-ndjson"));
            if wants_ndjson {
                return Ok(export(trees, project, filter, test));
            }
            let limit = params.limit()?;
            let cursor = params.cursor()?;
            let (results, next) = match test {
                Some(test) => {
                    let page = tested_page(trees, project, filter, cursor, limit, test).await?;
                    (page.events, page.next)
                }
                None => {
                    let (events, next) = blocking(move || {
                        query::events_page(&trees.trees, project, filter, cursor.as_deref(), limit)
                    })
                    .await?;
                    (events.iter().map(|e| e.to_api()).collect(), next)
                }
            };
            let next = next.map(|key| next_url(app, headers, path, query, &hex(&key)));
            Ok(response::json(
                StatusCode::OK,
                &json!({"results": results, "next": next}),
            ))
        }
        Resource::Persons => {
            let distinct_id = params.get("distinct_id").map(str::to_owned);
            let limit = params.limit()?;
            let persons = blocking(move || match distinct_id {
                Some(id) => Ok(query::person_by_distinct_id(&trees.trees, project, &id)?
                    .into_iter()
                    .collect()),
                None => query::persons(&trees.trees, project, limit),
            })
            .await?;
            let results: Vec<Value> = persons.iter().map(person_json).collect();
            Ok(response::json(
                StatusCode::OK,
                &json!({"results": results, "next": null}),
            ))
        }
        Resource::Groups => {
            let index: u8 = params
                .get("group_type_index")
                .ok_or_else(|| ApiError::BadQuery("group_type_index is required".into()))?
                .parse()
                .map_err(|_| ApiError::BadQuery("group_type_index must be 0-4".into()))?;
            let limit = params.limit()?;
            match params.get("group_key").map(str::to_owned) {
                Some(key) => {
                    let group = blocking(move || query::group(&trees.trees, project, index, &key))
                        .await?
                        .ok_or(ApiError::Missing("group"))?;
                    Ok(response::json(StatusCode::OK, &group_json(&group)))
                }
                None => {
                    let groups = blocking(move || {
                        query::groups_of_type(&trees.trees, project, index, limit)
                    })
                    .await?;
                    let results: Vec<Value> = groups.iter().map(group_json).collect();
                    Ok(response::json(
                        StatusCode::OK,
                        &json!({"results": results, "next": null}),
                    ))
                }
            }
        }
    }
}

pub fn person_json(p: &Person) -> Value {
    json!({
        "id": p.id,
        "distinct_ids": p.distinct_ids,
        "properties": p.properties,
        "created_at": crate::support::clock::format_ms(p.created_at),
        "is_identified": p.is_identified,
    })
}

fn group_json(g: &Group) -> Value {
    json!({
        "group_type_index": g.group_type_index,
        "group_key": g.group_key,
        "group_properties": g.properties,
        "created_at": crate::support::clock::format_ms(g.created_at),
    })
}

/// A page of the events `test` passes: those in the next
/// [`MAX_BLOCKS_EXAMINED`](matching::MAX_BLOCKS_EXAMINED) blocks read, up to `limit`; its
/// cursor goes on below the last event examined, so a page may be short, even empty,
/// and still have a next.
pub(super) async fn tested_page(
    trees: Arc<crate::store::live::Open>,
    project: u64,
    filter: EventFilter,
    cursor: Option<Vec<u8>>,
    limit: usize,
    test: Box<dyn BlockTest>,
) -> Result<matching::EventsPage, ApiError> {
    blocking(move || {
        let walk = query::events(&trees.trees, project, filter, cursor.as_deref());
        matching::events_page(
            walk.tested(test, matching::MAX_BLOCKS_EXAMINED),
            project,
            limit,
        )
    })
    .await
}

/// Run a storage read on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, sled::Error> + Send + 'static,
) -> Result<T, ApiError> {
    super::error::storage_read("read API", f).await
}

/// Stream every matching event (every one `test` passes) as one JSON object per line.
fn export(
    trees: Arc<crate::store::live::Open>,
    project: u64,
    filter: EventFilter,
    test: Option<Box<dyn BlockTest>>,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel(EXPORT_CHUNKS_AHEAD);
    tokio::task::spawn_blocking(move || {
        let mut chunk = Vec::with_capacity(EXPORT_CHUNK_BYTES);
        let mut events = query::events(&trees.trees, project, filter, None);
        if let Some(test) = test {
            events = events.tested(test, usize::MAX);
        }
        for entry in events {
            match entry {
                Ok((_, event)) => {
                    if serde_json::to_writer(&mut chunk, &event.to_api()).is_err() {
                        continue;
                    }
                    chunk.push(b'\n');
                }
                Err(e) => {
                    tracing::error!(error = %e, "export aborted by a storage error");
                    let _ = tx.blocking_send(Err(std::io::Error::other("storage error")));
                    return;
                }
            }
            if chunk.len() >= EXPORT_CHUNK_BYTES {
                let full = std::mem::replace(&mut chunk, Vec::with_capacity(EXPORT_CHUNK_BYTES));
                if tx.blocking_send(Ok(Bytes::from(full))).is_err() {
                    return; // the client went away
                }
            }
        }
        if !chunk.is_empty() {
            let _ = tx.blocking_send(Ok(Bytes::from(chunk)));
        }
    });
    response::stream(StatusCode::OK, "application/x-ndjson", Channel(rx))
}

/// The same request with the cursor of the next page.
pub(super) fn next_url(
    app: &App,
    headers: &HeaderMap,
    path: &str,
    query: Option<&str>,
    cursor: &str,
) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if k != "cursor" {
            q.append_pair(&k, &v);
        }
    }
    q.append_pair("cursor", cursor);
    format!("{}{path}?{}", super::links::base(app, headers), q.finish())
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 128 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The read API's parameters.
impl Params {
    pub(super) fn limit(&self) -> Result<usize, ApiError> {
        match self.get("limit") {
            None => Ok(DEFAULT_LIMIT),
            Some(v) => match v.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n.min(MAX_LIMIT)),
                _ => Err(ApiError::BadQuery(
                    "limit must be a positive integer".into(),
                )),
            },
        }
    }

    pub(super) fn cursor(&self) -> Result<Option<Vec<u8>>, ApiError> {
        self.get("cursor")
            .map(|c| unhex(c).ok_or_else(|| ApiError::BadQuery("cursor is not valid".into())))
            .transpose()
    }

    /// A time as ISO 8601 or unix milliseconds.
    fn time(&self, key: &'static str) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        v.parse::<i64>()
            .ok()
            .or_else(|| timestamp::parse_ms(v))
            .map(Some)
            .ok_or_else(|| {
                ApiError::BadQuery(format!(
                    "{key} must be an ISO 8601 time or unix milliseconds"
                ))
            })
    }

    pub(super) fn filter(&self) -> Result<EventFilter, ApiError> {
        Ok(EventFilter {
            after: self.time("after")?,
            before: self.time("before")?,
            event: self.get("event").map(str::to_owned),
            distinct_id: self.get("distinct_id").map(str::to_owned),
            person_id: match self.get("person_id") {
                Some(id) => {
                    Some(uuid::Uuid::parse_str(id).map_err(|_| {
                        ApiError::BadQuery("person_id must be a person's uuid".into())
                    })?)
                }
                None => None,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(
            parse_path("/api/projects/1/events/"),
            Some((1, Resource::Events))
        );
        assert_eq!(
            parse_path("/api/projects/12/persons"),
            Some((12, Resource::Persons))
        );
        assert_eq!(
            parse_path("/api/projects/3/groups/"),
            Some((3, Resource::Groups))
        );
        assert_eq!(parse_path("/api/projects/x/events/"), None);
        assert_eq!(parse_path("/api/projects/1/other/"), None);
        assert_eq!(parse_path("/api/projects/1/events/extra"), None);
    }

    #[test]
    fn cursors_round_trip() {
        let key = [0u8, 1, 0xab, 0xff];
        assert_eq!(unhex(&hex(&key)), Some(key.to_vec()));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }
}
